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
# # Report: one offline page for everything
#
# Builds `reports/index.html` from what the stages wrote under `reports/`: a profile banner (a
# stand-in run says so in large type), provenance (git commit, params hash, model ids and revisions,
# counts per stage), the headline table, every figure and table of the analysis, the Method B
# outputs in `reports/vlm/`, and links to every executed notebook. No network, no JavaScript;
# all links are relative so the page opens from the file system.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
from IPython.display import Markdown, display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.report import build_index

cfg, params = stage_params("report")
banner(cfg)
index = build_index(C.REPORTS, cfg, title=params.title, max_table_rows=params.max_table_rows,
                    level=cfg.analyze.ci_level)
display(Markdown(f"Wrote `{index}` ({index.stat().st_size / 1024:.0f} KiB)."))
