"""The `faces@<model>` stage as library code: per-image measurement (the engine's batch function),
then assembly of the faces table and the embedding matrices from the record log and per-batch parts.

Per image: load (bad input → reason) → detect faces (largest kept; none → 'no_face') → skin mask
(landmarks | bisenet) → mean sRGB → CIELAB columns; face embedding of the largest face; CLIP
embedding of the whole image (also for images without a face). Embedding rows of a batch are written
to `parts/<batch>.npz` before the batch's records reach the log, so a killed run resumes cleanly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.faces.colour import achromatic_reason, describe_rgb, mean_skin_rgb
from biasaudit.faces.detect import landmarks68, make_detector
from biasaudit.faces.segment import bisenet_masks, landmark_skin_from_landmarks, outline_overlay, remove_extremes
from biasaudit.pipeline.images import load_rgb
from biasaudit.pipeline.io import EMBEDDING_DECIMALS, atomic_path, stable_floats
from biasaudit.pipeline.provenance import stable_hash

COLOUR_COLUMNS = list(C.COLOUR_COLUMNS)
FACES_COLUMNS = ["image_id", "model", "prompt_id", "n_faces", "det_score", "bbox",
                 "image_scale",  # working size / stored size (faces.image_max_side); bbox is in working pixels
                 "skin_pixels", *COLOUR_COLUMNS,
                 "status", "reason", "face_backend", "face_model_id", "face_revision", "skin_backend",
                 "skin_model_id", "stand_in",
                 # instrument check: a second detector on every image (faces.cross_detector; NaN when off)
                 "cross_detector", "cross_n_faces", "cross_det_score", "cross_L"]


def _empty_colour() -> dict[str, Any]:
    return {c: (None if c == "L_bin" else float("nan")) for c in COLOUR_COLUMNS}


class FaceMeasurer:
    """Holds the loaded models for one run; `batch_fn(parts_dir)` is the runner's batch function."""

    def __init__(self, p):
        self.p = p
        kw = dict(dlib_kind=p.dlib_kind, dlib_upsample=p.dlib_upsample, dlib_threshold=p.dlib_threshold,
                  insightface_model=p.insightface_model, insightface_root=p.insightface_root,
                  det_threshold=p.det_threshold, det_size=p.det_size, device=p.device)
        if p.detector == "insightface" and p.insightface_root == "tiny":
            from biasaudit.tiny.insightface import build_tiny_insightface

            kw["insightface_root"] = str(build_tiny_insightface())
            kw["stand_in"] = True
        self.detector = make_detector(p.detector, **kw)
        self.bisenet = None
        if p.skin_method == "bisenet":
            from biasaudit.faces.bisenet import load_bisenet
            from biasaudit.faces.embeddings import resolve_device

            self.bisenet = load_bisenet(p.bisenet_weights, resolve_device(p.device))
        self.face_embedder = None
        if p.face_embedding == "dlib":
            from biasaudit.faces.embeddings import DlibFaceEmbedder

            self.face_embedder = DlibFaceEmbedder()
        from biasaudit.faces.embeddings import ClipEmbedder

        self.clip = ClipEmbedder(p.clip_model, p.clip_pretrained, p.device, p.clip_batch_size)
        self.cross = None
        if p.cross_detector != "none":
            from biasaudit.faces.detect import DlibDetector

            self.cross = DlibDetector(p.cross_detector.removeprefix("dlib-"), upsample=p.cross_upsample)
        self.skin_model_id = Path(p.bisenet_weights).name if p.skin_method == "bisenet" else "shape_predictor_68_face_landmarks.dat"

    # ------------------------------------------------------------------ one image
    def skin_masks(self, rgb: np.ndarray, bboxes: list) -> list[np.ndarray]:
        if self.p.skin_method == "bisenet":
            masks = bisenet_masks(self.bisenet, rgb, bboxes, self.p.bisenet_margin)
        else:
            masks = [landmark_skin_from_landmarks(rgb.shape[:2], landmarks68(rgb, b)) for b in bboxes]
        return [remove_extremes(rgb, m, self.p.shadow_percentile, self.p.highlight_percentile) for m in masks]

    def measure(self, rgb: np.ndarray, with_embedding: bool = True
                ) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray | None, tuple | None]:
        """(record fields, face embedding or None, skin mask or None, bbox or None) for one RGB image
        (without `with_embedding`, no face embedding is computed: the overlays need the mask only)."""
        faces = self.detector.detect(rgb)
        rec: dict[str, Any] = {"n_faces": len(faces), "det_score": float("nan"), "bbox": None, "skin_pixels": 0,
                               **_empty_colour()}
        if not faces:
            return rec | {"status": "no_face", "reason": "no face detected"}, None, None, None
        face = faces[0]
        rec["det_score"], rec["bbox"] = face.score, json.dumps([round(float(v), 1) for v in face.bbox])
        note = ""
        if len(faces) > 1:
            if not self.p.measure_multi_face:
                return rec | {"status": "multi_face",
                              "reason": f"{len(faces)} faces (measure_multi_face is false)"}, None, None, face.bbox
            note = f"{len(faces)} faces: largest measured"
        emb = None
        if self.p.face_embedding == "insightface":
            emb = face.embedding
        elif self.face_embedder is not None and with_embedding:
            emb = self.face_embedder.embed(rgb, face.bbox)
        mask = self.skin_masks(rgb, [face.bbox])[0]
        rec["skin_pixels"] = int(mask.sum())
        if rec["skin_pixels"] < self.p.min_skin_pixels:
            return rec | {"status": "no_skin", "reason": f"{rec['skin_pixels']} skin pixels "
                          f"(< min_skin_pixels {self.p.min_skin_pixels})" + (f"; {note}" if note else "")}, emb, mask, face.bbox
        achromatic = achromatic_reason(rgb, mask)
        if achromatic:
            return rec | {"status": C.NOT_MEASURABLE, "reason": "; ".join(x for x in (achromatic, note) if x)}, emb, mask, face.bbox
        rec |= describe_rgb(mean_skin_rgb(rgb, mask))
        return rec | {"status": "ok", "reason": note}, emb, mask, face.bbox

    def cross_check(self, rgb: np.ndarray, fields: dict[str, Any]) -> dict[str, Any]:
        """The second detector's verdict on the same image; where the main detector found no face but
        this one did, the skin L* measured on its face (so lost faces still get an L* bin)."""
        if self.cross is None:
            return {}
        faces = self.cross.detect(rgb)
        out = {"cross_detector": self.cross.name, "cross_n_faces": len(faces),
               "cross_det_score": faces[0].score if faces else float("nan"), "cross_L": float("nan")}
        if faces and fields.get("n_faces", 0) == 0:
            mask = self.skin_masks(rgb, [faces[0].bbox])[0]
            if int(mask.sum()) >= self.p.min_skin_pixels:
                out["cross_L"] = describe_rgb(mean_skin_rgb(rgb, mask))["L"]
        return out

    # ------------------------------------------------------------------ batches
    def provenance(self) -> dict[str, Any]:
        return {"face_backend": self.detector.name, "face_model_id": self.detector.model_id,
                "face_revision": self.detector.revision, "skin_backend": self.p.skin_method,
                "skin_model_id": self.skin_model_id}

    def load(self, path: str | Path):
        """An image as the stage measures it: upright sRGB within the pixel budget (images.load_rgb)."""
        return load_rgb(path, max_side=self.p.image_max_side)

    def record(self, it: dict[str, Any], part: str) -> dict[str, Any]:
        """The fields of an image's record before it is measured (no face, no colour, no embedding rows)."""
        return {"image_id": it["image_id"], "model": it["model"], "prompt_id": it["prompt_id"],
                "n_faces": 0, "det_score": float("nan"), "bbox": None, "image_scale": float("nan"), "skin_pixels": 0,
                **_empty_colour(), **self.provenance(),
                "stand_in": bool(it.get("stand_in", False)) or self.detector.stand_in,
                "part": part, "clip_part_row": -1, "face_part_row": -1,
                "cross_detector": self.cross.name if self.cross else "none", "cross_n_faces": -1,
                "cross_det_score": float("nan"), "cross_L": float("nan")}

    def failed_record(self, it: dict[str, Any], reason: str) -> dict[str, Any]:
        """The record of an image whose pool worker died on it (engine.Stage.on_death): no part file."""
        return self.record(it, "") | {"status": "failed", "reason": reason}

    def batch_fn(self, parts_dir: str | Path, root: str | Path = "."):
        parts_dir, root = Path(parts_dir), Path(root)

        def fn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
            records, clip_imgs, clip_of, faces_vecs = [], [], {}, []
            # named by the batch's ids and their content: a redone image never overwrites rows still in use
            part = f"{stable_hash([[it['image_id'], it.get('input_sha', '')] for it in items])}.npz"
            for it in items:
                rec = self.record(it, part)
                if it.get("status", "ok") != "ok":
                    records.append(rec | {"status": "skipped", "reason": f"generation {it.get('status')}: {it.get('reason', '')}"})
                    continue
                loaded = self.load(root / it["path"])
                if not loaded.ok:
                    records.append(rec | {"status": "bad_image", "reason": loaded.reason})
                    continue
                try:
                    fields, emb, _, _ = self.measure(loaded.rgb)
                    fields |= self.cross_check(loaded.rgb, fields)
                except Exception as exc:
                    records.append(rec | {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"})
                    continue
                rec |= fields | {"image_scale": loaded.scale}
                if loaded.note:
                    rec["reason"] = "; ".join(x for x in (rec["reason"], f"input {loaded.note}") if x)
                if emb is not None:
                    rec["face_part_row"] = len(faces_vecs)
                    faces_vecs.append(np.asarray(emb, np.float32))
                clip_of[len(records)] = len(clip_imgs)
                clip_imgs.append(loaded.rgb)
                records.append(rec)
            clip = self.clip.embed(clip_imgs) if clip_imgs else np.zeros((0, 0), np.float32)
            for i, row in clip_of.items():
                records[i]["clip_part_row"] = row
            face = np.stack(faces_vecs) if faces_vecs else np.zeros((0, 0), np.float32)
            with atomic_path(parts_dir / part) as tmp:
                with open(tmp, "wb") as fh:
                    np.savez(fh, clip=clip, face=face)
            return records

        return fn


def make_faces_fn(params, parts_dir: str, root: str = "."):
    """The batch function built where it runs (the driver, or each Ray actor, which loads its own
    models): a module-level factory over the `Faces` section, so a functools.partial pickles. The
    worker writes each batch's embeddings to `parts/<hash>.npz` atomically; only the driver logs."""
    return FaceMeasurer(params).batch_fn(parts_dir, root)


# what a pool worker imports anyway: once, in the fork server (torch and open_clip take seconds)
PRELOAD = ("biasaudit.faces.stage", "biasaudit.faces.embeddings", "biasaudit.faces.preload")


def on_cpu(params) -> bool:
    """Whether the stage's models run on the CPU (dlib always; InsightFace unless it gets a GPU): only
    then do several local worker processes help (each would otherwise hold its own GPU context)."""
    if params.detector != "insightface":
        return True
    from biasaudit.faces.embeddings import resolve_device

    return resolve_device(params.device) == "cpu"


def work_dir_of(model: str) -> Path:
    """The resumable work folder of one model (records.jsonl + parts/): outside the DVC outputs, which
    DVC deletes before a run."""
    return C.WORK_DIR / "faces" / model


def settings_hash(params) -> str:
    """The parameters that change a measurement (a change remeasures every image)."""
    return stable_hash(params.model_dump(exclude={"batch_size", "limit", "n_overlays", "device", "clip_batch_size"}))


def plan_items(manifest: pd.DataFrame, root: str | Path = ".") -> list[dict[str, Any]]:
    """One item per manifest row, with the sha256 of the image file as it is now (content-addressed
    resume: another image under the same id is remeasured)."""
    from biasaudit.pipeline.engine import file_digest

    cols = ["image_id", "model", "prompt_id", "path", "status", "reason", "stand_in"]
    items = manifest[[c for c in cols if c in manifest]].to_dict("records")
    for it in items:
        ok = it.get("status", "ok") == "ok" and bool(it.get("path"))
        it["input_sha"] = file_digest(Path(root) / it["path"]) if ok else ""
    return items


def item_content(item: dict[str, Any]) -> dict[str, Any]:
    return {"status": item.get("status"), "image": item["input_sha"]}


def prune_parts(parts_dir: Path, keep: set[str]) -> int:
    """Delete part files no current record refers to (left by remeasured images); returns how many."""
    removed = 0
    for path in parts_dir.glob("*.npz") if parts_dir.is_dir() else []:
        if path.name not in keep:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def run_faces(model: str, cfg, progress: bool = True, measurer: "FaceMeasurer | None" = None,
              manifest_path: str | Path | None = None, faces_path: str | Path | None = None,
              emb_dir: str | Path | None = None) -> dict[str, Any]:
    """The whole faces@<model> stage except overlays and the first look (what the notebook calls).

    Measures every image of the model's manifest through engine.run_stage (local, local pool or Ray,
    whole or one shard), then — unless this run is one shard of several — assembles and writes the faces
    table, the embedding matrices, their index and meta.json. Returns the pieces and the measurer (for
    overlays). The three paths default to the generator's; the real-portrait baseline passes its own."""
    from functools import partial

    from biasaudit.pipeline.engine import Stage, run_stage
    from biasaudit.pipeline.io import atomic_write_json, atomic_write_table
    from biasaudit.pipeline.provenance import run_info

    params, ex = cfg.faces, cfg.execution
    if manifest_path is None and model not in cfg.models:
        raise ValueError(f"model '{model}' is not a key of `models:` in params.yaml ({', '.join(cfg.models)})")
    manifest_path = Path(manifest_path or C.manifest_path(cfg.generate.images_dir, model))
    faces_path = Path(faces_path or C.faces_path(model))
    emb_dir = Path(emb_dir or C.embeddings_dir(model))
    if not manifest_path.exists():
        raise FileNotFoundError(f"{manifest_path} is missing: run the generate@{model} stage first")
    manifest = pd.read_parquet(manifest_path)
    items = plan_items(manifest)
    work_dir = work_dir_of(model)
    parts_dir = work_dir / "parts"
    cpu_bound = on_cpu(params)
    if cpu_bound:
        from biasaudit.pipeline.scale.pool import prestart

        prestart(ex, PRELOAD)
    # the driver's measurer names the models in meta.json and draws the overlays; the serial runner uses it
    measurer = measurer or FaceMeasurer(params)
    if ex.runner == "ray" or ex.local_workers > 1:
        make_fn = partial(make_faces_fn, params, parts_dir.as_posix())
    else:
        fn = measurer.batch_fn(parts_dir)
        make_fn = lambda: fn  # noqa: E731 - called in this process only
    stage = Stage(f"faces {model}", items, "image_id", settings_hash(params), make_fn, work_dir / "records.jsonl",
                  item_content, batch_size=params.batch_size, limit=params.limit, cpu_bound=cpu_bound,
                  preload=PRELOAD, on_death=measurer.failed_record)
    run = run_stage(stage, ex, progress)
    summary, execution = run.summary, run.execution
    records = pd.DataFrame(run.rows())
    if records.empty:
        records = pd.DataFrame(columns=["image_id", "model", "prompt_id", "part", "clip_part_row", "face_part_row"])
    faces, index, clip, face = assemble(records, manifest["image_id"].tolist(), parts_dir)
    emb_meta = {
        "clip": {"backend": measurer.clip.name, "model_id": measurer.clip.model_id, "revision": measurer.clip.revision,
                 "dim": int(clip.shape[1]) if clip.size else 0, "rows": int(len(clip)),
                 "stand_in": measurer.clip.stand_in},
        "face": {"backend": params.face_embedding, "dim": int(face.shape[1]) if face.size else 0, "rows": int(len(face)),
                 "model_id": (measurer.face_embedder.model_id if measurer.face_embedder else params.insightface_model),
                 "detector": measurer.detector.name, "det_threshold": params.det_threshold,
                 "stand_in": bool(measurer.detector.stand_in)},
        "generator_stand_in": bool(manifest["stand_in"].any()),
    }
    if not run.sharded:
        prune_parts(parts_dir, set(records["part"]))
        atomic_write_table(faces, faces_path)
        for name, matrix in (("clip", clip), ("face", face)):
            with atomic_path(emb_dir / f"{name}.npy") as tmp:
                with open(tmp, "wb") as fh:
                    np.save(fh, stable_floats(matrix.astype(np.float32), EMBEDDING_DECIMALS))
        atomic_write_table(index, emb_dir / "index.parquet")
        atomic_write_json(emb_dir / "meta.json", emb_meta | {"run": run_info(params.model_dump())})
        atomic_write_json(faces_path.with_suffix(".run.json"), run_info(params.model_dump())
                          | {"model": model, "execution": execution,
                             # where the detector ran, read from its sessions (InsightFace), not from params
                             "face_device": getattr(measurer.detector, "device", "cpu")})
    return {"manifest": manifest, "faces": faces, "index": index, "clip": clip, "face": face, "emb_meta": emb_meta,
            "summary": summary, "measurer": measurer, "execution": execution, "faces_path": faces_path,
            "emb_dir": emb_dir, "measured": run.measured}


def assemble(records: pd.DataFrame, order: list[str], parts_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, np.ndarray]:
    """(faces table, embedding index, clip matrix, face matrix) in `order` of image_id, from the log."""
    parts_dir = Path(parts_dir)
    recs = records.set_index("image_id").loc[[i for i in order if i in set(records["image_id"])]].reset_index()
    cache: dict[str, Any] = {}
    clip_rows, face_rows, clip_idx, face_idx = [], [], [], []
    for r in recs.itertuples():
        arrays = cache.get(r.part)
        if arrays is None and r.part and (parts_dir / r.part).is_file():
            with np.load(parts_dir / r.part) as z:
                arrays = cache[r.part] = {"clip": z["clip"], "face": z["face"]}
        for col, rows, idx, key in (("clip_part_row", clip_rows, clip_idx, "clip"), ("face_part_row", face_rows, face_idx, "face")):
            k = int(getattr(r, col))
            if k >= 0 and arrays is not None:
                idx.append(len(rows))
                rows.append(arrays[key][k])
            else:
                idx.append(-1)
    clip = np.stack(clip_rows).astype(np.float32) if clip_rows else np.zeros((0, 0), np.float32)
    face = np.stack(face_rows).astype(np.float32) if face_rows else np.zeros((0, 0), np.float32)
    index = pd.DataFrame({"image_id": recs["image_id"], "model": recs["model"], "prompt_id": recs["prompt_id"],
                          "clip_row": np.asarray(clip_idx, dtype=np.int64), "face_row": np.asarray(face_idx, dtype=np.int64)})
    faces = recs[[c for c in FACES_COLUMNS if c in recs]].copy()
    faces["n_faces"] = faces["n_faces"].astype(int)
    faces["skin_pixels"] = faces["skin_pixels"].astype(int)
    return faces, index, clip, face


def write_overlays(measurer: FaceMeasurer, faces: pd.DataFrame, manifest: pd.DataFrame, out_dir: str | Path,
                   n: int, seed: int, root: str | Path = ".") -> list[Path]:
    """Mask-outline overlays for a seeded sample of measured images (reviewers see what was measured).
    The folder always exists (it is a stage output) with an index.txt saying what it holds."""
    from PIL import Image

    from biasaudit.pipeline.io import atomic_write_text

    ok = faces[faces["status"] == "ok"]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    if n <= 0 or ok.empty:
        reason = "n_overlays is 0" if n <= 0 else "no image of this model had a measured face"
        atomic_write_text(Path(out_dir) / "index.txt", f"no overlays: {reason}\n")
        return []
    sample = ok.sample(min(n, len(ok)), random_state=seed % 2**32)["image_id"]
    paths = manifest.set_index("image_id")["path"]
    written = []
    for image_id in sample:
        loaded = measurer.load(Path(root) / paths[image_id])
        if not loaded.ok:
            continue
        _, _, mask, bbox = measurer.measure(loaded.rgb, with_embedding=False)
        if mask is None:
            continue
        out = Path(out_dir) / f"{image_id}.png"
        with atomic_path(out) as tmp:
            Image.fromarray(outline_overlay(loaded.rgb, mask, bbox)).save(tmp, format="PNG")
        written.append(out)
    atomic_write_text(Path(out_dir) / "index.txt", "".join(f"{p.name}\n" for p in written) or "no overlays\n")
    return written
