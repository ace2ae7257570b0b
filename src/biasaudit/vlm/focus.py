"""FOCUS-layout counterfactual sets: paths, scanning/importing a released set, and the editing loop.

Layout (the released FOCUS dataset's): `data/vlm/focus/{occupation}/{base_id}/{Race}_{man|woman}.jpg`,
Race ∈ {Asian, Black, Latino, MiddleEastern, White}. `data/vlm/focus/manifest.parquet` has one row per
image: edit_id ('occupation/base_id/Race_gender'), occupation, base_id, race, gender, group (AM…WF),
path, source_path ('' for an imported set without sources), arm (counterfactual | null_edit | original:
the null-edit control, `counterfactuals.null_edit`, stored as `null.jpg` and `original.<ext>` beside the
group edits with race and gender empty and group = arm), backend, model_id, revision,
instruction_version, instruction_sha, seed, attempt, attempts, status (ok | refused | failed), reason,
pixel-check metrics of the kept attempt (px_*), sha256, stand_in, editor_settings, libraries (JSON),
created_at.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from PIL import Image

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.pipeline.engine import per_item
from biasaudit.pipeline.entries import DIRECTORY, entry_problem
from biasaudit.pipeline.images import load_rgb
from biasaudit.pipeline.io import atomic_path, atomic_write_bytes
from biasaudit.pipeline.provenance import derive_seed, library_versions_json, sha256_file, stable_hash, utc_now
from biasaudit.vlm.groups import COUNTERFACTUAL, NULL_EDIT, ORIGINAL, group_code, parse_group_name

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params import Params
    from biasaudit.params.vlm import Counterfactuals

FOCUS_SUFFIXES = (".jpg", ".jpeg", ".png")
CONTROL_STEMS = {"null": NULL_EDIT, "original": ORIGINAL}  # file stem → arm of the null-edit control


def control_path(root: str | Path, occupation: str, base_id: str, arm: str, suffix: str = ".jpg") -> Path:
    stem = {v: k for k, v in CONTROL_STEMS.items()}[arm]
    return Path(root) / occupation / base_id / f"{stem}{suffix}"


def focus_path(root: str | Path, occupation: str, base_id: str, race: str, gender: str, suffix: str = ".jpg") -> Path:
    return Path(root) / occupation / base_id / f"{race}_{gender}{suffix}"


def scan_focus(root: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """(images in FOCUS layout: occupation, base_id, race, gender, group, path), problems (paths + why:
    also a broken link, a link loop, a folder named like an image)."""
    root = Path(root)
    rows, problems = [], []
    for path in sorted(root.glob("*/*/*")):
        if path.name.startswith("."):
            continue
        why = entry_problem(path, root)
        if why == DIRECTORY and path.suffix.lower() not in FOCUS_SUFFIXES:  # a folder not named like an image
            continue
        if why:
            problems.append(f"{path}: {why}")
            continue
        if path.suffix.lower() not in FOCUS_SUFFIXES:
            if path.name != "manifest.parquet":
                problems.append(f"{path}: not an image in the FOCUS layout")
            continue
        occ, base = path.parent.parent.name, path.parent.name
        if path.stem in CONTROL_STEMS:
            arm = CONTROL_STEMS[path.stem]
            rows.append({"occupation": occ, "base_id": base, "race": None, "gender": None, "group": arm,
                         "path": str(path), "arm": arm})
            continue
        parsed = parse_group_name(path.stem)
        if parsed is None:
            problems.append(f"{path}: file name is not <Race>_<man|woman> (or null / original)")
            continue
        rows.append({"occupation": occ, "base_id": base, "race": parsed[0], "gender": parsed[1],
                     "group": group_code(*parsed), "path": str(path), "arm": COUNTERFACTUAL})
    df = pd.DataFrame(rows, columns=["occupation", "base_id", "race", "gender", "group", "path", "arm"])
    return df, problems


def import_focus_folder(src: str | Path, dst: str | Path, sources_dir: str | Path | None = None) -> pd.DataFrame:
    """Copy an existing FOCUS-layout set into `dst` as is (no editor runs); one manifest row per file.
    Unreadable images are recorded as failed; a source photo is linked when `sources_dir` has one."""
    found, problems = scan_focus(src)
    if found.empty:
        raise FileNotFoundError(f"{src}: no images in the FOCUS layout <occupation>/<base_id>/<Race>_<man|woman>.jpg"
                                + (f" ({len(problems)} files skipped, e.g. {problems[0]})" if problems else ""))
    rows = []
    for r in found.to_dict("records"):
        suffix = Path(r["path"]).suffix.lower()
        control = r["arm"] != COUNTERFACTUAL
        target = (control_path(dst, r["occupation"], r["base_id"], r["arm"], suffix) if control else
                  focus_path(dst, r["occupation"], r["base_id"], r["race"], r["gender"], suffix))
        loaded = load_rgb(r["path"])
        status, reason = ("ok", "") if loaded.ok else ("failed", loaded.reason)
        if loaded.ok and Path(r["path"]).resolve() != target.resolve():
            with atomic_path(target) as tmp:
                shutil.copyfile(r["path"], tmp)
        src_photo = ""
        if sources_dir is not None:
            cand = Path(sources_dir) / r["occupation"] / f"{r['base_id']}.png"
            src_photo = str(cand) if cand.is_file() else ""
        rows.append({"edit_id": f"{r['occupation']}/{r['base_id']}/{Path(r['path']).stem}",
                     "occupation": r["occupation"], "base_id": r["base_id"], "race": r["race"], "gender": r["gender"],
                     "group": r["group"], "arm": r["arm"], "path": str(target), "source_path": src_photo,
                     "backend": "folder",
                     "model_id": str(src), "revision": "", "instruction_version": "", "instruction_sha": "",
                     "seed": None, "attempt": 0, "attempts": 0, "status": status, "reason": reason,
                     "sha256": sha256_file(target) if status == "ok" else "", "stand_in": False,
                     "created_at": utc_now()})
    return pd.DataFrame(rows)


def edit_items(sources: pd.DataFrame, races: list[str], genders: list[str], null_edit: bool = False
               ) -> list[dict[str, Any]]:
    """One work item per accepted source photo × target group; with `null_edit`, per photo also the null
    edit and the copy of the unedited original (arm null_edit | original, race and gender None)."""
    items = []
    for s in sources[sources["status"] == "ok"].to_dict("records"):
        photo = {"occupation": s["occupation"], "base_id": s["base_id"], "source_path": s["path"]}
        for race in races:
            for gender in genders:
                items.append(photo | {"edit_id": f"{s['occupation']}/{s['base_id']}/{race}_{gender}", "race": race,
                                      "gender": gender, "group": group_code(race, gender), "arm": COUNTERFACTUAL})
        if null_edit:
            for stem, arm in CONTROL_STEMS.items():
                items.append(photo | {"edit_id": f"{s['occupation']}/{s['base_id']}/{stem}", "race": None,
                                      "gender": None, "group": arm, "arm": arm})
    return items


def encode_jpeg(rgb: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=quality, subsampling=0)
    return buf.getvalue()


KEYS = ("edit_id", "occupation", "base_id", "race", "gender", "group", "arm", "source_path")  # of every row


def make_edit_batch_fn(editor: Any, params: Counterfactuals, checks: Any, out_root: str | Path, detector: str = "dlib"):
    """The engine's batch function: edit, check the pixels (as saved), regenerate a failing edit
    with the next attempt's seed up to `params.max_attempts`, write the JPEG atomically, return the row.

    `params` = the counterfactuals section, `checks` = the validate_edits section (thresholds)."""
    from biasaudit.backends.editors import EditRequest
    from biasaudit.faces.colour import srgb_to_lab
    from biasaudit.faces.segment import face_region_mask
    from biasaudit.vlm.validate import grow, pixel_ok

    masks: dict[str, tuple[np.ndarray | None, np.ndarray | None, str]] = {}
    pixels: dict[str, dict[str, np.ndarray]] = {}  # a source's CIELAB and grown face mask, for the checks of its edits
    instruction_sha = stable_hash([params.instruction, params.inpaint_prompt], 12)
    prov = {"backend": editor.name, "model_id": editor.model_id, "revision": editor.revision,
            "instruction_version": params.instruction_version, "instruction_sha": instruction_sha,
            "stand_in": bool(editor.stand_in), "editor_settings": json.dumps(editor.settings(), sort_keys=True,
                                                                             default=str),
            "libraries": library_versions_json()}

    def source_info(path: str):
        if path not in masks:
            loaded = load_rgb(path)
            if not loaded.ok:
                masks[path] = (None, None, f"source: {loaded.reason}")
            else:
                mask, reason = face_region_mask(loaded.rgb, detector)
                masks[path] = (loaded.rgb, mask, f"source: {reason}" if mask is None else "")
        return masks[path]

    def original(item: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """The unedited original, copied byte for byte (no editor, no seed) beside the edits."""
        path = control_path(out_root, item["occupation"], item["base_id"], ORIGINAL,
                            Path(item["source_path"]).suffix.lower())
        with atomic_path(path) as tmp:
            shutil.copyfile(item["source_path"], tmp)
        return base | prov | {"status": "ok", "reason": "", "attempt": 0, "attempts": 0, "seed": None,
                              "path": str(path), "sha256": sha256_file(path), "created_at": utc_now()}

    def one(item: dict[str, Any]) -> dict[str, Any]:
        base = {k: item.get(k) for k in KEYS}
        if item.get("arm") == ORIGINAL:
            return original(item, base)
        src, mask, reason = source_info(item["source_path"])
        if src is None or mask is None:
            return base | prov | {"status": "failed", "reason": reason, "attempt": 0, "attempts": 0, "path": "",
                                  "seed": None, "sha256": "", "created_at": utc_now()}
        null = item.get("arm") == NULL_EDIT
        target = "null" if null else f"{item['race']}_{item['gender']}"
        description = params.null_description if null else params.target_descriptions[target]
        field = getattr(editor, "prompt_field", "instruction")
        text = params.null_instruction if null and field == "instruction" else \
            getattr(params, field).format(target=description)
        history, last = [], None
        for attempt in range(1, params.max_attempts + 1):
            seed = derive_seed(params.seed, item["edit_id"], attempt)
            result = editor.edit([EditRequest(item["source_path"], target, description, text, seed,
                                              mask if editor.uses_mask else None, params.negative_prompt)])[0]
            if result.status != "ok":
                last = (attempt, seed, result, None, None, [])
                history.append(f"{attempt}:{result.status}")
                if result.status == "refused" or result.meta.get("model_mismatch"):
                    break
                continue
            jpeg = encode_jpeg(result.image, params.jpeg_quality)
            saved = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))
            if item["source_path"] not in pixels:
                pixels[item["source_path"]] = {"src_lab": srgb_to_lab(src), "grown": grow(mask, checks.border_px)}
            ok, bad, metrics = pixel_ok(src, saved, mask, checks, **pixels[item["source_path"]])
            if null:  # the null edit is meant to leave the face as it is
                bad = [b for b in bad if b != "no_face_change"]
                ok = not bad
            last = (attempt, seed, result, jpeg, metrics, bad)
            history.append(f"{attempt}:" + ("pass" if ok else ",".join(bad)))
            if ok:
                break
        attempt, seed, result, jpeg, metrics, bad = last
        row = base | prov | {"attempt": attempt, "attempts": len(history), "attempt_history": ";".join(history),
                             "seed": seed, "created_at": utc_now(), "model_version": result.meta.get("model_version", "")}
        if result.meta.get("model_mismatch"):
            row["stop_reason"] = result.reason
        if jpeg is None:
            return row | {"status": result.status, "reason": result.reason, "path": "", "sha256": ""}
        path = control_path(out_root, item["occupation"], item["base_id"], NULL_EDIT) if null else \
            focus_path(out_root, item["occupation"], item["base_id"], item["race"], item["gender"])
        atomic_write_bytes(path, jpeg)
        row |= {"status": "ok", "reason": ("pixel checks failed after all attempts: " + ",".join(bad)) if bad else "",
                "path": str(path), "sha256": sha256_file(path), "pixel_checks_passed": not bad}
        return row | {f"px_{k}": v for k, v in metrics.items()}

    return per_item(one, lambda item, reason: {k: item.get(k) for k in KEYS} | prov | {
        "status": "failed", "reason": reason, "path": "", "attempt": 0, "attempts": 0, "seed": None, "sha256": "",
        "created_at": utc_now()})


# --- the stage: every accepted source photo × target group, on the engine ---------------------------

def make_edit_fn(params: Counterfactuals, checks: Any, out_root: str, detector: str = "dlib"):
    """The batch function built where it runs (the driver, a pool worker or a Ray actor, each with its
    own editor): a module-level factory over params models, so a functools.partial pickles."""
    from biasaudit.backends.editors import make_editor

    editor = make_editor(params)
    fn = make_edit_batch_fn(editor, params, checks, out_root, detector)
    fn.editor = editor  # type: ignore[attr-defined]
    return fn


def edit_content(item: dict[str, Any]) -> dict[str, Any]:
    """An edit depends on its source photo's bytes (not its path) and its target group (or control arm)."""
    from biasaudit.pipeline.engine import file_digest

    content = {"source": file_digest(item["source_path"]), "race": item["race"], "gender": item["gender"]}
    arm = item.get("arm", COUNTERFACTUAL)
    return content if arm == COUNTERFACTUAL else content | {"arm": arm}  # group edits keep their earlier hash


def edit_file_unchanged(item: dict[str, Any], record: dict[str, Any]) -> bool:
    from biasaudit.pipeline.engine import file_digest

    return record.get("status") != "ok" or file_digest(record.get("path")) == record.get("sha256")


def counterfactuals(cfg: Params, sources: pd.DataFrame | None, params: Counterfactuals | None = None, out_root: str | Path = C.FOCUS_DIR,
                    sources_dir: str | Path = C.SOURCES_DIR) -> tuple[pd.DataFrame, dict[str, Any], str, Any]:
    """The counterfactuals stage: import an existing FOCUS set (a backend with `imports_existing`) or
    edit every accepted source photo (run_edits). Returns the manifest, the editor's description, a
    one-line summary and the engine's run (None for an import)."""
    params = params or cfg.counterfactuals
    if registry.trait("editor", params.backend, "imports_existing", False):
        manifest = import_focus_folder(params.folder_dir, out_root, sources_dir)
        return manifest, {"backend": params.backend, "model_id": params.folder_dir, "stand_in": False}, \
            f"imported {len(manifest)} images from {params.folder_dir}", None
    if sources is None or not (sources["status"] == "ok").any():
        raise RuntimeError(f"no accepted source photos: run the `sources` stage first ({Path(sources_dir) / 'manifest.parquet'})")
    result = run_edits(cfg, sources, params, out_root)  # resumable; `execution:` local, pool or Ray
    return result["manifest"], result["editor"], f"{result['summary']} | execution: {result['execution']}", result["run"]


def run_edits(cfg: Params, sources: pd.DataFrame, params: Counterfactuals | None = None, out_root: str | Path = C.FOCUS_DIR,
              progress: bool = True, editor: Any = None) -> dict[str, Any]:
    """Edit every accepted source photo into every target group (resumable, `execution:` local, local
    pool for the tiny editor, or Ray). Returns the manifest rows (current records, item order), the
    engine's run and the editor's description. `editor` injects one (tests; serial local runner)."""
    from functools import partial

    from biasaudit.backends.editors import stage_probe
    from biasaudit.pipeline.engine import Stage, run_stage

    params = params or cfg.counterfactuals
    checks = cfg.validate_edits
    items = edit_items(sources, params.races, params.genders, params.null_edit)
    if editor is not None:
        fn = make_edit_batch_fn(editor, params, checks, out_root, params.mask_detector)
        fn.editor = editor  # type: ignore[attr-defined]
        make_fn = lambda: fn  # noqa: E731
    else:
        make_fn = partial(make_edit_fn, params, checks, Path(out_root).as_posix(), params.mask_detector)
    settings = stable_hash([params.model_dump(), checks.model_dump()], 16)
    cheap = editor is None and registry.recomputes_cheaply("editor", params.backend)  # a stand-in editor
    stage = Stage("edits", items, "edit_id", settings, make_fn, Path(out_root) / ".work" / "edits.jsonl",
                  edit_content, still_valid=edit_file_unchanged, cpu_bound=bool(registry.trait("editor", params.backend, "cpu_bound", False)),
                  code=(registry.module_of("editor", params.backend),) if cheap else None,
                  probe=None if editor is not None else stage_probe(params))
    run = run_stage(stage, cfg.execution, progress)
    if run.made:
        described = run.made[0].editor.describe()
    else:  # nothing pending, or the workers held the editor: describe a fresh, unused one
        from biasaudit.backends.editors import make_editor

        described = (editor or make_editor(params)).describe()
    from biasaudit.pipeline.engine import INPUT_FIELD, SETTINGS_FIELD

    manifest = pd.DataFrame(run.rows()).drop(columns=[SETTINGS_FIELD, INPUT_FIELD], errors="ignore")
    return {"manifest": manifest, "run": run, "summary": run.summary, "editor": described,
            "execution": run.execution}
