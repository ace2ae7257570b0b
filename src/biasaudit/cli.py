"""The `biasaudit` command (also `python -m biasaudit`): check what a run needs, fetch weights, switch profiles.

examples (each runs as written from the project's root):
  biasaudit check                                   # params.yaml valid, and all it needs present?
  biasaudit check --stage faces@planted-a           # only what one dvc stage needs
  biasaudit check --profile paper                   # what the published setup needs, without switching
  biasaudit weights list --profile paper            # the weights it needs: size, licence, where they go
  biasaudit weights verify --only insightface-buffalo_l   # checksums of a fetched weight
  biasaudit profile paper                           # switch params.yaml, stash these outputs; back: profile offline
  biasaudit plan --ratio 0.7                        # source photos a Method B audit needs for an impact ratio
  biasaudit plan --tvd 0.1                          # prompts × images per prompt Method A needs for a TVD
  biasaudit card --pdf                              # a PDF of each audit card (headless Chromium) in reports/print/

exit status: 0 all present, 1 something needed is missing (each listed with its fix; a retired model among
them), 2 a usage error, invalid parameters (a value the model does not accept included) or an unreadable
data/reference/models/lifecycle.yaml. An unconfirmed model fact is a warning, whatever the exit status. Profiles and parameter validation are biasaudit.config's (this module only calls them).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from biasaudit import config
from biasaudit.check import describe_need, input_problems, pairing_problems, plural


def profile_params(name: str | None, params_path: str | Path = config.PARAMS_FILE) -> Any:
    """The parameters with profile `name` applied (on a temporary copy: params.yaml is not touched);
    the current parameters when `name` is None."""
    if not name:
        return config.load_params(params_path)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "params.yaml"
        shutil.copyfile(params_path, copy)
        restore = config._restore_path(params_path)  # what the current profile replaced (to undo it on the copy)
        if restore.is_file():
            shutil.copyfile(restore, config._restore_path(copy))
        return config.apply_profile(name, params_path=copy, profiles_dir=config.PROFILES_DIR)


class UsageError(Exception):
    """A command line that names something that does not exist (exit 2, like argparse's own errors)."""


def stage_names(cfg: Any, dvc_yaml: Path) -> list[str] | None:
    """Every stage instance dvc.yaml defines for `cfg` (`faces@planted-a` for a foreach over models:),
    or None without a dvc.yaml (nothing to check against)."""
    import yaml

    if not dvc_yaml.is_file():
        return None
    names: list[str] = []
    for name, spec in ((yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}).items():
        over = (spec or {}).get("foreach")
        if over is None:
            names.append(name)
            continue
        keys = getattr(cfg, str(over).strip("${}"), None) if isinstance(over, str) else over
        names += [f"{name}@{key}" for key in (keys or [])]
    return names


def refresh_fingerprints(cfg: Any, params_path: Path) -> list[Path]:
    """In a DVC project's root, checking its params.yaml: rewrite the check stage's fingerprints of the
    external input folders where their content changed (biasaudit.check), so that the next `dvc repro`
    re-runs exactly the stages that read a changed folder (DVC cannot hash those folders itself: their
    paths depend on the backend). Returns the files that changed; elsewhere nothing is written."""
    from biasaudit import check
    from biasaudit import contracts as C

    root = Path.cwd()
    if params_path.resolve() != (root / config.PARAMS_FILE).resolve() or not (root / "dvc.yaml").is_file() \
            or not (root / ".dvc").is_dir():
        return []
    before = {p.name for p in (root / C.CHECK_DIR).glob("*.inputs.json")}
    changed = check.refresh(cfg, root / C.CHECK_DIR)
    inputs = [p.name.removesuffix(".inputs.json") for p in changed if p.name in before and p.exists()]
    if inputs:
        print(f"inputs changed for {', '.join(inputs)} (their fingerprints in {C.CHECK_DIR}/): `dvc repro` re-runs "
              "each stage whose inputs differ from what dvc.lock recorded", file=sys.stderr)
    return changed


def cmd_check(args: argparse.Namespace) -> int:
    from biasaudit import gpu_extra, lifecycle, weights

    try:
        cfg = profile_params(args.profile, args.params)
        refused = lifecycle.refused_values(cfg)  # reads the lifecycle file: a malformed one is named here
    except (config.ParamsError, lifecycle.LifecycleError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if refused:  # a value the model does not take: every request would fail alike
        print("invalid parameters:\n  - " + "\n  - ".join(refused), file=sys.stderr)
        return 2
    if args.stage:
        known = stage_names(cfg, Path(args.params).parent / "dvc.yaml")
        if known is not None and args.stage not in known:
            raise UsageError(f"unknown stage '{args.stage}' (profile {cfg.profile}); known: {', '.join(known)}")
    if warning := gpu_extra.onnxruntime_warning():  # InsightFace on the CPU
        print(warning, file=sys.stderr)
    if args.profile is None:
        refresh_fingerprints(cfg, Path(args.params))
    gone = weights.missing(cfg, stage=args.stage or "")
    for note in weights.lifecycle_notes(cfg):
        print(f"note: deprecated: {note}", file=sys.stderr)
    for line in lifecycle.warnings(cfg):  # not fatal: the stage's probe asks the API itself
        print(f"warning: {line}", file=sys.stderr)
    scope = f"stage {args.stage}" if args.stage else f"profile {cfg.profile}"
    unusable = input_problems(cfg, args.stage or "")
    if unusable:
        print(f"{args.params}: {plural(len(unusable), 'entry', 'entries')} of input folders cannot be read:")
        for line in unusable:
            print("  - " + line)
    mismatched = pairing_problems(cfg, args.stage or "")
    if mismatched:
        print(f"{args.params}: {plural(len(mismatched), 'model')} cannot be classified as configured:")
        for line in mismatched:
            print("  - " + line)
    if (unusable or mismatched) and not gone:
        return 1
    if not gone:
        n = len([x for x in weights.needs(cfg) if not args.stage or x.for_stage(args.stage)])
        have = (f"all {plural(n, 'weight, key or server', 'weights, keys and servers')} it needs "
                f"{'is' if n == 1 else 'are'} present") if n else "it needs nothing from outside this repository"
        print(f"{args.params}: valid ({scope}); {have}")
        return 0
    print(f"{args.params}: valid ({scope}), but {plural(len(gone), 'thing')} it needs "
          f"{'is' if len(gone) == 1 else 'are'} missing:")
    for n in gone:
        print("  - " + describe_need(n))
    return 1


def _selected(args: argparse.Namespace) -> list[Any]:
    from biasaudit import weights

    if args.only:  # names are argparse choices (an unknown one is a usage error, exit 2)
        return [weights.BY_NAME[n] for n in args.only]
    if args.profile is None and not args.needed:
        return list(weights.WEIGHTS)
    cfg = profile_params(args.profile, args.params)
    chosen = []
    for need in weights.needs(cfg):
        w = need.weight or (weights.BY_NAME["clip-vit-h-14"] if need.what.startswith("hf-cache:laion/") else None)
        if w is not None and w not in chosen:
            chosen.append(w)
    if (args.profile or cfg.profile) in ("paper", "current"):
        for spec in cfg.vlms.values():  # served (vLLM) or hosted VLMs: listed, not fetched
            w = weights.for_vlm(spec)
            if w is not None and w not in chosen:
                chosen.append(w)
    return chosen


def cmd_weights(args: argparse.Namespace) -> int:
    from biasaudit import weights

    chosen = _selected(args)
    if args.action == "list":
        if not chosen:
            print("no model weights needed (the stand-ins ship in this repository and its packages)")
            return 0
        print(weights.format_table(weights.table_rows(tuple(chosen))))
        return 0
    if args.action == "verify":
        bad = 0
        for w in chosen:
            ok, message = weights.verify(w)
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {w.name}: {message}")
        return 1 if bad else 0
    token = os.environ.get("HF_TOKEN") or None
    failures = 0
    for w in chosen:
        if not w.fetchable:
            print(f"skip {w.name}: {w.gate}")
            continue
        ok, _ = weights.verify(w)
        if ok and not args.force:
            print(f"have {w.name} ({w.local_path})")
            continue
        print(f"fetch {w.name} ({w.size_gb:g} GB) → {w.local_path}")
        try:
            entry = weights.fetch(w, token=token)
            print(f"  done: {len(entry.get('files', {}))} files, commit {entry.get('commit', '-')}")
        except Exception as exc:
            failures += 1
            hint = f" ({w.gate})" if w.gate else ""
            print(f"  FAILED {w.name}: {type(exc).__name__}: {str(exc)[:300]}{hint}", file=sys.stderr)
    return 1 if failures else 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Switch params.yaml; in a DVC project also stash the outputs of the profile left and restore those
    of the profile switched to (biasaudit.pipeline.profile_stash: DVC's run cache cannot, every output is persist)."""
    from biasaudit.pipeline import profile_stash
    try:
        profile_params(args.name)  # the new profile validates (on a copy) before anything moves
        current = config.read_yaml(config.PARAMS_FILE).get("profile", config.DEFAULT_PROFILE)
    except config.ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    dvc_project = profile_stash.is_dvc_project()
    keep = args.no_stash or current == args.name or not dvc_project
    if dvc_project and not args.no_stash:
        from dvc.lock import LockError

        try:  # a switch killed halfway is finished first, whatever this one's target
            resumed = profile_stash.resume(current)
        except LockError as exc:
            print(f"profile: {exc}; switch when it has finished", file=sys.stderr)
            return 1
        if resumed is not None:
            print("finishing an interrupted switch: " + profile_stash.describe_restore(resumed, current))
    if not keep:
        from dvc.lock import LockError

        try:
            print(profile_stash.describe_stash(profile_stash.stash(current)))
        except LockError as exc:  # a `dvc repro` is running: nothing moved, params.yaml unchanged
            print(f"profile: {exc}; switch when it has finished", file=sys.stderr)
            return 1
    try:
        config.apply_profile(args.name)
    except config.ParamsError as exc:
        print(exc, file=sys.stderr)
        if not keep:  # params.yaml is unchanged: its outputs go back
            print(profile_stash.describe_restore(profile_stash.restore(current), current))
        return 2
    print(f"params.yaml now uses profile '{args.name}'")
    if not keep:
        print(profile_stash.describe_restore(profile_stash.restore(args.name), args.name))
    print("next: biasaudit check, then dvc repro")
    return 0


def profile_names(profiles_dir: Path = config.PROFILES_DIR) -> list[str]:
    """The profiles a params.yaml can switch to: one per profiles/<name>.yaml."""
    return sorted(p.stem for p in Path(profiles_dir).glob("*.yaml"))


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("biasaudit")
    except PackageNotFoundError:  # run from a source tree (PYTHONPATH=src)
        from biasaudit import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    from biasaudit import weights

    profiles = profile_names() or None  # no choices outside the project's root (apply_profile then says why)
    shown = f" ({' | '.join(profiles)})" if profiles else ""
    params_help = "the parameters file (default: %(default)s)"
    parser = argparse.ArgumentParser(prog="biasaudit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{check,weights,profile,plan,card}")
    check = sub.add_parser("check", help="validate params and list every missing weight, input, key and server",
                           description="Validate the parameters and list, in one pass, every weight, input folder, "
                                       "API key and local server they need and this machine lacks, each with its fix. "
                                       "Exit 0: all present; 1: something is missing; 2: usage error or invalid "
                                       "parameters.")
    check.add_argument("--params", default=str(config.PARAMS_FILE), metavar="FILE", help=params_help)
    check.add_argument("--profile", default=None, choices=profiles,
                       help=f"check this profile{shown} without switching params.yaml to it")
    check.add_argument("--stage", default=None, metavar="STAGE",
                       help="only what this dvc stage instance needs (e.g. faces@planted-a; `dvc stage list` names them)")
    check.set_defaults(func=cmd_check)
    w = sub.add_parser("weights", help="the model weights: list, fetch, verify",
                       description="List, fetch or verify model weights (pinned revisions and checksums in "
                                   "models/weights.lock.json). Exit 1 when a verification or a fetch fails.")
    w.add_argument("action", choices=["list", "fetch", "verify"],
                   help="list: size, licence and location; fetch: download what is missing; verify: check checksums")
    w.add_argument("--profile", default=None, choices=profiles,
                   help=f"the weights this profile{shown} needs (default for list: every known weight)")
    w.add_argument("--params", default=str(config.PARAMS_FILE), metavar="FILE", help=params_help)
    w.add_argument("--only", nargs="+", default=None, choices=list(weights.BY_NAME), metavar="NAME",
                   help=f"these weights by name: {', '.join(weights.BY_NAME)}")
    w.add_argument("--needed", action="store_true", help="the weights the current params need")
    w.add_argument("--force", action="store_true", help="fetch again even if verified")
    w.set_defaults(func=cmd_weights)
    p = sub.add_parser("profile", help=f"switch params.yaml to a profile{shown}",
                       description="Switch params.yaml to a profile in place (comments kept; switching back gives "
                                   "the file back byte for byte). In a DVC project the outputs of the profile left "
                                   "are stashed (moved to .dvc/tmp/profile-stash/) and those of the profile switched "
                                   "to restored, with their dvc.lock entries, so that switching back runs no stage.")
    p.add_argument("name", choices=profiles, metavar="NAME" if not profiles else None,
                   help=f"the profile{shown}: profiles/<name>.yaml")
    p.add_argument("--no-stash", action="store_true",
                   help="switch params.yaml only: leave every output where it is (no stash, no restore)")
    p.set_defaults(func=cmd_profile)
    plan = sub.add_parser("plan", help="the audit size needed: source photos for an impact ratio (Method B), "
                                       "prompts × images for a TVD (Method A)",
                          description="From the declared simulations (benchmarks/power.py → "
                                      "data/reference/power/impact_ratio.csv; benchmarks/tvd_power.py → "
                                      "data/reference/power/tvd.csv): --ratio R gives, per card table (gender, race, "
                                      "race × gender), the source photos at which a true impact ratio R is read below "
                                      "0.8 with --power, and the number to plan for (the most any table needs, never "
                                      "fewer than reflect_analysis.min_clusters); --tvd D gives, per number of images "
                                      "per prompt, the prompts at which a true mean TVD of D is detected (the "
                                      "corrected TVD's honest interval above 0) with --power. Exit 1 when the "
                                      "simulated sizes do not reach it.")
    target = plan.add_mutually_exclusive_group()
    target.add_argument("--ratio", type=float, default=None,
                        help="the true impact ratio to detect (Method B; the default when neither is given: 0.7)")
    target.add_argument("--tvd", type=float, default=None, help="the true mean TVD to detect (Method A)")
    plan.add_argument("--per-photo", type=float, default=None,
                      help="mean comparisons (2AFC) or answers (scores) per source photo and category, the same in "
                           "every table (default: the reflect stage's 2AFC design, all pairs of a photo's 10 versions "
                           "in both orders, one task: 18 per category of race × gender, 32 of race, 50 of gender)")
    plan.add_argument("--power", type=float, default=0.8, help="the power wanted (default %(default)s)")
    plan.add_argument("--table", default=None, metavar="CSV",
                      help="the simulation's table (default: data/reference/power/impact_ratio.csv, or tvd.csv with "
                           "--tvd)")
    plan.add_argument("--params", default=str(config.PARAMS_FILE), metavar="FILE",
                      help="where reflect_analysis.min_clusters is read (default: %(default)s; the schema's default "
                           "when the file is absent)")
    plan.set_defaults(func=cmd_plan)
    card = sub.add_parser("card", help="a PDF of each audit card, printed by headless Chromium",
                          description="Print each model's audit card (reports/audit/<model>.html, written by the "
                                      "report stage) to a PDF with headless Chromium: the banner on every page, "
                                      "table header rows repeated, no row split; the PDF carries no date of "
                                      "printing, so a reprint is byte-identical with the same Chromium. Exit 1 "
                                      "when there is no card or no Chromium.")
    card.add_argument("--pdf", action="store_true", help="write a PDF of each card")
    card.add_argument("--audit-dir", default="reports/audit", metavar="DIR", help="the cards (default: %(default)s)")
    card.add_argument("--out", default="reports/print", metavar="DIR",
                      help="where the PDFs go (default: %(default)s; no dvc stage declares it)")
    card.set_defaults(func=cmd_card)
    return parser


def cmd_card(args: argparse.Namespace) -> int:
    from biasaudit.report import pdf

    if not args.pdf:
        raise UsageError("say what to write: --pdf")
    pages = pdf.card_pages(Path(args.audit_dir))
    if not pages:
        print(f"no audit card in {args.audit_dir} (the report stage writes them: dvc repro report)")
        return 1
    if pdf.chromium() is None:
        print("no Chromium to print with (Debian: apt-get install chromium)")
        return 1
    for out in pdf.print_cards(Path(args.audit_dir), Path(args.out)):
        print(out)
    return 0


# per photo and category of each table, per 2AFC task: all 45 pairs of a photo's 10 versions in both orders
# (vlm.tasks.two_afc_items); a version is in 18; a race's 2 versions in 32 across races; a gender's 5 in 50
TWO_AFC_PER_PHOTO = {"gender": 50.0, "race": 32.0, "race × gender": 18.0}


def min_clusters(params: Path) -> int:
    from biasaudit.params.vlm import ReflectAnalysis

    if params.exists():
        return int(config.load_params(params).reflect_analysis.min_clusters)
    return int(ReflectAnalysis.model_fields["min_clusters"].default)


def cmd_plan(args: argparse.Namespace) -> int:
    if not 0 < args.power < 1:
        raise UsageError("--power must lie in (0, 1)")
    return plan_tvd(args) if args.tvd is not None else plan_ratio(args)


def plan_ratio(args: argparse.Namespace) -> int:
    from biasaudit.report import power

    ratio = 0.7 if args.ratio is None else args.ratio
    if not 0 < ratio < 0.8:
        raise UsageError("--ratio must lie in (0, 0.8)")
    path = Path(args.table or power.TABLE)
    table = power.load(path)
    if table is None:  # something needed is missing: exit 1 with the fix
        print(f"missing input {path}: write it with python benchmarks/power.py (from the project's root)")
        return 1
    floor = min_clusters(Path(args.params))
    print(f"a true impact ratio of {ratio:g} read below 0.8 with power {args.power:g} ({power.declared(table)}):")
    needs = []
    for name in power.TABLES:
        m = args.per_photo or TWO_AFC_PER_PHOTO[name]
        need = power.photos_needed(table, ratio, m, args.power, name, floor)
        needs.append(need)
        print(f"  {name:14s} {m:4.0f} per photo and category: "
              + (f"{math.ceil(need)} source photos" if need is not None
                 else f"not within {int(table['photos'].max())} photos"))
    if any(n is None for n in needs):
        print(f"a table does not reach power {args.power:g} within the simulated photos: plan more comparisons per "
              "photo (more tasks or repeats), or accept a lower ratio")
        return 1
    print(f"plan for {math.ceil(max(needs))} source photos (the most any table needs; never fewer than "
          f"reflect_analysis.min_clusters = {floor})")
    return 0


def plan_tvd(args: argparse.Namespace) -> int:
    from biasaudit.report import power

    if not 0 < args.tvd <= 1:
        raise UsageError("--tvd must lie in (0, 1]")
    path = Path(args.table or power.TVD_TABLE)
    table = power.load(path)
    if table is None:
        print(f"missing input {path}: write it with python benchmarks/tvd_power.py (from the project's root)")
        return 1
    if not table["true_tvd"].min() <= args.tvd <= table["true_tvd"].max():
        raise UsageError(f"--tvd outside the simulated {table['true_tvd'].min():g}–{table['true_tvd'].max():g}")
    print(f"a true mean TVD of {args.tvd:g} detected (corrected TVD's honest interval above 0) with power "
          f"{args.power:g} (declared simulation: benchmarks/tvd_power.py, {int(table['replications'].iloc[0])} runs "
          "per size):")
    best = None
    for n in sorted(table["images_per_prompt"].unique()):
        need = power.prompts_needed(table, args.tvd, int(n), args.power)
        if need is None:
            print(f"  {n:4d} images per prompt: not within {int(table['prompts'].max())} prompts")
            continue
        prompts = math.ceil(need)
        print(f"  {n:4d} images per prompt: {prompts} prompts ({prompts * n} images)")
        if best is None or prompts * n < best[0] * best[1]:
            best = (prompts, int(n))
    if best is None:
        print(f"no simulated design reaches power {args.power:g}")
        return 1
    print(f"plan for {best[0]} prompts × {best[1]} images per prompt ({best[0] * best[1]} images: the fewest images "
          "of the designs above)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse's own usage errors exit 2
    try:
        return int(args.func(args))
    except UsageError as exc:
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")
    except config.ParamsError as exc:  # invalid parameters (e.g. `weights list --profile paper`): no traceback
        parser.exit(2, f"{exc}\n")
    except FileNotFoundError as exc:  # e.g. --params naming no file
        parser.exit(2, f"{parser.prog} {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
