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
# # Prompts: facially neutral proxies
#
# For each category and each group, the `top_k` instances with the highest share of that group
# (at least `min_size` bearers / employed thousands / residents), de-duplicated across groups in the
# order white, black, asian, hispanic, other. Each instance is wrapped in its category's template and
# the style suffix. Occupation names become singular phrases through the reviewed mapping
# `data/reference/occupation_phrases.csv`.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.io import atomic_write_table
from biasaudit.notebook import banner, stage_params
from biasaudit.t2i import prompts as pr

cfg, params = stage_params("prompts")
banner(cfg)
bench_dir = C.BENCHMARKS_DIR

# %%
selected, excluded = {}, []
for category in params.categories:
    bench = pd.read_parquet(bench_dir / f"{category}.parquet")
    if category == "occupation":
        bench, dropped = pr.attach_occupation_phrases(bench, pr.load_occupation_phrases())
        excluded.append(dropped[["instance", "reason"]])
    selected[category] = pr.select_instances(bench, params.top_k, params.min_size[category])
    print(f"{category}: {len(bench):,} candidates ≥ size {params.min_size[category]:,} considered, "
          f"{len(selected[category])} selected")
if excluded:
    print("Occupations excluded by the phrase mapping:")
    display(pd.concat(excluded).reset_index(drop=True))

# %%
prompts = pr.build_prompts(selected, params.templates, params.style_suffix, params.template_version)
display(prompts.groupby(["category", "selected_for"]).size().unstack())
display(prompts[["prompt_id", "selected_for", "prompt", "white", "black", "asian", "hispanic", "other"]].round(3))

# %%
atomic_write_table(prompts, cfg.generate.prompts_file)  # what generate reads
