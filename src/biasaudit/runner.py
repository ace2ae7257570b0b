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
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
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


# --- one entry point for every per-image stage: local or Ray, whole or one shard ---------------

def shard_log_path(base: str | Path, shard_index: int = 0, shard_count: int = 1) -> Path:
    """The record log of one shard: `log.jsonl` unsharded, `log.shard-02-of-08.jsonl` otherwise."""
    base = Path(base)
    if shard_count <= 1:
        return base
    return base.with_name(f"{base.stem}.shard-{shard_index:02d}-of-{shard_count:02d}{base.suffix}")


def run(items: list[Item], make_fn: Callable[[], BatchFn], log: RecordLog, execution: Any, batch_size: int = 1,
        limit: int = 0, retry_failed: bool = False, desc: str = "items", progress: bool = True) -> RunSummary:
    """Dispatch on `execution.runner` (a params.execution.Execution section); batch_size, limit and
    retry_failed come from the stage's own section.

    `make_fn()` builds the batch function (loads the model). It must be picklable for the Ray runner
    (a module-level function or a functools.partial over one with plain arguments): each actor calls
    it once. Only the caller (the driver) appends to `log`; workers write their own files atomically."""
    common = dict(batch_size=batch_size, shard_index=execution.shard_index, shard_count=execution.shard_count,
                  limit=limit, retry_failed=retry_failed, desc=desc, progress=progress)
    if execution.runner == "ray":
        from biasaudit.scale.ray_runner import run_ray

        ray = execution.ray
        return run_ray(items, make_fn, log, num_workers=ray.num_workers, num_cpus_per_worker=ray.num_cpus_per_worker,
                       num_gpus_per_worker=ray.num_gpus_per_worker, address=ray.address or None, **common)
    # build the model only when there is work: a finished stage's re-run loads nothing
    todo = pending_items(items, log, execution.shard_index, execution.shard_count, limit, retry_failed)
    return run_local(items, make_fn() if todo else _unused, log, **common)


def _unused(items: list[Item]) -> list[Item]:  # pragma: no cover - never called: nothing is pending
    raise RuntimeError("no batch function: nothing was pending")


def shard_logs(base: str | Path) -> list[Path]:
    """The shard logs beside `base` (any shard count), in name order."""
    base = Path(base)
    return sorted(base.parent.glob(f"{base.stem}.shard-[0-9]*-of-[0-9]*{base.suffix}"))


def adopt_shard_logs(log: RecordLog, expected_keys: set[tuple] | None = None) -> dict[str, Any]:
    """Merge every shard log found beside `log.path` into it (an unsharded run after `shard i of n`
    runs whose folders were copied together), then delete the shard logs.

    A key done by several shards (or by a shard and an earlier unsharded run) keeps one record:
    the better status, then the unsharded log's. The merged log is written atomically before any
    shard log is removed, so a kill at any moment loses nothing. Returns merge_logs' report
    (plus `adopted`: the shard log names); items no log holds stay pending for this run."""
    paths = shard_logs(log.path)
    if not paths:
        return {"adopted": []}
    from biasaudit.io import atomic_write_text

    merged, report = merge_records([*paths, log.path], log.key, expected_keys)
    lines = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in merged.values())
    atomic_write_text(log.path, lines)
    for path in paths:
        path.unlink(missing_ok=True)
    return report | {"adopted": [p.name for p in paths]}


def stage_log(base: str | Path, key: str | tuple[str, ...], execution: Any) -> tuple[RecordLog, dict[str, Any]]:
    """The record log a per-image stage writes: its shard's log when sharded; otherwise `base`,
    after adopting any shard logs lying beside it. Returns (log, adoption report)."""
    if execution.shard_count > 1:
        return RecordLog(shard_log_path(base, execution.shard_index, execution.shard_count), key), {"adopted": []}
    log = RecordLog(base, key)
    return log, adopt_shard_logs(log)


# a failed record is the one to replace (it is retried); other statuses are final outcomes (no_face, unparsed …)
STATUS_RANK = {"ok": 0, "refused": 1, "skipped": 2, "failed": 3}
OTHER_RANK = 2


def merge_records(paths: list[str | Path], key: str | tuple[str, ...], expected_keys: set[tuple] | None = None
                  ) -> tuple[dict[tuple, dict[str, Any]], dict[str, Any]]:
    """Union of several shards' record logs, one record per key (records exactly as logged).

    Overlapping shards (a key done twice) keep the better status (ok over refused/failed), then the
    later log; `expected_keys` reports what no shard has done yet (a missing or unfinished shard).
    """
    best: dict[tuple, dict[str, Any]] = {}
    overlaps = 0
    for path in paths:
        for k, record in RecordLog(path, key).records().items():
            if k in best:
                overlaps += 1
                if (STATUS_RANK.get(record.get("status", "ok"), OTHER_RANK)
                        > STATUS_RANK.get(best[k].get("status", "ok"), OTHER_RANK)):
                    continue
            best[k] = record
    report: dict[str, Any] = {"logs": [str(p) for p in paths], "records": len(best), "overlapping": overlaps}
    if expected_keys is not None:
        missing = expected_keys - set(best)
        report["missing"] = len(missing)
        report["missing_examples"] = sorted(map(str, missing))[:10]
    return best, report


def merge_logs(paths: list[str | Path], key: str | tuple[str, ...], expected_keys: set[tuple] | None = None
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """merge_records as a table (one row per key)."""
    best, report = merge_records(paths, key, expected_keys)
    return pd.DataFrame(list(best.values())), report
