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
# For each category and each group, the `top_k` instances with the highest score share × size^`size_weight`
# of that group (0: by share; 1: by the group's count; the paper profile's 0.1 reproduces the instances the
# paper names; `biasaudit.t2i.prompts` states the rule) among those of at least `min_size` bearers /
# employed thousands / residents, de-duplicated across groups in the
# order of the active group set's labels (the U.S. set: white, black, asian, hispanic, other), or the
# explicit instance list a category of the set gives. Each instance is wrapped in its category's template and
# the style suffix. U.S. occupation names become singular phrases through the reviewed mapping
# `data/reference/occupation_phrases.csv`; where the paper names an occupation, its prompt uses the paper's words
# ("a CEO", "a nail technician": `paper_phrase`, with the seed's line in `paper_line`).

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit import groupsets
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_table
from biasaudit.t2i import prompts as pr

cfg, params = stage_params("prompts")
banner(cfg)
bench_dir = C.BENCHMARKS_DIR
gs, _ = groupsets.load(cfg.benchmarks.group_set)  # the active group set: its labels are the prompts' columns

# %%
selected, excluded = {}, []
for category in params.categories:
    bench = pd.read_parquet(bench_dir / f"{category}.parquet")
    spec = gs.categories.get(category)
    if category == "occupation" and spec is not None and spec.builder:  # the U.S. BLS names
        bench, dropped = pr.attach_occupation_phrases(bench, pr.load_occupation_phrases())
        excluded.append(dropped[["instance", "reason"]])
    if spec is not None and spec.instances:
        selected[category] = pr.select_listed(bench, spec.instances, gs.labels)
    else:
        selected[category] = pr.select_instances(bench, params.top_k, params.min_size[category], gs.labels,
                                                 params.size_weight)
    print(f"{category}: {len(bench):,} candidates ≥ size {params.min_size[category]:,} considered, "
          f"{len(selected[category])} selected")
if excluded:
    print("Occupations excluded by the phrase mapping:")
    display(pd.concat(excluded).reset_index(drop=True))

# %% [markdown]
# ## How much the selection rule matters
# The rule is fitted: share × size^`size_weight` with the paper profile's floors is the reading that selects every
# instance the paper names (docs/prompts.md gives the region of weights and floors that does). Beside it, the
# share rule (`size_weight` 0, the default floors): per category, the benchmark entropy, the mean share of the
# group each instance was selected for, the category's mean benchmark mix, the instances both select, and the TVD
# between the two rules' mean benchmark mixes (how far a category-level TVD's yardstick moves with the rule).

# %%
ranked = {c: b for c, b in ((c, pd.read_parquet(bench_dir / f"{c}.parquet")) for c in selected)
          if not (gs.categories.get(c) is not None and gs.categories[c].instances)}
if "occupation" in ranked and gs.categories.get("occupation") is not None and gs.categories["occupation"].builder:
    ranked["occupation"] = pr.attach_occupation_phrases(ranked["occupation"], pr.load_occupation_phrases())[0]
share_rule = {}
for category, bench in ranked.items():
    try:
        share_rule[category] = pr.select_instances(bench, params.top_k, pr.SHARE_RULE["min_size"].get(
            category, params.min_size[category]), gs.labels, pr.SHARE_RULE["size_weight"])
    except ValueError as exc:  # too few instances above the share rule's floor: said, not hidden
        print(f"{category}: no share-rule selection ({exc})")
sensitivity = pr.selection_sensitivity(
    {"share rule": share_rule, f"this run (size_weight {params.size_weight:g})": {c: selected[c] for c in share_rule}},
    gs.labels)
display(sensitivity.round(3))

# %%
prompts = pr.build_prompts(selected, params.templates, params.style_suffix, params.template_version, gs.labels)
display(prompts.groupby(["category", "selected_for"]).size().unstack())
display(prompts[["prompt_id", "selected_for", "prompt", *gs.labels]].round(3))

# %%
atomic_write_table(prompts, cfg.generate.prompts_file)  # what generate reads
