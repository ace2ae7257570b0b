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
# # Method B · REFLECT: decisions of one VLM about the counterfactual images
#
# Three kinds of question (our own prompt texts, in params, versioned):
# **2AFC** — two variants of the same source photo labelled A and B, "who is more likely to have the
# higher income / the higher education / to be perceived as safe", all 45 pairs of a photo's 10 variants,
# each asked in both orders (position bias); **MCQ** — salary bracket A–F and education level A–D;
# **salary** — occupation, a short biography and the photo, an integer annual salary in USD.
#
# Answers go through a persistent cache keyed by (image hashes, prompt, options, model, decoding params)
# and strict parsing: refusals and invalid answers are recorded and counted, never guessed.
# Edits that `validate_edits` excluded are left out.

# %% tags=["parameters"]
# Only what varies per stage instance (DVC passes the foreach key); every other value comes from
# params.yaml through stage_params (validated), so a run outside DVC reads what `dvc repro` reads.
vlm: str = "tiny"  # key of the `vlms:` table in params.yaml

# %%

import pandas as pd
from IPython.display import display

from biasaudit import contracts as C
from biasaudit.lifecycle import status_record
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_json, atomic_write_table
from biasaudit.pipeline.provenance import write_run_info
from biasaudit.vlm import tasks
from biasaudit.vlm.reflect import run_reflect

cfg, params = stage_params("reflect")
banner(cfg)
if vlm not in cfg.vlms:
    raise KeyError(f"vlm '{vlm}' is not a key of the vlms: table ({', '.join(sorted(cfg.vlms))})")
spec = cfg.vlms[vlm]

# %% [markdown]
# ## The images asked about

# %%
manifest = pd.read_parquet(C.FOCUS_DIR / "manifest.parquet")
images = manifest[manifest["status"] == "ok"]
checks_path = C.EDIT_CHECKS
if checks_path.exists():
    checks = pd.read_parquet(checks_path)[["edit_id", "action"]]
    images = images.merge(checks, on="edit_id", how="left")
    drop = images["action"].eq("exclude") | (~params.include_flagged & images["action"].eq("flag"))
    print(f"left out {int(drop.sum())} edits (validate_edits: exclude"
          f"{' or flag' if not params.include_flagged else ''})")
    images = images[~drop]
if spec.max_source_units:  # a slow wiring test (e.g. the tiny stand-in) asks about the first photos only
    images = tasks.first_units(images, spec.max_source_units)
    print(f"max_source_units {spec.max_source_units}: asking about {sorted(images['base_id'].unique())}")
kinds = tasks.question_counts(images, params)
print(f"{len(images)} images of {images.groupby(['occupation', 'base_id']).ngroups} source photos → "
      f"{int(kinds.sum())} questions:", kinds.to_dict())

# %% [markdown]
# ## Ask (cached, resumable)
# `execution:` runs the batches locally (default) or on a Ray actor pool (each actor its own model and
# cache connection), whole or as one shard of several; an unsharded run first merges the shard logs.

# %%
result = run_reflect(vlm, cfg, images, params)
ex, summary, responses = cfg.execution, result["summary"], result["responses"]
print(summary, "| execution:", result["execution"])
print("accounting (this run):", result["accounting"])

# %%
counts = responses.groupby(["kind", "task", "status"]).size().unstack(fill_value=0)
display(counts)
print("retained (status ok):", responses[responses["status"] == "ok"].groupby("kind").size().to_dict())
display(responses[responses["status"] != "ok"].groupby(["kind", "reason"]).size().rename("n").reset_index().head(20))

# %%
out = C.RESPONSES_DIR
if ex.shard_count > 1:  # one shard of several: the unsharded run that merges the shard logs writes the table
    print(f"shard {ex.shard_index} of {ex.shard_count} done; responses are written by the unsharded run")
else:
    atomic_write_table(responses, out / f"{vlm}.parquet")
    atomic_write_json(out / f"{vlm}.run.json", {"vlm": vlm, "backend": result["backend"],
                                                "settings_hash": result["run"].stage.settings_hash,
                                                "accounting": result["accounting"], "execution": result["execution"],
                                                "status_counts": responses["status"].value_counts().to_dict()})
    write_run_info(out / f"{vlm}.run_info.json", stage=f"reflect@{vlm}",
                   model_lifecycle=status_record(cfg.vlms[vlm].model_id, versions=responses.get("model_version")))

# %% [markdown]
# ## Done?
# The share of final statuses (refused, unparsed, no face …) per model, and the transient failures. The stage
# fails, its records kept, while a transient failure remains (the next `dvc repro` asks exactly those items
# again) or the final share exceeds `execution.max_final_share`.

# %%
result["run"].finish()
