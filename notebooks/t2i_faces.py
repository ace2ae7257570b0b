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
# # Faces: skin tone in CIELAB and image/face embeddings (one generator)
#
# For every generated image of one model: find the face (largest kept), segment its skin, and measure
# the mean skin colour. As in the paper, the mean sRGB of the skin pixels is converted once to CIELAB
# (D65) and described by L* (lightness), C* (chroma), hue h in [0, 360) and ITA; L* is binned
# <40, [40,55), [55,70), ≥70. The same pass computes two embeddings for the homogeneity gap: the
# whole image in CLIP space and the largest face in a face-recognition space.
#
# An image without a face is **reported** (status `no_face`), never an error; unreadable or unusual
# files get a status and a reason. Work is resumable: each finished batch is logged, so a re-run after
# an interruption continues where it stopped. A few overlays with the measured mask outlined are saved
# to `reports/t2i/overlays/<model>/` so a reviewer can see exactly which pixels were measured.

# %% tags=["parameters"]
# Only what varies per stage instance (DVC passes the foreach key); every other value comes from
# params.yaml through stage_params (validated), so a run outside DVC reads what `dvc repro` reads.
model: str = "planted-a"  # generator name (a key of `models:` in params.yaml)

# %%
import pandas as pd
from IPython.display import Image as ShowImage
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.faces.stage import run_faces, write_overlays
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.engine import finish
from biasaudit.stats.homogeneity import homogeneity_gap, similarity_by_bin
from biasaudit.stats.skin_summary import skin_summary

cfg, params = stage_params("faces")
banner(cfg)
if model not in cfg.models:
    raise ValueError(f"model '{model}' is not a key of `models:` in params.yaml ({', '.join(cfg.models)})")
overlay_dir = C.overlays_dir(model)
print("execution:", cfg.execution.model_dump())

# %% [markdown]
# ## Measure every image (resumable)
# The work log lives outside the DVC outputs (`data/t2i/.work/faces/<model>/<hash of the measurement
# parameters>/`), so changing a parameter that changes a measurement starts afresh. `execution:` runs
# the batches locally (default) or on a Ray actor pool, whole or as one shard of several; an unsharded
# run first merges the shard logs it finds, then writes the faces table and the embeddings.

# %%
result = run_faces(model, cfg)
summary, measurer, manifest = result["summary"], result["measurer"], result["manifest"]
faces, index, clip, face, emb_meta = (result[k] for k in ("faces", "index", "clip", "face", "emb_meta"))
print(f"{summary.total} images: {summary.already_done} already measured, {summary.processed} now; {summary.status_counts}")
display(faces.groupby(["status"]).size().rename("images").to_frame())
display(pd.Series(emb_meta["clip"] | {"face_" + k: v for k, v in emb_meta["face"].items()}, name="embeddings").to_frame())

# %% [markdown]
# ## What was measured
# Overlays (green: skin mask outline; red: face box) for a seeded sample of measured images.

# %%
overlays = write_overlays(measurer, faces, manifest, overlay_dir, params.n_overlays, cfg.seed)
for p in overlays[:3]:
    display(ShowImage(filename=str(p), width=220))
print(f"{len(overlays)} overlays in {overlay_dir}")

# %% [markdown]
# ## Skin tone by prompt and L* bin
# The analysis stage joins these measurements with the race labels; here, a first look per prompt:
# mean L*, C*, hue and the diversity of skin colours (mean pairwise ΔE2000).

# %%
measured = faces[faces["status"] == "ok"]
if measured.empty:
    print("No measured face for this model (e.g. stand-in images without faces): see the status table above.")
else:
    display(measured.groupby("L_bin").size().rename("images").to_frame())
    display(skin_summary(measured, by=["model", "prompt_id"], n_boot=0).round(2))

# %% [markdown]
# ## Homogeneity (point estimates)
# Mean intra-group cosine similarity minus mean similarity to the rest, by prompt and by L* bin, in
# both spaces. Confidence intervals and permutation p-values by race label are in the analysis stage.
# Small groups are flagged where the gaps are reported, by the analysis stage (`analyze.min_group_size`).

# %%
meta = index.merge(faces[["image_id", "L_bin"]], on="image_id", how="left")
for space, matrix in (("clip", clip), ("face", face)):
    rows = meta[meta[f"{space}_row"] >= 0]
    if len(rows) < 2:
        print(f"{space}: fewer than 2 embeddings")
        continue
    X = matrix[rows[f"{space}_row"].to_numpy()]
    print(f"{space} space ({'stand-in' if emb_meta[space]['stand_in'] else 'real'} model), by prompt:")
    display(homogeneity_gap(X, rows["prompt_id"].to_numpy(), small_group=None).round(3))
    bins = rows["L_bin"].where(rows["L_bin"].notna() & (rows["L_bin"] != ""), None).to_numpy()
    if any(b is not None for b in bins):
        print(f"{space} space, mean similarity within L* bins:")
        display(similarity_by_bin(X, bins, small_group=None).round(3))

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
finish(result["summary"], result["execution"])
