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
# # Instruments: are the face detectors and the skin mask biased by skin tone?
#
# An audit whose detector misses dark faces under-counts exactly the images it exists to count, and
# its L* means lean light. This stage measures the instruments themselves on a known truth: the two
# packaged public-domain face photos recoloured to a target skin lightness L* (15 → 75), several
# seeded recolourings per level (photo, crop, flip, hue; the same ones at every level, so levels are
# paired), in two modes — only the skin region recoloured (as the planted generator does) and the
# whole image darkened (a dark face in a dark photo). For each method:
#
# * **dlib HOG** and **dlib CNN (MMOD)**, the packaged real detectors: detection rate (a detection
#   must overlap the true face box), score, and the skin L* measured on the detected face against
#   the target; and the detection rate if a score threshold were applied;
# * the **68-landmark skin mask** on the true face box: L* error, mask area against the true mask;
# * **MediaPipe BlazeFace + 468-point face mesh**, when their `.tflite` files are in
#   `models/mediapipe/` (LiteRT runtime), else the reason why not.
#
# Outputs: `reports/t2i/instruments/sweep.csv` (raw rows), `summary.csv` (per method × mode × L*),
# `dark_rates.csv` (the headline: detection rate at L* ≤ 25 vs above), `instruments.png`.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml (`instruments:`) through stage_params.

# %%
import json

import numpy as np
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_path, atomic_write_json, atomic_write_table
from biasaudit.pipeline.provenance import run_info
from biasaudit.t2i import instruments as ins
from biasaudit.t2i.figures import plot_sweep

cfg, params = stage_params("instruments")
banner(cfg)
out = C.INSTRUMENTS_DIR
out.mkdir(parents=True, exist_ok=True)
levels = list(np.arange(params.L_min, params.L_max + 1e-9, params.L_step))
print(f"{len(levels)} levels × {params.recolourings} recolourings × modes {params.modes}")

# %% [markdown]
# ## The sweep

# %%
sweep = ins.run_sweep(levels, params.recolourings, list(params.modes), params.size, params.crop_factor,
                      params.hog_upsample, params.cnn_upsample, cfg.seed, mediapipe_dir=params.mediapipe_dir
                      if params.mediapipe else None, workers=cfg.execution.local_workers)
status = sweep.attrs.get("methods", {})
print(json.dumps(status, indent=1))
summary = ins.summarize(sweep, list(params.score_thresholds))
display(summary.round(3))

# %% [markdown]
# ## Dark faces: detection rate at L* ≤ dark_max vs above

# %%
dark = ins.dark_rates(summary, params.dark_max)
display(dark.round(3))

# %%
fig = plot_sweep(summary)
atomic_write_table(sweep, out / "sweep.csv")
atomic_write_table(summary, out / "summary.csv")
atomic_write_table(dark, out / "dark_rates.csv")
with atomic_path(C.INSTRUMENTS_FIGURE) as tmp:
    fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
atomic_write_json(out / "summary.json", {"methods": status, "dark_max": params.dark_max,
                                         "dark_rates": dark.to_dict("records"), "run": run_info(params.model_dump())})
display(fig)
