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
model: str = "tiny-sd3"  # generator whose images are labelled (the foreach key in dvc.yaml)
instruction_version: str = "v1"  # bump when classify.instruction changes
cache_path: str = "data/t2i/cache/classify.sqlite"  # answer cache shared by all generators (not a DVC output)
batch_size: int = 16  # images per runner batch; API concurrency works inside a batch
limit: int = 0  # label at most this many pending images; 0 means all
retry_failed: bool = True  # re-try images whose call failed in an earlier run

# %%
from pathlib import Path

import pandas as pd
from IPython.display import display

from biasaudit.backends.vlm import CachedVLM, Price, make_vlm_backend
from biasaudit.io import RecordLog, atomic_write_table
from biasaudit.notebook import banner, stage_params
from biasaudit.provenance import write_run_info
from biasaudit.runner import run_local
from biasaudit.t2i import classify as cl

cfg, params = stage_params("classify", instruction_version=instruction_version, cache_path=cache_path,
                           batch_size=batch_size, limit=limit, retry_failed=retry_failed)
banner(cfg)
if model not in cfg.models:
    raise ValueError(f"model '{model}' is not in params.yaml models: {sorted(cfg.models)}")
manifest_path = Path("data/t2i/images") / model / "manifest.parquet"
out_path = Path("data/t2i/labels") / f"{model}.parquet"

# %% [markdown]
# ## The classifier and its instruction
# API keys come only from the environment variable named in `classify.vlm.api_key_env`.

# %%
backend = make_vlm_backend(params.vlm)
price = params.prices.get(backend.model_id)
vlm = CachedVLM(backend, params.cache_path, Price(**price.model_dump()) if price else None)
labels = tuple(params.labels)
print(backend.describe())
print(f"instruction {params.instruction_version}: {params.instruction}")
if backend.stand_in:
    print("STAND-IN classifier (random weights): its labels test the pipeline and mean nothing.")

# %%
manifest = pd.read_parquet(manifest_path)
items = cl.items_from_manifest(manifest)
log = RecordLog(Path("data/t2i/cache/classify") / f"{model}-{cl.run_key(vlm, params.instruction, labels)}.jsonl",
                key="image_id")
fn = cl.make_batch_fn(vlm, params.instruction, params.instruction_version, labels, params.vlm.max_tokens)
summary = run_local(items, fn, log, batch_size=params.batch_size, limit=params.limit,
                    retry_failed=params.retry_failed, desc=f"classify {model}")
print(f"{summary.total} images: {summary.already_done} already labelled in this run's log, "
      f"{summary.processed} processed now {summary.status_counts}")

# %% [markdown]
# ## Accounting
# `calls` are requests that reached the model; `cache_hits` were answered from the cache.

# %%
accounting = vlm.accounting.as_dict() | {"backend_stats": backend.stats}
display(pd.Series(accounting, name=model).to_frame())

# %%
table = cl.labels_table(log.records(), items)
display(cl.summary(table))
display(table.head(10))
atomic_write_table(table, out_path)
write_run_info(out_path.with_suffix(".run.json"), model=model, classifier=backend.describe(),
               instruction_version=params.instruction_version, accounting=accounting,
               stand_in=bool(backend.stand_in), runner=vars(summary))
