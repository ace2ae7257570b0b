"""The `check` stage: validate params.yaml before DVC touches any output, and fingerprint the
external inputs that params.yaml points at (folders and files outside the pipeline).

Every stage depends on `data/check/params.ok`, so `check` runs first; when params.yaml is invalid it
exits non-zero and `dvc repro` stops before any other stage runs. Its own folder is `persist: true` (as
every output: biasaudit/pipeline/keep_outputs.py), so an invalid params.yaml touches nothing, `data/check/`
included; a valid one rewrites each file atomically and removes the fingerprints of stages that are gone.

Inputs named by parameters (sources.input_dir, a folder generator's folder and mapping CSV, the
portraits of the baseline, an imported FOCUS folder, the CSV of a `file` classifier, the raters'
filled sheets (reliability's and validate_edits' realism and identity sheets), the BiSeNet weights) cannot be
listed in dvc.yaml because they depend on the backend. The stage writes one fingerprint per stage
instance (`data/check/<stage>.inputs.json`, a content hash of every file); the stage depends on it,
so a changed input re-runs exactly that stage. Each file is rewritten only when its content changes.

`check` is not `always_changed`: DVC runs it when params.yaml or the code that validates it changes
(its deps), which is when validity can change, so a `dvc repro` with nothing changed runs no stage.
Each such folder is also walked for entries no stage can read (`input_problems`: a broken link, a link
loop, an unreadable file, a link out of the folder, which no stage follows), which `check` prints as warnings
and `biasaudit check` lists as problems. `check` also refuses (exit 2, nothing written) a parameter value a
hosted model does not accept and an unreadable lifecycle file, and warns on every unconfirmed model fact
(biasaudit/lifecycle.py).

DVC cannot list the external folders as deps of `check` (their paths depend on the backend), so the
fingerprints are also refreshed by `biasaudit check` (`refresh`), which `make demo` and `make paper`
run before `dvc repro`: a changed photo changes its fingerprint, DVC then finds the check stage's
output changed and re-runs exactly the stages that read that folder. A plain `dvc repro` after editing
a file inside an external folder, with nothing else changed, does not see the edit; `biasaudit check`
first (or `make demo`) does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.params import Params

HASH_CACHE_NAME = ".check-hashes.json"  # beside the check folder: (path, size, mtime) → sha256, so big folders are not re-read

# --- wording (here and in `biasaudit check`): the noun for each kind of need, and counts with their plural
NEED_LABELS = {"weight": "missing weight", "input": "missing input", "key": "missing key",
               "server": "server not reachable", "retired": "retired model"}


def plural(count: int, noun: str, many: str = "") -> str:
    """'1 thing', '2 things', '0 things' (`many` for an irregular plural)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def describe_need(n: Any) -> str:
    label = NEED_LABELS.get(n.kind, f"missing {n.kind}")
    return f"{label} {n.what} ({n.used_by}; {n.stage}): {n.fix}"



def declared_inputs(kind: str, spec: object) -> list[str]:
    """The input paths a backend declares it reads (registry trait `inputs`: spec field names)."""
    return [p for f in registry.trait(kind, spec.backend, "inputs", ()) if (p := getattr(spec, f))]  # type: ignore[attr-defined]


def external_inputs(cfg: Params) -> dict[str, list[str]]:
    """Stage instance (dvc.yaml address with '@' → '_') → the external paths it reads, per params."""
    out: dict[str, list[str]] = {}
    for name, spec in cfg.models.items():
        out[f"generate_{name}"] = declared_inputs("generator", spec)
    out["classify"] = declared_inputs("vlm", cfg.classify.vlm)
    rel = cfg.reliability
    out["reliability"] = [] if rel.simulate else C.rater_sheets(rel.sheets_dir, rel.raters)
    out["sources"] = [cfg.sources.input_dir] if cfg.sources.source == "folder" else []
    out["baseline"] = [cfg.baseline.portraits_dir] if cfg.baseline.source == "folder" else []
    out["faces"] = [cfg.faces.bisenet_weights] if cfg.faces.skin_method == "bisenet" else []
    out["counterfactuals"] = declared_inputs("editor", cfg.counterfactuals)
    ve = cfg.validate_edits  # rating sheets, whether or not needed: a filled one re-runs the stage
    out["validate_edits"] = [p for m in C.RATING_MEASURES
                             for p in C.rater_sheets(C.rating_folder(ve.realism_sheets_dir, m), ve.realism_raters)]
    for name, spec in cfg.vlms.items():
        out[f"reflect_{name}"] = declared_inputs("vlm", spec)
    return out


def input_problems(cfg: Params, stage: str = "") -> list[str]:
    """Every entry of an input folder that params.yaml names (`external_inputs`) that no stage can read:
    a broken link, a link loop, an unreadable file or subfolder ('<folder>/<entry>: <why>'); `stage`
    (dvc address, 'generate@x'): only its folders. A folder that is missing altogether is a missing
    input (weights.needs), not listed here."""
    from biasaudit.pipeline.entries import folder_problems

    wanted = stage.replace("@", "_")
    folders = sorted({p for name, paths in external_inputs(cfg).items() if not stage or name == wanted
                      for p in paths if Path(p).is_dir()})
    return [f"{Path(folder).as_posix()}/{line}" for folder in folders for line in folder_problems(folder)]


def pairing_problems(cfg: Params, stage: str = "") -> list[str]:
    """Backends that cannot work together, each with its fix: a classifier that reads the label an image was
    PLANTED with (registry trait `answers_from_confusion`: the SIMULATED one) would fail every image of a
    generator that plants none (one that does not read `planted`: a folder of your images, any real model).
    `stage` (dvc address): only classify@<model> of that model."""
    clf = cfg.classify.vlm.backend
    if not registry.trait("vlm", clf, "answers_from_confusion", False):
        return []
    return [f"models.{name} (backend '{spec.backend}') with classify.vlm.backend '{clf}': the SIMULATED classifier "
            "reads the label each image was PLANTED with, and these images carry none, so classify@"
            f"{name} would fail every one ('no planted label'). Fix: set classify.vlm to a classifier that looks "
            "at the images: openai or gemini (a hosted API or a local OpenAI-compatible server), clip or "
            "transformers (open weights: docs/real-models.md), or file (a CSV of your own labels)"
            for name, spec in cfg.models.items()
            if (not stage or stage == f"classify@{name}")
            and not registry.backend_reads("generator", spec.backend, "planted")]


def _sha256(path: Path, cache: dict[str, Any]) -> str:
    st = path.stat()
    key = f"{path.as_posix()}|{st.st_size}|{st.st_mtime_ns}"
    if key not in cache:
        with open(path, "rb") as fh:
            cache[key] = hashlib.file_digest(fh, "sha256").hexdigest()
    return cache[key]


def fingerprint(paths: list[str], cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """Content hash of every file under each path (a missing path is recorded as missing, and the
    stage itself then reports it with its own message). A link out of a folder is not followed: its entry
    records the reason, never the target's content (pipeline.entries.outside)."""
    from biasaudit.pipeline.entries import LEAVES, outside

    cache = {} if cache is None else cache
    entries: dict[str, Any] = {}
    for p in paths:
        root = Path(p)
        if root.is_file():
            entries[p] = _sha256(root, cache)
        elif root.is_dir():
            files = sorted(f for f in root.rglob("*") if f.is_file() and not f.name.startswith("."))
            entries[p] = {f.relative_to(root).as_posix(): f"{LEAVES}: not followed" if outside(f, root)
                          else _sha256(f, cache) for f in files}
        else:
            entries[p] = "missing"
    return entries


def refresh(cfg: Params, out_dir: str | Path = C.CHECK_DIR) -> list[Path]:
    """The check files again (as the check stage writes them); returns those whose content changed
    (a fingerprint of a stage instance now gone counts as changed: it was removed)."""
    return _write(cfg, out_dir)[1]


def _write(cfg: Params, out_dir: str | Path) -> tuple[list[Path], list[Path]]:
    from biasaudit.pipeline.io import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hash_cache = out_dir.parent / HASH_CACHE_NAME  # not inside out_dir: no part of the stage's output
    try:
        cache = json.loads(hash_cache.read_text()) if hash_cache.exists() else {}
    except (OSError, ValueError):
        cache = {}
    bodies = {C.CHECK_OK.name: "valid\n"}  # constant: downstream stays up to date
    for stage, paths in external_inputs(cfg).items():
        body = json.dumps({"inputs": fingerprint(paths, cache)}, indent=1, sort_keys=True) + "\n"
        bodies[C.inputs_fingerprint_path(stage).name] = body
    written, changed = [], []
    for name, body in bodies.items():
        path = out_dir / name
        if not (path.is_file() and path.read_text(encoding="utf-8") == body):  # unchanged: not touched
            atomic_write_text(path, body)
            changed.append(path)
        written.append(path)
    for stale in out_dir.glob("*.inputs.json"):  # a stage instance no longer in params.yaml
        if stale.name not in bodies:
            stale.unlink()
            changed.append(stale)
    live = {k for k in cache if Path(k.split("|")[0]).exists()}
    atomic_write_text(hash_cache, json.dumps({k: cache[k] for k in sorted(live)}) + "\n")
    return written, changed


def main(argv: list[str] | None = None) -> int:
    """python -m biasaudit.check [PARAMS] [OUT_DIR]: exit 2 (message on stderr, no value of a key
    echoed) when the params are invalid, else write the check files."""
    import sys

    from biasaudit.config import PARAMS_FILE, ParamsError, load_params

    args = list(sys.argv[1:] if argv is None else argv)
    params_file = args[0] if args else PARAMS_FILE
    out_dir = args[1] if len(args) > 1 else C.CHECK_DIR
    from biasaudit import lifecycle

    try:
        cfg = load_params(params_file)
        refused = lifecycle.refused_values(cfg)  # a value the model does not take: every request would fail alike
        if refused:
            raise ParamsError("invalid parameters:\n  - " + "\n  - ".join(refused))
        lifecycle_warnings = lifecycle.warnings(cfg)
    except (ParamsError, lifecycle.LifecycleError) as exc:
        print(exc, file=sys.stderr)
        print(f"check: {params_file} is invalid; no stage was run and no output was touched ({out_dir} included)",
              file=sys.stderr)
        return 2
    written, changed = _write(cfg, out_dir)
    from biasaudit.pipeline.progress import position, write_plan

    try:  # the order dvc repro runs the stages in, for the "k/N" of each stage line
        write_plan()
    except Exception:  # no DVC project here (run by hand): stage lines just lack k/N
        pass
    where = position("check")
    print(f"✓ {where + ' ' if where else ''}check: {params_file} valid (profile {cfg.profile}); "
          f"{len(written)} check files in {out_dir}, {len(changed)} changed")
    from biasaudit.weights import missing

    for line in lifecycle_warnings:  # not fatal: the stage's probe asks the API itself
        print(f"warning: {line}", file=sys.stderr)
    for line in input_problems(cfg):  # not fatal here either: the stage reading the folder records each one
        print(f"warning: unusable input: {line}", file=sys.stderr)
    lacking = missing(cfg)  # not fatal here: a stage that needs none of these still runs; one that does stops first
    for need in lacking:
        print(f"warning: {describe_need(need)}", file=sys.stderr)
    if lacking:
        print(f"check: {plural(len(lacking), 'thing')} missing; the stages that need them will stop "
              "before their notebook runs (`biasaudit check` lists them)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
