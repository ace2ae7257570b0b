"""A real-photo baseline for the homogeneity gap (beyond the paper).

Face recognisers are less accurate on some groups, so even *real*, unrelated people of those groups look
more alike to them; a generator's gap for a group is only excess homogeneity when it exceeds the gap the
same embedder gives real portraits of that group. The baseline is a user-supplied folder

    <portraits_dir>/<group>/<any name>.jpg      group ∈ white, black, asian, hispanic, other

measured by the very same faces code (detector, skin, CLIP and face embeddings) as the generated images,
and `stats.homogeneity.relative_gaps` reports each model's gap minus the baseline's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

from biasaudit.pipeline.images import load_rgb
from biasaudit.pipeline.io import atomic_path
from biasaudit.pipeline.provenance import library_versions_json, sha256_file, utc_now

MODEL = "baseline"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff"}


def portrait_manifest(portraits_dir: str | Path, groups: tuple[str, ...], stand_in: bool = False) -> pd.DataFrame:
    """One row per file in the generate manifest's format; a file's group is its folder, one of `groups` (the
    active set's labels); `prompt_id` is the group (the cluster the
    bootstrap resamples is the single portrait, so each person counts once). Files outside a group
    folder or unreadable are kept with status 'failed' and a reason."""
    root = Path(portraits_dir)
    rows = []
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    for index, path in enumerate(files):
        rel = path.relative_to(root)
        group = rel.parts[0].lower() if len(rel.parts) > 1 else ""
        image_id = f"{MODEL}-{hashlib.sha1(rel.as_posix().encode()).hexdigest()[:12]}"
        status, reason, width, height = "ok", "", 0, 0
        if group not in groups:
            status, reason = "failed", f"not in a group folder ({', '.join(groups)}): {rel.as_posix()}"
        else:
            loaded = load_rgb(path)
            if not loaded.ok:
                status, reason = "failed", loaded.reason
            else:
                height, width = loaded.rgb.shape[:2]
        rows.append({"image_id": image_id, "model": MODEL, "backend": "folder", "model_id": root.as_posix(),
                     "model_revision": "", "prompt_id": image_id, "prompt": "", "group": group, "seed": 0,
                     "index": index, "width": width, "height": height, "sha256": sha256_file(path),
                     "path": path.as_posix(), "status": status, "reason": reason, "created_at": utc_now(),
                     "libraries": library_versions_json(), "stand_in": stand_in})
    manifest = pd.DataFrame(rows)
    if not manifest.empty:
        revision = hashlib.sha256("".join(sorted(manifest["sha256"])).encode()).hexdigest()[:16]
        manifest["model_revision"] = f"files:{revision}"
    return manifest


def build_standin_portraits(out_dir: str | Path, groups: tuple[str, ...], per_group: int, seed: int,
                            size: int = 256) -> Path:
    """STAND-IN baseline for the offline profile: seeded variants of the two packaged public-domain
    photos (both of light-skinned people), dealt round-robin into one folder per group of `groups`. The group
    folders say nothing about the people: this only exercises the code path."""
    from PIL import Image

    from biasaudit.backends.generators.packaged_photos import make_variant
    from biasaudit.pipeline.provenance import derive_seed

    out = Path(out_dir)
    for k in range(per_group * len(groups)):
        group = groups[k % len(groups)]
        target = out / group / f"standin-{k:03d}.png"
        if target.exists():
            continue
        rgb, _ = make_variant(derive_seed("baseline-standin", seed, k), size, size)
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            Image.fromarray(rgb).save(tmp, format="PNG")
    (out / "STAND-IN.txt").write_text("Stand-in portraits: packaged photos dealt into group folders at random. "
                                      "Not real group membership; numbers from them describe nothing.\n")
    return out


def embedding_rows(index: pd.DataFrame, meta: pd.DataFrame, space: str) -> tuple[np.ndarray, pd.DataFrame]:
    """Rows of an embedding matrix (`clip_row` / `face_row` ≥ 0) joined to their metadata."""
    col = f"{space}_row"
    present = index[index[col] >= 0][["image_id", col]].merge(meta, on="image_id", how="inner")
    return present[col].to_numpy(), present.reset_index(drop=True)
