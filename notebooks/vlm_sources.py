# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Method B · Sources: real photos to edit
#
# Face-only counterfactuals start from real photographs, one person per photo, grouped by occupation
# (`<input_dir>/<occupation>/<base_id>.jpg`). Each candidate is checked: readable, large enough, one
# *dominant* face (dlib's packaged HOG detector) of sufficient size. Rejects stay in the manifest with
# their reason; accepted photos are copied as 8-bit sRGB PNG to `data/vlm/sources/<occupation>/`.
# Occupations (a list) come from params.yaml `sources.occupations`.
# The offline profile uses the public-domain photos that ship in packages (skimage's astronaut,
# matplotlib's Grace Hopper) and seeded crops of them.

# %% tags=["parameters"]
source: str = "folder"  # folder | packaged (offline: the public-domain photos shipped in packages)
input_dir: str = "data/vlm/source_photos"  # <input_dir>/<occupation>/<base_id>.<jpg|png|...>
photos_per_occupation: int = 8  # at most this many photos per occupation (sorted by file name)
min_side: int = 256  # shortest image side, pixels
min_face_side: int = 80  # shortest side of the largest face box, pixels
dominance_ratio: float = 4.0  # largest face ≥ this × the area of the next one
detector_upsample: int = 1  # dlib HOG upsampling

# %%
from pathlib import Path

import pandas as pd
from IPython.display import display
from PIL import Image

from biasaudit.faces.detect import make_detector
from biasaudit.io import atomic_path, atomic_write_table
from biasaudit.notebook import banner, stage_params
from biasaudit.provenance import sha256_file, write_run_info
from biasaudit.vlm import sources as src

cfg, params = stage_params("sources", source=source, input_dir=input_dir,
                           photos_per_occupation=photos_per_occupation, min_side=min_side,
                           min_face_side=min_face_side, dominance_ratio=dominance_ratio,
                           detector_upsample=detector_upsample)
banner(cfg)
out_dir = Path("data/vlm/sources")

# %%
if params.source == "packaged":
    candidates = src.packaged_candidates(params.occupations, params.photos_per_occupation, params.seed)
else:
    candidates = src.folder_candidates(params.input_dir, params.occupations, params.photos_per_occupation)
    if not candidates:
        raise FileNotFoundError(f"sources.input_dir: no photos under {params.input_dir}/<occupation>/ "
                                f"for occupations {params.occupations}")
detector = make_detector("dlib", dlib_upsample=params.detector_upsample)
rows = []
for c in candidates:
    rec = src.check_photo(c["rgb"], detector, params, c["reason"])
    path = out_dir / c["occupation"] / f"{c['base_id']}.png"
    if rec["status"] == "ok":
        with atomic_path(path) as tmp:
            Image.fromarray(c["rgb"]).save(tmp, format="PNG")
    rows.append({"occupation": c["occupation"], "base_id": c["base_id"], "origin": c["origin"],
                 "path": str(path) if rec["status"] == "ok" else "", **rec,
                 "sha256": sha256_file(path) if rec["status"] == "ok" else "",
                 "detector": detector.name, "stand_in": False})
manifest = pd.DataFrame(rows)
display(manifest.drop(columns=["sha256"]))
print(manifest.groupby(["occupation", "status"]).size().unstack(fill_value=0))

# %%
atomic_write_table(manifest, out_dir / "manifest.parquet")
write_run_info(out_dir / "run_info.json", stage="sources", params=params.model_dump())
