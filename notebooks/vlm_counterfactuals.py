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
backend: str = "tiny"  # gemini | openai | diffusers | tiny (stand-in) | folder (import, no editing)
model_id: str = "tiny-face-recolour"  # API model / diffusers inpainting id or path
folder_dir: str = ""  # backend folder: an existing FOCUS-layout dataset
instruction_version: str = "v1"  # bump when the instruction text changes
max_attempts: int = 2  # regenerate an edit failing the pixel checks up to this many attempts in all
seed: int = 20260111  # per-edit seeds derive from (seed, edit_id, attempt)

# %%
from pathlib import Path

import pandas as pd
from IPython.display import display

from biasaudit.io import atomic_write_table
from biasaudit.notebook import banner, stage_params
from biasaudit.provenance import write_run_info
from biasaudit.vlm import focus

cfg, params = stage_params("counterfactuals", backend=backend, model_id=model_id, folder_dir=folder_dir,
                           instruction_version=instruction_version, max_attempts=max_attempts, seed=seed)
banner(cfg)
out_root = Path("data/vlm/focus")
sources = pd.read_parquet("data/vlm/sources/manifest.parquet") if Path("data/vlm/sources/manifest.parquet").exists() else None

# %% [markdown]
# ## Edit (or import)

# %%
if params.backend == "folder":
    manifest = focus.import_focus_folder(params.folder_dir, out_root, "data/vlm/sources")
    editor_info = {"backend": "folder", "model_id": params.folder_dir, "stand_in": False}
else:
    if sources is None or not (sources["status"] == "ok").any():
        raise RuntimeError("no accepted source photos: run the `sources` stage first (data/vlm/sources/manifest.parquet)")
    result = focus.run_edits(cfg, sources, params, out_root)  # resumable; `execution:` local, pool or Ray
    manifest, editor_info = result["manifest"], result["editor"]
    print(result["summary"], "| execution:", result["execution"])
print(editor_info)
display(manifest.groupby(["occupation", "status"]).size().unstack(fill_value=0))

# %% [markdown]
# ## Attempts and pixel checks per target group (regenerations show where the editor struggles)

# %%
if "attempts" in manifest and params.backend != "folder":
    cols = [c for c in ("attempts", "px_ssim_outside", "px_psnr_outside", "px_delta_e_outside", "px_delta_e_inside")
            if c in manifest]
    display(manifest.groupby("group")[cols].mean().round(3))

# %%
atomic_write_table(manifest, out_root / "manifest.parquet")
write_run_info(out_root / "run_info.json", stage="counterfactuals", editor=editor_info, params=params.model_dump())
