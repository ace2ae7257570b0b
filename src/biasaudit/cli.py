"""The `biasaudit` command (also `python -m biasaudit`).

    biasaudit check [--stage generate@sd35-large-turbo]   # params + every weight, key and server needed
    biasaudit weights list|fetch|verify [--profile paper] [--only NAME]
    biasaudit profile paper|offline                       # switch params.yaml (keeps comments)

`check` works offline and lists everything missing in one pass, one line per item with the exact
fix; it exits 1 when something is missing, 2 when the parameters are invalid, 0 otherwise.
Profiles and parameter validation are biasaudit.config's (this module only calls them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from biasaudit import config


def profile_params(name: str | None, params_path: str | Path = config.PARAMS_FILE) -> Any:
    """The parameters with profile `name` applied (on a temporary copy: params.yaml is not touched);
    the current parameters when `name` is None."""
    if not name:
        return config.load_params(params_path)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "params.yaml"
        shutil.copyfile(params_path, copy)
        return config.apply_profile(name, params_path=copy, profiles_dir=config.PROFILES_DIR)


def describe_need(n: Any) -> str:
    label = {"weight": "missing weight", "key": "missing key", "server": "server not reachable", "input": "missing input"}[n.kind]
    return f"{label} {n.what} ({n.used_by}; {n.stage}): {n.fix}"


def cmd_check(args: argparse.Namespace) -> int:
    from biasaudit import gpu_extra, weights

    try:
        cfg = profile_params(args.profile, args.params)
    except config.ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    if warning := gpu_extra.onnxruntime_warning():  # InsightFace on the CPU
        print(warning, file=sys.stderr)
    gone = weights.missing(cfg, stage=args.stage or "")
    scope = f"stage {args.stage}" if args.stage else f"profile {cfg.profile}"
    if not gone:
        n = len([x for x in weights.needs(cfg) if not args.stage or x.for_stage(args.stage)])
        print(f"{args.params}: valid ({scope}); all {n} weights, keys and servers it needs are present")
        return 0
    print(f"{args.params}: valid ({scope}), but {len(gone)} things it needs are missing:")
    for n in gone:
        print("  - " + describe_need(n))
    return 1


def _selected(args: argparse.Namespace) -> list[Any]:
    from biasaudit import weights

    if args.only:
        unknown = [n for n in args.only if n not in weights.BY_NAME]
        if unknown:
            raise SystemExit(f"unknown weight(s) {unknown}; known: {', '.join(weights.BY_NAME)}")
        return [weights.BY_NAME[n] for n in args.only]
    if args.profile is None and not args.needed:
        return list(weights.WEIGHTS)
    cfg = profile_params(args.profile, args.params)
    chosen = []
    for need in weights.needs(cfg):
        w = need.weight or (weights.BY_NAME["clip-vit-h-14"] if need.what.startswith("hf-cache:laion/") else None)
        if w is not None and w not in chosen:
            chosen.append(w)
    if args.profile == "paper" or (cfg.profile == "paper" and not args.profile):
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
    try:
        config.apply_profile(args.name)
    except config.ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"params.yaml now uses profile '{args.name}'; next: biasaudit check")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="biasaudit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate params and list every missing weight, key and server")
    check.add_argument("--params", default=str(config.PARAMS_FILE))
    check.add_argument("--profile", default=None, help="check this profile without switching to it")
    check.add_argument("--stage", default=None, help="only what this dvc stage needs (e.g. faces@flux-schnell)")
    check.set_defaults(func=cmd_check)
    w = sub.add_parser("weights", help="the model weights: list, fetch, verify")
    w.add_argument("action", choices=["list", "fetch", "verify"])
    w.add_argument("--profile", default=None, help="the weights this profile needs (default list: all)")
    w.add_argument("--params", default=str(config.PARAMS_FILE))
    w.add_argument("--only", nargs="+", default=None, help="these weights by name")
    w.add_argument("--needed", action="store_true", help="the weights the current params need")
    w.add_argument("--force", action="store_true", help="fetch again even if verified")
    w.set_defaults(func=cmd_weights)
    p = sub.add_parser("profile", help="switch params.yaml to a profile (paper | offline)")
    p.add_argument("name")
    p.set_defaults(func=cmd_profile)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
