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
# # Classify: the apparent race of every generated image
#
# Each image of one generator (`data/t2i/images/<model>/manifest.parquet`) is shown to a classifier
# backend (`classify.vlm`: Gemini, an OpenAI-compatible server, a local transformers VLM, CLIP
# zero-shot, a CSV of labels, or a tiny random-weight stand-in) with our versioned instruction and
# the five allowed labels. The answer is parsed strictly: exactly one allowed label, otherwise
# `unknown` with a reason; the raw answer is kept. Every answer is cached in SQLite, keyed by the
# image's sha256, the prompt, the backend, model id, revision and decoding parameters — so a re-run
# makes no model call for an image already labelled, even after a kill.

# %% tags=["parameters"]
# Only what varies per stage instance (DVC passes the foreach key); every other value comes from
# params.yaml through stage_params (validated), so a run outside DVC reads what `dvc repro` reads.
model: str = "planted-a"  # generator whose images are labelled (the foreach key in dvc.yaml)

# %%
import pandas as pd
from IPython.display import display

from biasaudit.notebook import banner, stage_params
from biasaudit.t2i import classify as cl

cfg, params = stage_params("classify")
banner(cfg)
if model not in cfg.models:
    raise ValueError(f"model '{model}' is not in params.yaml models: {sorted(cfg.models)}")
print(f"instruction {params.instruction_version}: {params.instruction}")
print("execution:", cfg.execution.model_dump())

# %% [markdown]
# ## Label every image (cached, resumable)
# API keys come only from the environment variable named in `classify.vlm.api_key_env`. The labels
# log is named by the classifier configuration; `execution:` runs it locally (default) or on a Ray
# actor pool, whole or as one shard of several (an unsharded run first merges the shard logs it finds).

# %%
result = cl.run_classify(model, cfg)
backend = result["backend"]
print(backend)
if backend.get("stand_in"):
    print("STAND-IN classifier (random weights): its labels test the pipeline and mean nothing.")
summary = result["summary"]
print(f"{summary.total} images: {summary.already_done} already labelled in this run's log, "
      f"{summary.processed} processed now {summary.status_counts}")

# %% [markdown]
# ## Accounting
# `calls` are requests that reached the model; `cache_hits` were answered from the cache.

# %%
display(pd.Series(result["accounting"], name=model).to_frame())

# %%
table = result["table"]
display(cl.summary(table))
display(table.head(10))
if result["execution"]["shard_count"] > 1:
    print(f"shard {cfg.execution.shard_index} of {cfg.execution.shard_count}: labels are written by the unsharded run "
          "that merges the shards")
else:
    print(f"written: {result['out_path']}")

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
result["run"].finish()
