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
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_table
from biasaudit.pipeline.provenance import write_run_info
from biasaudit.vlm import sources as src

cfg, params = stage_params("sources")
banner(cfg)
out_dir = C.SOURCES_DIR

# %%
manifest = src.build_sources(params, out_dir)  # every candidate checked; rejects keep their reason
display(manifest.drop(columns=["sha256"]))
print(manifest.groupby(["occupation", "status"]).size().unstack(fill_value=0))

# %%
atomic_write_table(manifest, out_dir / "manifest.parquet")
write_run_info(out_dir / "run_info.json", stage="sources", params=params.model_dump())
