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
# # Method B · Counterfactuals: edit only the face (FOCUS layout)
#
# Every accepted source photo is edited into the ten target groups (5 races × 2 genders) with one
# instruction template that varies only the target group (params, versioned). Backends: hosted image
# editing (Gemini, any OpenAI-compatible `images/edits`), local diffusers inpainting restricted to the
# dilated, feathered face-region mask and composited so every pixel outside it is the source's own,
# the `tiny` stand-in (offline), or `folder`: import an existing FOCUS-layout dataset without editing.
#
# Each edit is checked at once with the cheap pixel checks of `validate_edits` (as saved, JPEG) and
# regenerated with the next attempt's seed when it fails, up to `max_attempts`. Output:
# `data/vlm/focus/{occupation}/{base_id}/{Race}_{man|woman}.jpg` + `manifest.parquet` (provenance per row).

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.lifecycle import status_record
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_table
from biasaudit.pipeline.provenance import write_run_info
from biasaudit.vlm import focus

cfg, params = stage_params("counterfactuals")
banner(cfg)
out_root = C.FOCUS_DIR
sources_manifest = C.SOURCES_DIR / "manifest.parquet"
sources = pd.read_parquet(sources_manifest) if sources_manifest.exists() else None

# %% [markdown]
# ## Edit (or import)

# %%
manifest, editor_info, summary, run = focus.counterfactuals(cfg, sources, params, out_root)  # import, or edit (resumable)
print(summary)
print(editor_info)
display(manifest.groupby(["occupation", "status"]).size().unstack(fill_value=0))

# %% [markdown]
# ## Attempts and pixel checks per target group (regenerations show where the editor struggles)

# %%
if "attempts" in manifest and manifest["attempts"].notna().any():  # edits made here (an import has none)
    cols = [c for c in ("attempts", "px_ssim_outside", "px_psnr_outside", "px_delta_e_outside", "px_delta_e_inside")
            if c in manifest]
    display(manifest.groupby("group")[cols].mean().round(3))

# %%
atomic_write_table(manifest, out_root / "manifest.parquet")
write_run_info(out_root / "run_info.json", stage="counterfactuals", editor=editor_info, params=params.model_dump(),
               model_lifecycle=status_record(params.model_id, versions=manifest.get("model_version")))

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
if run is not None:  # an imported set has no engine run
    run.finish()
