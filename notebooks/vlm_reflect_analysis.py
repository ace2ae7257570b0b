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
# Exact definitions: the docstring of `biasaudit/vlm/analysis.py`. Output: `reports/vlm/`.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import json

import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.io import atomic_write_json
from biasaudit.notebook import banner, stage_params
from biasaudit.outputs import OutputWriter, json_safe
from biasaudit.provenance import write_run_info
from biasaudit.vlm import analysis as an
from biasaudit.vlm.recovery import planted_truth, recovery

cfg, params = stage_params("reflect_analysis")
banner(cfg)
names = params.vlms or sorted(cfg.vlms)
paths = {v: C.responses_path(v) for v in names}
missing = [v for v, p in paths.items() if not p.exists()]
if missing:
    print("no responses yet for:", missing)

# %%
writer = OutputWriter(C.VLM_REPORTS)
summary = {"profile": cfg.profile, "vlms": {}}
for v, path in paths.items():
    if not path.exists():
        continue
    responses = pd.read_parquet(path)
    stand_in = bool(responses["stand_in"].fillna(False).astype(bool).any())
    res = an.analyse(responses, params)
    first = responses.iloc[0] if len(responses) else {}
    summary["vlms"][v] = {"model_id": first.get("model_id"), "backend": first.get("backend"), "stand_in": stand_in,
                          "n_questions": res["n_questions"], "status_counts": res["status_counts"],
                          "retained": res["retained"], "position_bias": res["position_bias"],
                          "race_win_rates": res["race_win_rates"], "bradley_terry": res["bradley_terry"],
                          "degenerate": res["degenerate"], "notes": res["notes"]}
    print(f"== {v} ({first.get('model_id')}){' STAND-IN' if stand_in else ''}: retained {res['retained']}")
    display(res["tables"]["retention"])
    if planted_truth(first.get("backend", "")) and v in cfg.vlms:  # PLANTED truth: the validation section
        check = recovery(v, responses, res, cfg.vlms[v].planted, params)
        writer.add(check)
        summary["vlms"][v]["validation"] = check.metrics
        print("  validation:", "; ".join(check.notes[1:]))
        table = check.tables[f"{v}_validation"]
        display(table[table["check"]].groupby("quantity")[["covered", "informative"]].sum())
    for section in an.results_for_vlm(v, res, summary["vlms"][v], stand_in):
        entry = writer.add(section)
        if section.name.endswith("_mcq") and "delta_g" in section.metrics:
            summary["vlms"][v]["delta_g"] = section.metrics["delta_g"]
        print(f"  {section.title}: {entry['status']} {entry['reason']}")
        for name, table in section.tables.items():
            if "winrate" not in name or "race" in name:
                display(table.round(3).head(20))
summary["stand_in"] = any(s["stand_in"] for s in summary["vlms"].values())
edit_summary = C.EDIT_CHECKS_REPORTS / "summary.json"
summary["edit_checks"] = json.loads(edit_summary.read_text()) if edit_summary.exists() else None

# %%
writer.finish(profile=cfg.profile, stand_in=summary["stand_in"], method="B (FOCUS/REFLECT)")
atomic_write_json(C.VLM_REPORTS / "summary.json", json_safe(summary))
write_run_info(C.VLM_REPORTS / "run_info.json", stage="reflect_analysis")
print(json.dumps(json_safe({k: v for k, v in summary.items() if k != "edit_checks"}), indent=1, default=str)[:3000])
