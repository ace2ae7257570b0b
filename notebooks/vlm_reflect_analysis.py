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
# # Method B · REFLECT analysis
#
# From each VLM's retained answers (status ok): 10×10 win-rate matrices per 2AFC task, race win rates
# within each gender, the position-bias rate, Bradley–Terry strengths with cluster-robust CIs; MCQ
# mean-based percentage gaps Δg vs the reference group (White for race, woman/Female for gender) with
# bracket values from params; salary mean percentage gaps by occupation; significance by OLS with
# errors clustered by source photo (statsmodels) and paired sign-flip permutation tests (scipy).
# Exact definitions: the docstring of `biasaudit/vlm/analysis/__init__.py`. Output: `reports/vlm/`.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%

from biasaudit import contracts as C
from biasaudit.notebook import banner, show, stage_params
from biasaudit.pipeline.io import atomic_write_json, stable_text
from biasaudit.pipeline.outputs import OutputWriter, json_safe
from biasaudit.pipeline.provenance import write_run_info
from biasaudit.vlm.analysis import (
    controls,
    gaps,
    inputs,
    interaction,
    refusals,
    significance,
    summary,
    two_afc,
    validation,
)

cfg, params = stage_params("reflect_analysis")
banner(cfg)
data = inputs.load_inputs(cfg)
if data.missing:
    print("no responses yet for:", data.missing)
writer = OutputWriter(C.VLM_REPORTS)

# %% [markdown]
# ## Each VLM's sections
# With PLANTED truth (offline profile) first the validation: every estimate beside its planted value. Then
# the 2AFC win rates, the gaps Δg of the single-image answers, refusals by group with worst-case bounds,
# their significance (with retention and the primary endpoints), and whether the race effect differs between
# the tasks (task × group interaction). Last the controls: what the null edit alone does to the answers (the
# artefact floor, beside each Δg) and the placebo tasks' group tests, which must find nothing.

# %%
for answers in data.vlms:
    print(f"== {answers.vlm} ({answers.model_id}){answers.tag}")
    show(validation.compute(answers, cfg), writer)
    show(two_afc.compute(answers, cfg), writer)
    show(gaps.compute(answers, cfg), writer)
    show(refusals.compute(answers, cfg), writer)
    show(significance.compute(answers, cfg), writer)
    show(interaction.compute(answers, cfg), writer)
    show(controls.compute(answers, cfg), writer)

# %%
result = summary.compute(data, cfg)
writer.finish(profile=cfg.profile, stand_in=result["stand_in"], method="B (FOCUS/REFLECT)")
atomic_write_json(C.VLM_REPORTS / "summary.json", json_safe(result))
write_run_info(C.VLM_REPORTS / "run_info.json", stage="reflect_analysis")
print(stable_text(json_safe({k: v for k, v in result.items() if k != "edit_checks"}))[:3000])
