"""Stage classify@<model>: the apparent race of every generated image, one label per image.

Items come from the generate stage's manifest; each becomes a `VLMRequest` (the image, the
instruction from params, the allowed labels) answered through `CachedVLM`, so a re-run never calls
a model again for an image it has already labelled. Answers go through the strict parser: exactly
one allowed label, or `unknown` with a reason; the raw answer is kept.

Row status: ok (one label) | refused (API or textual refusal) | unparsed (off-list, several labels,
empty) | failed (API error after retries, unreadable image; retried on the next run) | skipped
(the image was never generated).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from biasaudit import UNKNOWN, registry
from biasaudit import contracts as C
from biasaudit.backends.vlm import CachedVLM, VLMRequest, VLMResponse, parse_choice
from biasaudit.backends.vlm.parse import is_refusal
from biasaudit.pipeline.engine import file_digest
from biasaudit.pipeline.provenance import stable_hash

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params import Params
    from biasaudit.params.classify import VLMSpec

LABEL_COLUMNS = ["image_id", "model", "prompt_id", "label", "status", "reason", "raw_answer", "backend",
                 "classifier_model_id", "classifier_revision", "instruction_version", "from_cache", "stand_in",
                 "option_probs", "tokens_in", "tokens_out", "model_version",
                 "answered_at"]  # when the classifier answered (kept in the answer cache: provenance.answer_time)


def label_from_response(response: VLMResponse, labels: tuple[str, ...]) -> tuple[str, str, str]:
    """(label, status, reason) for one answer: exactly one allowed label, else unknown + reason."""
    if response.status == "failed":
        return UNKNOWN, "failed", response.reason
    if response.status == "refused":
        return UNKNOWN, "refused", response.reason or "refused"
    label, reason = parse_choice(response.text, labels)
    if label is not None:
        return label, "ok", ""
    return UNKNOWN, ("refused" if reason.startswith("refusal") or is_refusal(response.text) else "unparsed"), reason


def items_from_manifest(manifest: pd.DataFrame) -> list[dict[str, Any]]:
    """One work item per manifest row (the contract of data/t2i/images/<model>/manifest.parquet)."""
    missing = {"image_id", "model", "prompt_id", "path", "status"} - set(manifest.columns)
    if missing:
        raise ValueError(f"manifest lacks columns {sorted(missing)}")
    cols = ["image_id", "model", "prompt_id", "path", "status"] + (["reason"] if "reason" in manifest else [])
    return [{**{k: (None if pd.isna(v) else v) for k, v in row.items()}} for row in manifest[cols].to_dict("records")]


def settings_hash(vlm: CachedVLM, instruction: str, labels: tuple[str, ...], max_tokens: int) -> str:
    """Identifies one labelling configuration (a change redoes every image)."""
    return stable_hash({"backend": vlm.backend.describe(), "instruction": instruction, "labels": list(labels),
                        "max_tokens": max_tokens})


def item_content(item: dict[str, Any]) -> dict[str, Any]:
    """What a label depends on besides the settings: the image's bytes (and whether it was generated)."""
    ok = item.get("status") == "ok" and bool(item.get("path"))
    return {"status": item.get("status"), "image": file_digest(item["path"]) if ok else None}


def make_batch_fn(vlm: CachedVLM, instruction: str, instruction_version: str, labels: tuple[str, ...],
                  max_tokens: int = 16):
    """Batch function for runner.run_local: manifest items → label rows (one per item, in order)."""
    backend = vlm.backend
    labels = tuple(labels)

    def fn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        base = {"backend": backend.name, "classifier_model_id": backend.model_id,
                "classifier_revision": backend.revision, "instruction_version": instruction_version,
                "stand_in": bool(backend.stand_in)}
        rows: list[dict[str, Any] | None] = [None] * len(items)
        todo = []
        for i, item in enumerate(items):
            ident = {"image_id": item["image_id"], "model": item["model"], "prompt_id": item["prompt_id"]}
            if item.get("status") != "ok" or not item.get("path"):
                rows[i] = {**ident, **base, "label": UNKNOWN, "status": "skipped",
                           "reason": f"image not generated: {item.get('status')} {item.get('reason') or ''}".strip(),
                           "raw_answer": None, "from_cache": False, "option_probs": None,
                           "tokens_in": None, "tokens_out": None}
            elif not Path(item["path"]).is_file():
                rows[i] = {**ident, **base, "label": UNKNOWN, "status": "failed", "reason": f"missing file {item['path']}",
                           "raw_answer": None, "from_cache": False, "option_probs": None,
                           "tokens_in": None, "tokens_out": None, "not_asked": True}
            else:
                todo.append(i)
        requests = [VLMRequest(images=(str(items[i]["path"]),), prompt=instruction, options=labels,
                               max_tokens=max_tokens) for i in todo]
        for i, response in zip(todo, vlm.generate(requests)):
            item = items[i]
            label, status, reason = label_from_response(response, labels)
            rows[i] = {"image_id": item["image_id"], "model": item["model"], "prompt_id": item["prompt_id"], **base,
                       "label": label, "status": status, "reason": reason, "raw_answer": response.text,
                       "from_cache": response.from_cache,
                       "option_probs": json.dumps(response.option_probs) if response.option_probs else None,
                       "tokens_in": response.tokens_in, "tokens_out": response.tokens_out,
                       "via": response.meta.get("via", ""), "model_version": response.meta.get("model_version", ""),
                       "answered_at": response.meta.get("answered_at", "")}
            if response.meta.get("model_mismatch"):
                rows[i]["stop_reason"] = response.reason
        return rows  # type: ignore[return-value]

    return fn


def labels_table(records: dict[tuple, dict[str, Any]], items: list[dict[str, Any]]) -> pd.DataFrame:
    """The labels of `items` (manifest order) from the record log; columns in contract order."""
    rows = [records[(it["image_id"],)] for it in items if (it["image_id"],) in records]
    df = pd.DataFrame(rows, columns=LABEL_COLUMNS)
    for col in ("tokens_in", "tokens_out"):
        df[col] = df[col].astype("Int64")
    df["from_cache"] = df["from_cache"].astype(bool)
    df["stand_in"] = df["stand_in"].astype(bool)
    return df


def summary(labels: pd.DataFrame) -> pd.DataFrame:
    """Counts per status and label (what a reader checks first)."""
    return labels.groupby(["status", "label"]).size().rename("images").reset_index()


# --- the stage: local or Ray, whole or one shard -------------------------------------------------

def make_classify_fn(spec: VLMSpec, cache_path: str, price: dict[str, float] | None, instruction: str,
                     instruction_version: str, labels: tuple[str, ...], max_tokens: int, groups: tuple[str, ...],
                     dimension: str = "race"):
    """The batch function built where it runs (a Ray actor): its own backend and its own connection
    to the answer cache. A module-level factory over plain values, so a functools.partial pickles."""
    from biasaudit.backends.vlm import Price, make_vlm_backend

    vlm = CachedVLM(make_vlm_backend(spec, groups, dimension), cache_path, Price(**price) if price else None)
    fn = make_batch_fn(vlm, instruction, instruction_version, labels, max_tokens)
    fn.vlm = vlm  # type: ignore[attr-defined]
    return fn


GENDER_COLUMNS = ("gender", "gender_status", "gender_reason", "gender_raw_answer", "gender_instruction_version")


def classify_gender(model: str, cfg: Params, items: list[dict[str, Any]], price: dict[str, float] | None,
                    progress: bool) -> dict[str, Any]:
    """The second question of classify@<model>: the apparent gender of every image, asked with the gender set's
    own instruction and labels (`benchmarks.gender_set`, groupsets), through the same backend and answer cache
    (a SIMULATED classifier reads the planted gender through `sim_gender_confusion`). Its own record log;
    returns the GENDER_COLUMNS per image_id and the runner summary."""
    from functools import partial

    from biasaudit import groupsets
    from biasaudit.backends.vlm import Price, make_vlm_backend
    from biasaudit.pipeline.engine import Stage, run_stage

    params, ex = cfg.classify, cfg.execution
    gs = groupsets.active(cfg.benchmarks.gender_set)
    genders, instruction, version = gs.labels, gs.classifier.instruction, gs.classifier.version
    backend = make_vlm_backend(params.vlm, genders, "gender")
    vlm = CachedVLM(backend, params.cache_path, Price(**price) if price else None)
    if ex.runner == "ray":
        make_fn = partial(make_classify_fn, params.vlm, params.cache_path, price, instruction, version, genders,
                          params.vlm.max_tokens, genders, "gender")
    else:
        fn = make_batch_fn(vlm, instruction, version, genders, params.vlm.max_tokens)
        make_fn = lambda: fn  # noqa: E731 - the local runner calls it in this process
    stage = Stage(f"classify {model} (apparent gender)", items, "image_id",
                  settings_hash(vlm, instruction, genders, params.vlm.max_tokens), make_fn,
                  C.CLASSIFY_LOGS / f"{model}.gender.jsonl", item_content, batch_size=params.batch_size,
                  limit=params.limit, retry_failed=params.retry_failed, counts_tokens=True, price=price,
                  code=(registry.module_of("vlm", params.vlm.backend),),
                  probe=backend.probe if registry.is_hosted("vlm", params.vlm.backend) else None)
    run = run_stage(stage, ex, progress)
    rows = labels_table(run.current, items)
    columns = pd.DataFrame({"image_id": rows["image_id"], "gender": rows["label"], "gender_status": rows["status"],
                            "gender_reason": rows["reason"], "gender_raw_answer": rows["raw_answer"],
                            "gender_instruction_version": rows["instruction_version"]})
    return {"columns": columns, "summary": run.summary, "run": run}


def run_classify(model: str, cfg: Params, progress: bool = True) -> dict[str, Any]:
    """The whole classify@<model> stage (what the notebook calls). Returns a dict with the labels
    table, the runner summary, the accounting and the backend description; writes
    data/t2i/labels/<model>.parquet (+ .run.json) unless this run is one shard of several."""
    from functools import partial

    from biasaudit.backends.vlm import Price, make_vlm_backend
    from biasaudit.pipeline.engine import Stage, run_stage
    from biasaudit.pipeline.io import atomic_write_table
    from biasaudit.pipeline.provenance import write_run_info

    params, ex = cfg.classify, cfg.execution
    if model not in cfg.models:
        raise ValueError(f"model '{model}' is not in params.yaml models: {sorted(cfg.models)}")
    manifest = pd.read_parquet(C.manifest_path(cfg.generate.images_dir, model))
    out_path = C.labels_path(model)
    labels = tuple(params.labels)
    price = params.prices.get(params.vlm.model_id)
    price_d = price.model_dump(exclude={"per_image"}) if price else None  # token prices (CachedVLM)
    backend = make_vlm_backend(params.vlm, cfg.groups)  # names the run (its revision) and serves the local runner
    vlm = CachedVLM(backend, params.cache_path, Price(**price_d) if price_d else None)
    items = items_from_manifest(manifest)
    if ex.runner == "ray":
        make_fn = partial(make_classify_fn, params.vlm, params.cache_path, price_d, params.instruction,
                          params.instruction_version, labels, params.vlm.max_tokens, cfg.groups)
    else:
        fn = make_batch_fn(vlm, params.instruction, params.instruction_version, labels, params.vlm.max_tokens)
        make_fn = lambda: fn  # noqa: E731 - the local runner calls it in this process
    if params.vlm.batch_mode and ex.runner == "local" and not ex.sharded and not params.limit:
        # batch mode: every pending image of this run in as few batch jobs as the API allows
        vlm.prefetch([VLMRequest(images=(str(i["path"]),), prompt=params.instruction, options=labels,
                                 max_tokens=params.vlm.max_tokens)
                      for i in items if i.get("status") == "ok" and i.get("path") and Path(i["path"]).is_file()])
    stage = Stage(f"classify {model}", items, "image_id",
                  settings_hash(vlm, params.instruction, labels, params.vlm.max_tokens), make_fn,
                  C.CLASSIFY_LOGS / f"{model}.jsonl", item_content, batch_size=params.batch_size,
                  limit=params.limit, retry_failed=params.retry_failed, counts_tokens=True, price=price_d,
                  code=(registry.module_of("vlm", params.vlm.backend),),  # answers come from the cache
                  probe=backend.probe if registry.is_hosted("vlm", params.vlm.backend) else None)
    run = run_stage(stage, ex, progress)
    summary = run.summary
    accounting = summary.accounting | ({"backend_stats": backend.stats} if ex.runner == "local" else {})
    table = labels_table(run.current, items)
    description = backend.describe()
    gender = classify_gender(model, cfg, items, price_d, progress) if cfg.genders else None
    if gender is not None:
        table = table.merge(gender["columns"], on="image_id", how="left")
        accounting = {**accounting, "gender": gender["summary"].accounting}
    if not run.sharded:
        atomic_write_table(table, out_path)
        from biasaudit.lifecycle import status_record

        write_run_info(out_path.with_suffix(".run.json"), model=model, classifier=description,
                       model_lifecycle=status_record(params.vlm.model_id, versions=table.get("model_version")),
                       instruction_version=params.instruction_version, accounting=accounting,
                       stand_in=bool(description.get("stand_in")), runner=vars(summary), execution=run.execution)
    return {"table": table, "summary": summary, "accounting": accounting, "backend": description,
            "execution": run.execution, "out_path": out_path, "run": run}
