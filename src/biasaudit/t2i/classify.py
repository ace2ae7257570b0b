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
from typing import Any

import pandas as pd

from biasaudit import UNKNOWN
from biasaudit.backends.vlm import CachedVLM, VLMRequest, VLMResponse, parse_choice
from biasaudit.backends.vlm.parse import is_refusal
from biasaudit.provenance import stable_hash

LABEL_COLUMNS = ["image_id", "model", "prompt_id", "label", "status", "reason", "raw_answer", "backend",
                 "classifier_model_id", "classifier_revision", "instruction_version", "from_cache", "stand_in",
                 "option_probs", "tokens_in", "tokens_out"]


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


def run_key(vlm: CachedVLM, instruction: str, labels: tuple[str, ...]) -> str:
    """Identifies one labelling configuration: names the stage's resumable record log."""
    return stable_hash({"backend": vlm.backend.describe(), "instruction": instruction, "labels": list(labels)})


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
                           "tokens_in": None, "tokens_out": None}
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
                       "tokens_in": response.tokens_in, "tokens_out": response.tokens_out}
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
