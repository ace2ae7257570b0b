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
# # Baseline: the homogeneity gap of real portraits (beyond the paper)
#
# The paper reads a high homogeneity gap (images of a group more similar to each other than to the
# rest) as stereotypical repetition by the generator. But face recognisers are less accurate for some
# groups, so even photos of *different real people* of those groups embed closer together. This stage
# measures real portraits per group — `<portraits_dir>/<group>/*.jpg` — with exactly the faces stage's
# detector, skin mask and embedders, and computes their gap per group; the analysis then reports each
# model's gap minus this baseline.
#
# `source: packaged` (offline profile) builds a **STAND-IN** folder from the two packaged public-domain
# photos dealt into group folders at random: it exercises the code, its numbers mean nothing.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
from pathlib import Path

import numpy as np
import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.faces.stage import run_faces
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.engine import finish
from biasaudit.pipeline.io import atomic_write_json, atomic_write_table, stable_floats
from biasaudit.pipeline.provenance import run_info
from biasaudit.stats.homogeneity import homogeneity_table
from biasaudit.t2i import baseline as bl

cfg, params = stage_params("baseline")
banner(cfg)
out = C.BASELINE_DIR
out.mkdir(parents=True, exist_ok=True)
gaps_path = out / "gaps.parquet"
stand_in = params.source == "packaged"

# %% [markdown]
# ## The portraits

# %%
if params.source == "none":
    manifest = pd.DataFrame()
    print("baseline.source is 'none': no real-portrait baseline (set folder and supply portraits).")
else:
    folder = Path(params.portraits_dir)
    if stand_in:
        folder = bl.build_standin_portraits(out / "standin_portraits", cfg.groups, params.standin_per_group,
                                             cfg.seed)
    elif not folder.is_dir():
        raise FileNotFoundError(f"baseline.portraits_dir: {folder} does not exist (expected <group>/<file>.jpg)")
    manifest = bl.portrait_manifest(folder, cfg.groups, stand_in=stand_in)
    atomic_write_table(manifest, out / "manifest.parquet")
    display(manifest.groupby(["group", "status"]).size().rename("portraits").unstack(fill_value=0))

# %% [markdown]
# ## Measure them like generated images, then the gap per group in both spaces

# %%
rows = []
if not manifest.empty:
    result = run_faces(bl.MODEL, cfg, manifest_path=out / "manifest.parquet", faces_path=out / "faces.parquet",
                       emb_dir=out / "embeddings")
    display(result["faces"].groupby("status").size().rename("portraits").to_frame())
    for space in ("clip", "face"):
        matrix = result[space]
        idx, meta = bl.embedding_rows(result["index"], manifest[["image_id", "group"]], space)
        if len(idx) < 2:
            print(f"{space}: fewer than 2 embedded portraits")
            continue
        table = homogeneity_table(np.asarray(matrix[idx]), meta, by="group", within=None, cluster="image_id",
                                  n_boot=params.n_boot, n_perm=params.n_permutations, seed=cfg.seed,
                                  small_group=None)  # no `small` flag: a display threshold, read by analyze
        rows.append(table.assign(space=space, stand_in=stand_in))
gaps = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
    columns=["grouping", "group", "intra", "inter", "gap", "n", "space", "stand_in"])
display(gaps.round(3))

# %%
atomic_write_table(stable_floats(gaps), gaps_path)  # the same bytes on every machine
atomic_write_json(out / "run.json", run_info(params.model_dump()) | {
    "source": params.source, "stand_in": stand_in, "portraits": int(len(manifest)),
    "note": "STAND-IN: packaged photos dealt into group folders" if stand_in else ""})

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
if not manifest.empty:
    finish(result["summary"], result["execution"])
