# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     notebook_metadata_filter: -jupytext.text_representation
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
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import pandas as pd
from IPython.display import display
from PIL import Image

from biasaudit import contracts as C
from biasaudit.faces.detect import make_detector
from biasaudit.io import atomic_path, atomic_write_table
from biasaudit.notebook import banner, stage_params
from biasaudit.provenance import sha256_file, write_run_info
from biasaudit.vlm import sources as src

cfg, params = stage_params("sources")
banner(cfg)
out_dir = C.SOURCES_DIR

# %%
if params.source == "packaged":
    # a few spare seeded crops per occupation, tried in order if one is rejected
    candidates = src.packaged_candidates(params.occupations, 3 * params.photos_per_occupation, params.seed,
                                         params.packaged_max_side)
else:
    candidates = src.folder_candidates(params.input_dir, params.occupations)
    if not candidates:
        raise FileNotFoundError(f"sources.input_dir: no photos under {params.input_dir}/<occupation>/ "
                                f"for occupations {params.occupations}")
detector = make_detector("dlib", dlib_upsample=params.detector_upsample)
rows = []
for c, rec in src.select_sources(candidates, detector, params):
    path = out_dir / c["occupation"] / f"{c['base_id']}.png"
    if rec["status"] == "ok":
        with atomic_path(path) as tmp:
            Image.fromarray(c["rgb"]).save(tmp, format="PNG")
    rows.append({"occupation": c["occupation"], "base_id": c["base_id"], "origin": c["origin"],
                 "id_note": c.get("id_note", ""), "path": str(path) if rec["status"] == "ok" else "", **rec,
                 "sha256": sha256_file(path) if rec["status"] == "ok" else "",
                 "detector": detector.name,
                 # packaged: seeded crops of two public-domain photos, near-duplicates of each other; they are
                 # independent source photos only in the planted VLM's draws (STAND-IN units, not a sample)
                 "stand_in": params.source == "packaged"})
manifest = pd.DataFrame(rows)
display(manifest.drop(columns=["sha256"]))
print(manifest.groupby(["occupation", "status"]).size().unstack(fill_value=0))

# %%
atomic_write_table(manifest, out_dir / "manifest.parquet")
write_run_info(out_dir / "run_info.json", stage="sources", params=params.model_dump())
