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
model: str = "packaged-photos"  # generator name (a key of `models:` in params.yaml)
detector: str = "dlib"  # dlib (HOG/CNN, packaged real models) | insightface (buffalo_l, the paper)
dlib_kind: str = "hog"  # hog (fast, frontal) | cnn (MMOD, more robust)
dlib_upsample: int = 1  # upsample before HOG to find smaller faces
dlib_threshold: float = 0.0  # dlib score floor, its default; raising it drops dark faces first
insightface_model: str = "buffalo_l"  # model pack name
insightface_root: str = ""  # folder holding models/<pack>/; empty: insightface default; tiny: stand-in
det_threshold: float = 0.85  # insightface detection-score threshold (paper: 0.85)
det_size: int = 640  # insightface detector input side
measure_multi_face: bool = True  # several faces: measure the largest, or record 'multi_face'
skin_method: str = "landmarks"  # landmarks (68-point polygon) | bisenet (CelebAMask-HQ skin class)
bisenet_weights: str = "models/bisenet/79999_iter.pth"  # BiSeNet state dict (bisenet only)
bisenet_margin: float = 0.5  # face crop margin for BiSeNet, fraction of the box per side
min_skin_pixels: int = 50  # fewer skin pixels → status no_skin
shadow_percentile: float = 0.0  # drop skin pixels below this L* percentile; 0 keeps all, as the paper
highlight_percentile: float = 100.0  # drop skin pixels above this L* percentile; 100 keeps all
face_embedding: str = "dlib"  # dlib (128-d) | insightface (ArcFace 512-d) | none
clip_model: str = "ViT-H-14"  # open_clip architecture
clip_pretrained: str = "laion2b_s32b_b79k"  # open_clip tag, local checkpoint path, or 'tiny' (stand-in)
clip_batch_size: int = 16  # images per CLIP forward pass
device: str = "auto"  # auto | cpu | cuda
batch_size: int = 8  # images per resumable batch
n_overlays: int = 6  # overlays with the mask outline (seeded sample)
limit: int = 0  # process at most this many pending images; 0 means all

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Image as ShowImage
from IPython.display import display

from biasaudit.faces.stage import run_faces, write_overlays
from biasaudit.notebook import banner, stage_params
from biasaudit.stats.homogeneity import homogeneity_gap, similarity_by_bin
from biasaudit.stats.skin_summary import skin_summary

cfg, params = stage_params(
    "faces", detector=detector, dlib_kind=dlib_kind, dlib_upsample=dlib_upsample, dlib_threshold=dlib_threshold, insightface_model=insightface_model,
    insightface_root=insightface_root, det_threshold=det_threshold, det_size=det_size,
    measure_multi_face=measure_multi_face, skin_method=skin_method, bisenet_weights=bisenet_weights,
    bisenet_margin=bisenet_margin, min_skin_pixels=min_skin_pixels, shadow_percentile=shadow_percentile,
    highlight_percentile=highlight_percentile, face_embedding=face_embedding, clip_model=clip_model,
    clip_pretrained=clip_pretrained, clip_batch_size=clip_batch_size, device=device, batch_size=batch_size,
    n_overlays=n_overlays, limit=limit)
banner(cfg)
if model not in cfg.models:
    raise ValueError(f"model '{model}' is not a key of `models:` in params.yaml ({', '.join(cfg.models)})")
overlay_dir = Path(f"reports/t2i/overlays/{model}")
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

# %%
meta = index.merge(faces[["image_id", "L_bin"]], on="image_id", how="left")
for space, matrix in (("clip", clip), ("face", face)):
    rows = meta[meta[f"{space}_row"] >= 0]
    if len(rows) < 2:
        print(f"{space}: fewer than 2 embeddings")
        continue
    X = matrix[rows[f"{space}_row"].to_numpy()]
    print(f"{space} space ({'stand-in' if emb_meta[space]['stand_in'] else 'real'} model), by prompt:")
    display(homogeneity_gap(X, rows["prompt_id"].to_numpy()).round(3))
    bins = rows["L_bin"].where(rows["L_bin"].notna() & (rows["L_bin"] != ""), None).to_numpy()
    if any(b is not None for b in bins):
        print(f"{space} space, mean similarity within L* bins:")
        display(similarity_by_bin(X, bins).round(3))
