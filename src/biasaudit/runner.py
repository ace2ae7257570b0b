"""Run a batch function over work items, resumably: the local runner every per-image stage uses.

A stage describes its work as a list of item dicts (e.g. one per image to generate or classify)
and a *batch function* `fn(list[item]) -> list[record]` that returns one record per item (with a
`status` and a `reason` when it failed). The runner skips items whose key is already in the
stage's `RecordLog`, keeps only this shard's items, calls `fn` batch by batch with a progress bar,
and appends each batch's records to the log as soon as it returns. The same batch functions run
unchanged under a distributed runner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from biasaudit.io import RecordLog

Item = dict[str, Any]
BatchFn = Callable[[list[Item]], list[Item]]


def shard_of(key: Sequence[Any] | str, n_shards: int) -> int:
    """Stable shard index of a key (independent of Python's hash seed)."""
    text = key if isinstance(key, str) else "\x1f".join(map(str, key))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % n_shards


@dataclass
class RunSummary:
    total: int = 0
    already_done: int = 0
    other_shards: int = 0
    processed: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)

    def count(self, records: list[Item]) -> None:
        for r in records:
            status = str(r.get("status", "ok"))
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        self.processed += len(records)


def pending_items(items: list[Item], log: RecordLog, shard_index: int = 0, shard_count: int = 1,
                  limit: int = 0, retry_failed: bool = False, summary: RunSummary | None = None) -> list[Item]:
    """Items of this shard that the log does not hold yet (failed ones too when `retry_failed`)."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index must be in [0, {shard_count}), got {shard_index}")
    records = log.records()
    done = {k for k, r in records.items() if not (retry_failed and r.get("status") == "failed")}
    summary = summary or RunSummary()
    summary.total = len(items)
    todo = []
    for item in items:
        key = tuple(item[k] for k in log.key)
        if key in done:
            summary.already_done += 1
        elif shard_count > 1 and shard_of(key, shard_count) != shard_index:
            summary.other_shards += 1
        else:
            todo.append(item)
    return todo[:limit] if limit > 0 else todo


def run_local(items: list[Item], fn: BatchFn, log: RecordLog, batch_size: int = 1, shard_index: int = 0,
              shard_count: int = 1, limit: int = 0, retry_failed: bool = False, desc: str = "items",
              progress: bool = True) -> RunSummary:
    """Process the pending items in batches and append each batch's records to `log`."""
    summary = RunSummary()
    todo = pending_items(items, log, shard_index, shard_count, limit, retry_failed, summary)
    with tqdm(total=len(todo), desc=desc, unit="item", disable=not progress, mininterval=1.0) as bar:
        for start in range(0, len(todo), max(1, batch_size)):
            batch = todo[start:start + batch_size]
            records = fn(batch)
            if len(records) != len(batch):
                raise RuntimeError(f"batch function returned {len(records)} records for {len(batch)} items")
            log.append(records)
            summary.count(records)
            bar.update(len(batch))
    return summary
