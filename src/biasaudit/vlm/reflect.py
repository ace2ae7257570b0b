"""Stage reflect@<vlm>: ask one VLM every REFLECT question about the counterfactual images, on the
stage engine (cached answers, resumable, `retry_failed`, local or Ray, whole or one shard).

A question's record is current while the VLM's settings (spec, prompt version, salary bounds) are
unchanged and its content (the sha256 of its image(s), its prompt text and options) is the same, so
a replaced image re-asks exactly the questions about it. `retry_failed` re-asks the questions whose
API call failed (`answer_status` failed); answers that arrived but did not parse are final.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.pipeline.engine import Stage, StageRun, file_digest, run_stage
from biasaudit.pipeline.provenance import stable_hash
from biasaudit.vlm import tasks

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params import Params
    from biasaudit.params.classify import VLMSpec
    from biasaudit.params.vlm import Reflect

CACHE_DIR = C.VLM_CACHE


def log_path(vlm: str) -> Path:
    return CACHE_DIR / f"{vlm}.responses.jsonl"


def cache_path(vlm: str) -> Path:
    return C.vlm_cache_path(vlm)


def settings_hash(spec: VLMSpec, params: Reflect) -> str:
    """What changes every answer of one VLM (prompt texts are part of each item's content)."""
    return stable_hash([spec.model_dump(), params.prompt_version, params.salary_min, params.salary_max,
                        params.salary_max_tokens], 16)


def item_content(item: dict[str, Any]) -> dict[str, Any]:
    """A question depends on its image bytes (not their paths), its prompt text and its options."""
    images = [item["image_a"], item["image_b"]] if item["kind"] == "2afc" else [item["image"]]
    return {"images": [file_digest(p) for p in images], "prompt": item["prompt"], "options": list(item["options"])}


def api_failed(record: dict[str, Any]) -> bool:
    return record.get("answer_status", record.get("status")) == "failed"


def run_reflect(vlm: str, cfg: Params, images: pd.DataFrame, params: Reflect | None = None, progress: bool = True,
                cache: str | Path | None = None, log: str | Path | None = None) -> dict[str, Any]:
    """Build the questions about `images` (FOCUS manifest rows), ask the pending ones, and return the
    responses table (current records only), the engine's run, the backend description and the
    accounting of this run (from its records: the same under every runner)."""
    from biasaudit.backends.vlm import make_vlm_backend, stage_probe

    params = params or cfg.reflect
    if vlm not in cfg.vlms:
        raise KeyError(f"vlm '{vlm}' is not a key of the vlms: table ({', '.join(sorted(cfg.vlms))})")
    spec = cfg.vlms[vlm]
    cache = Path(cache or cache_path(vlm))
    items = tasks.build_items(images, params)
    price = cfg.classify.prices.get(spec.model_id)
    make_fn = partial(tasks.make_reflect_fn, spec, cache.as_posix(), vlm, params, spec.max_tokens)
    stage = Stage(f"reflect {vlm}", items, "item_id", settings_hash(spec, params), make_fn, log or log_path(vlm),
                  item_content, batch_size=params.batch_size, limit=params.limit,
                  retry_failed=params.retry_failed, retryable=api_failed, counts_tokens=True,
                  code=(registry.module_of("vlm", spec.backend),),  # a code change re-parses cached answers
                  price=price.model_dump(exclude={"per_image"}) if price else None, probe=stage_probe(spec))
    run: StageRun = run_stage(stage, cfg.execution, progress)
    # describe the backend without loading a model when none was built here (nothing pending, or Ray)
    backend = run.made[0].vlm.backend if run.made else make_vlm_backend(spec)
    return {"responses": tasks.responses_frame(run.rows()), "run": run, "summary": run.summary,
            "accounting": run.summary.accounting, "backend": backend.describe(), "execution": run.execution,
            "items": items}
