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
# # Generate: N seeded images per prompt for one model
#
# DVC runs this notebook once per entry of `models:` in params.yaml (stage `generate@<model>`).
# Each image's seed derives from (model, prompt_id, index), so the same parameters give the same
# images; image `i` of a prompt is `data/t2i/images/<model>/<model>-<prompt_id>-<i:03d>.png`.
#
# The work is resumable: every finished image is one line in `log.jsonl`; kill the stage at any
# moment and re-run it, and it continues where it stopped (images written to a temporary name, then
# renamed; records made with other settings or whose file changed are redone). Refusals,
# safety-filtered (black) images and API failures become rows with a `status` and `reason`;
# `manifest.parquet` lists every image with how it was made (backend, model id and revision, seed,
# library versions). Outputs of the `tiny` and `packaged-photos` backends are **stand-ins**.

# %% tags=["parameters"]
# Only what varies per stage instance (DVC passes the foreach key); every other value comes from
# params.yaml through stage_params (validated), so a run outside DVC reads what `dvc repro` reads.
model: str = "planted-a"  # which entry of `models:` in params.yaml (DVC passes the foreach key)

# %%
import json

import pandas as pd
from IPython.display import display

from biasaudit.notebook import banner, stage_params
from biasaudit.t2i import generate as gen

cfg, params = stage_params("generate")
banner(cfg)
spec = cfg.models.get(model)
if spec is None:
    raise ValueError(f"model: '{model}' is not in models: {sorted(cfg.models)}")
print(f"{model}: backend {spec.backend}, {spec.width}×{spec.height}"
      + (" — STAND-IN (not a real generator)" if spec.stand_in else ""))
display(pd.Series(spec.output_settings(), name=model).to_frame())

# %% [markdown]
# ## Run (resumes from the log; a progress bar shows rate and ETA)
# Parameters are checked first — unknown model, missing local weights, a hub id that is not in the
# local cache while `HF_HUB_OFFLINE=1`, an unset API-key variable — and the stage stops before any work.
# `execution:` in params.yaml says how: the local runner (default) or a Ray actor pool, and whether this
# is one shard of several (`shard_index` of `shard_count`: it then writes only its shard's log and
# images). An unsharded run first merges any shard logs copied into the folder, then does what is left.

# %%
print("execution:", cfg.execution.model_dump())
result = gen.run_generate(model, cfg)
summary = result.summary
print(json.dumps({k: v for k, v in summary.items() if k != "this_run"}, indent=1))
print("this run:", json.dumps(summary["this_run"]))

# %% [markdown]
# ## What was made
# Status per category of prompt; every prompt should have `images_per_prompt` images with status `ok`.

# %%
manifest = result.manifest
if len(manifest):
    manifest["category"] = manifest["prompt_id"].str.split("_").str[0]
    display(manifest.groupby(["category", "status"]).size().unstack(fill_value=0))
    incomplete = summary["prompts"] - summary["prompts_complete"]
    print(f"prompts with fewer than {params.images_per_prompt} ok images: {incomplete}")
    problems = manifest[manifest["status"] != "ok"]
    if len(problems):
        display(problems[["image_id", "status", "reason", "retries"]].head(20))

# %% [markdown]
# ## A look at the first images (one per prompt)

# %%
fig = gen.first_images_figure(manifest, f"{model}: STAND-IN outputs" if spec.stand_in else "")
if fig is not None:
    display(fig)

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
result.run.finish()
