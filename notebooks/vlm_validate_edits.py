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
# # Method B · Validate edits: did only the face change? (beyond the paper)
#
# The paper's referee asked for evidence that the counterfactual edits are clean. For every edit,
# against its source photo and the source's face-region mask: SSIM and PSNR outside the face, mean
# ΔE2000 outside the face (background and clothing kept), ΔE2000 inside (the face did change), identity
# distance of dlib's face descriptors, skin L* shift (editors that lighten dark targets are flagged),
# and optionally target attainment by a classifier backend. Beyond those: the skin seam (ΔE2000 between the
# edited face's skin and the unedited neck / other skin, against the same in the source), LPIPS beside SSIM
# (whole image and outside the face), and human realism ratings (a blinded sheet; agreement and mean realism
# per group once two raters' sheets are back). Thresholds are params; failing edits are flagged or excluded
# from the REFLECT questions (`on_fail`).
#
# First, the checks are themselves checked: synthetic edits of a source photo with known truth must
# pass (a recolour confined to the face) or fail the right check (global colour shift, background
# replaced, blur outside the face, unchanged face).

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%

import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_json, atomic_write_table, atomic_write_text, stable_floats, stable_text
from biasaudit.pipeline.outputs import to_markdown
from biasaudit.pipeline.provenance import write_run_info
from biasaudit.pipeline.scale.pool import prestart
from biasaudit.vlm import realism as R
from biasaudit.vlm import validate as V

cfg, params = stage_params("validate_edits")
banner(cfg)
prestart(cfg.execution, V.PRELOAD)  # the local pool's fork server loads the models while the controls run
manifest = pd.read_parquet(C.FOCUS_DIR / "manifest.parquet")
report_dir = C.EDIT_CHECKS_REPORTS
print(f"{len(manifest)} images, {int((manifest['status'] == 'ok').sum())} edited/imported ok")

# %% [markdown]
# ## Controls: the checks catch bad edits

# %%
first = V.first_source_with_face(manifest, params)
controls = pd.DataFrame(V.run_controls(first, params)) if first is not None else pd.DataFrame()
display(controls)
controls_ok = bool(len(controls)) and bool(controls["as_expected"].all())
print("every control behaved as expected:", controls_ok)

# %% [markdown]
# ## Every edit against its source

# %%
result = V.run_validation(cfg, manifest, params)  # resumable; `execution:` local, local pool or Ray
checks = result["checks"]
print(result["summary"], "| execution:", result["execution"])

# %%
if params.check_target:  # the classifier's race and gender of each edit (resumable on the engine, answers cached)
    checks, target_run = V.run_target_check(cfg, checks, params)
    print(target_run.summary)

checks = V.judge_all(checks, params)  # thresholds judge the measurements: failed checks and the action
cols = ["edit_id", "action", "failed_checks", "ssim_outside", "psnr_outside", "delta_e_outside", "delta_e_inside",
        "identity_distance", "skin_L_shift", "seam_de_neck_edit", "seam_de_relative", "lpips_outside"]
display(checks[[c for c in cols if c in checks]].round(3))

# %% [markdown]
# ## Per target group: failures, and the skin L* shift (skin-lightening shows here)

# %%
ok = checks[checks["status"] == "ok"]
by_group = V.by_group_table(checks)
display(by_group.round(3))

# %% [markdown]
# ## Human ratings: realism and identity consistency (docs/raters.md)
# The stage writes two blank, blinded sheets: realism (every edit and every unedited original, 1–5) and
# identity consistency (every edit beside its original, and as calibrations each original beside itself and
# the null edit beside its original: "could this be the same person?", 1–5; the seed's rebuttal promises
# both). With two raters' filled copies of a sheet back it reports their agreement (quadratic-weighted κ) and
# the mean rating per target group against the calibration.

# %%
sheet_info = R.export_sheets(checks, params.realism_sheets_dir, cfg.seed)
ratings = {m: R.rating_results(params.realism_sheets_dir, params.realism_raters, params.realism_n_boot, cfg.seed, m)
           for m in C.RATING_MEASURES}
rating_tables = {}
for m, res in ratings.items():
    print(f"{m} sheet: {sheet_info[m]['sheet']} ({sheet_info[m]['items']} items) |", res["reason"] or res["note"])
    rating_tables |= res["tables"] or R.empty_tables(res["reason"], m)
for table in rating_tables.values():
    display(table.round(3))

# %%
atomic_write_table(stable_floats(checks), C.EDIT_CHECKS)  # the same bytes on every machine
for stale in [*report_dir.glob("realism_*"), *report_dir.glob("identity_*")]:  # an earlier run's, not written now
    if stale.stem not in rating_tables:
        stale.unlink()
for name, table in (("by_group", by_group), ("controls", controls), *rating_tables.items()):
    atomic_write_table(stable_floats(table), report_dir / f"{name}.csv")
    atomic_write_text(report_dir / f"{name}.md", to_markdown(table) if len(table) else "(empty)\n")
summary = {"n_images": int(len(checks)), "n_checked": int(len(ok)), "n_passed": int(ok["passed"].sum()) if len(ok) else 0,
           "actions": checks["action"].value_counts().to_dict(), "controls_as_expected": controls_ok,
           "stand_in": bool(checks["stand_in"].fillna(False).astype(bool).any()),
           "thresholds": params.model_dump(exclude={"race_prompt", "gender_prompt"}),
           "skin_seam": V.seam_summary(checks), "lpips": V.lpips_summary(checks),
           **{m: {k: v for k, v in res.items() if k != "tables"} | {"sheet": sheet_info[m]} for m, res in ratings.items()}}
atomic_write_json(report_dir / "summary.json", summary)
write_run_info(report_dir / "run_info.json", stage="validate_edits")
print(stable_text(summary))

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
result["run"].finish()
if params.check_target:
    target_run.finish()
