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
# and optionally target attainment by a classifier backend. Thresholds are params; failing edits are
# flagged or excluded from the REFLECT questions (`on_fail`).
#
# First, the checks are themselves checked: synthetic edits of a source photo with known truth must
# pass (a recolour confined to the face) or fail the right check (global colour shift, background
# replaced, blur outside the face, unchanged face).

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import json

import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.io import atomic_write_json, atomic_write_table, atomic_write_text
from biasaudit.notebook import banner, stage_params
from biasaudit.outputs import to_markdown
from biasaudit.provenance import write_run_info
from biasaudit.scale.pool import prestart
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
if params.check_target:
    from biasaudit.backends.vlm import CachedVLM, make_vlm_backend
    from biasaudit.vlm import tasks

    if params.classifier not in cfg.vlms:
        raise KeyError(f"validate_edits.classifier: '{params.classifier}' is not a key of vlms: {sorted(cfg.vlms)}")
    spec = cfg.vlms[params.classifier]
    vlm = CachedVLM(make_vlm_backend(spec), C.vlm_cache_path(params.classifier))
    todo = checks[checks["status"] == "ok"]
    if spec.max_source_units:  # a wiring test (the tiny stand-in) asks about its first photos only
        todo = tasks.first_units(todo, spec.max_source_units)
        print(f"{params.classifier}: max_source_units {spec.max_source_units}, {len(todo)} edits asked")
    att = V.target_attainment(vlm, list(todo["path"]), list(zip(todo["race"], todo["gender"])), params)
    for col in att[0] if att else []:
        checks.loc[todo.index, col] = [a[col] for a in att]
    checks["classifier"] = params.classifier
    checks["classifier_stand_in"] = bool(vlm.backend.stand_in)

checks = pd.DataFrame([V.judge(r, params, r.get("race")) if r["status"] == "ok" else r
                       for r in checks.to_dict("records")])
cols = ["edit_id", "action", "failed_checks", "ssim_outside", "psnr_outside", "delta_e_outside", "delta_e_inside",
        "identity_distance", "skin_L_shift"]
display(checks[[c for c in cols if c in checks]].round(3))

# %% [markdown]
# ## Per target group: failures, and the skin L* shift (skin-lightening shows here)

# %%
ok = checks[checks["status"] == "ok"].copy()
for name in ("ssim_outside", "psnr_outside", "delta_e_outside", "no_face_change", "identity", "target_race",
             "target_gender", "skin_lightening"):
    ok[f"fail_{name}"] = ok["failed_checks"].fillna("").str.split(",").map(lambda xs, n=name: n in xs)
agg = {"n": ("edit_id", "size"), "passed": ("passed", "sum"), "skin_L_shift_mean": ("skin_L_shift", "mean"),
       "delta_e_outside_mean": ("delta_e_outside", "mean"), "ssim_outside_min": ("ssim_outside", "min")}
agg |= {c: (c, "sum") for c in ok.columns if c.startswith("fail_")}
by_group = ok.groupby(["race", "gender"]).agg(**agg).reset_index() if len(ok) else pd.DataFrame()
display(by_group.round(3))

# %%
atomic_write_table(checks, C.EDIT_CHECKS)
for name, table in (("by_group", by_group), ("controls", controls)):
    atomic_write_table(table, report_dir / f"{name}.csv")
    atomic_write_text(report_dir / f"{name}.md", to_markdown(table) if len(table) else "(empty)\n")
summary = {"n_images": int(len(checks)), "n_checked": int(len(ok)), "n_passed": int(ok["passed"].sum()) if len(ok) else 0,
           "actions": checks["action"].value_counts().to_dict(), "controls_as_expected": controls_ok,
           "stand_in": bool(checks["stand_in"].fillna(False).astype(bool).any()),
           "thresholds": params.model_dump(exclude={"race_prompt", "gender_prompt"})}
atomic_write_json(report_dir / "summary.json", summary)
write_run_info(report_dir / "run_info.json", stage="validate_edits")
print(json.dumps(summary, indent=1, default=str))
