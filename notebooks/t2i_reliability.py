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
# # Reliability: can the race classifier be trusted?
#
# As in the paper (two human raters, 300 random images), a seeded random sample of classified images
# is exported as an annotation sheet; raters fill one copy each (`<sheets_dir>/<rater>.csv`). We then
# compute Cohen's κ for every rater pair (human–human and human–classifier), Fleiss' κ overall and per
# group one-vs-rest, the human-vs-classifier confusion matrix and the disagreement breakdown, each with
# a bootstrap CI over images. Beyond the paper, the confusion matrix is checked for invertibility
# (condition number); the analysis stage uses it, and the images below, to correct TVD for classifier error.
#
# **With `simulate: true` there are no human raters**: the "raters" are SIMULATED from the classifier
# labels through a known confusion matrix, only to exercise the pipeline. Every output says so.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
from pathlib import Path

import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_table
from biasaudit.pipeline.provenance import run_info
from biasaudit.t2i import reliability as rel

cfg, params = stage_params("reliability")
banner(cfg)
out_dir = C.RELIABILITY_DIR
out_dir.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## The sample and the annotation sheet

# %%
labels, bench = rel.load_inputs(list(cfg.models), cfg.generate.images_dir, cfg.generate.prompts_file,
                               cfg.groups)
sheet = rel.annotation_sheet(labels, params.sample_size, params.sample_seed)
atomic_write_table(sheet, Path(params.sheets_dir) / "annotation_sheet.csv")
print(f"{len(sheet)} of {len(labels)} labelled images sampled → {params.sheets_dir}/annotation_sheet.csv")

# %% [markdown]
# ## Rater labels (human sheets, or SIMULATED raters)

# %%
ratings, provenance = rel.collect_ratings(sheet, labels, params, cfg.seed, cfg.groups)
print(provenance["note"])
display(ratings.head())

# %%
tables = rel.agreement(ratings, list(params.raters), cfg.groups, params.n_boot, params.ci_level, cfg.seed)
for name in ("pairwise_kappa", "mean_kappa", "fleiss_kappa", "confusion", "disagreements"):
    print(name + (" (SIMULATED raters)" if params.simulate else ""))
    display(tables[name].round(3))

# %% [markdown]
# ## Can the classifier's errors be corrected? (beyond the paper)
# The confusion matrix M[human, classifier] and its condition number. The corrected TVD itself is
# computed once, in the analysis stage, with this `correction_method` and a bootstrap over these images.

# %%
correction = rel.correction_diagnostics(ratings, list(params.raters), params.correction_method, cfg.groups,
                                        reference=params.confusion_reference)
print({k: v for k, v in correction.items() if k != "misclassification_matrix"})

# %%
tag = "SIMULATED raters (no humans): tests the pipeline only" if params.simulate else "human raters"
rel.write_outputs(out_dir, tables, ratings, correction, provenance, labels, tag, run_info(params))
summary = rel.summary_json(tables, correction, provenance, labels)
display(pd.Series({k: v for k, v in summary.items() if not isinstance(v, (dict, list))}))
