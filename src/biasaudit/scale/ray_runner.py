"""Run a stage's batch function on a Ray cluster with Ray Data (`map_batches` on an actor pool).

The same batch functions as the local runner: each actor builds the function once with
`make_fn()` (loading its model), then maps batches of items to records. Items and records travel
as JSON strings so any record schema survives Arrow. The driver appends every batch of records to
the stage's `RecordLog` as it arrives, so outputs, resumption and sharding are identical to
`runner.run_local`: a killed worker's batch is retried by Ray and logged once; a killed driver
resumes from the log.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from biasaudit.io import RecordLog
from biasaudit.runner import BatchFn, Item, RunSummary, pending_items


class _BatchActor:
    def __init__(self, make_fn: Callable[[], BatchFn], cwd: str = ""):
        # relative paths (data/t2i/images/…) mean what they mean on the driver: the repository root,
        # on a shared filesystem when the cluster has several nodes
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        self.fn = make_fn()

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        items = [json.loads(s) for s in batch["item_json"]]
        records = self.fn(items)
        if len(records) != len(items):
            raise RuntimeError(f"batch function returned {len(records)} records for {len(items)} items")
        return pd.DataFrame({"record_json": [json.dumps(r, sort_keys=True, default=str) for r in records]})


def run_ray(items: list[Item], make_fn: Callable[[], BatchFn], log: RecordLog, batch_size: int = 1,
            shard_index: int = 0, shard_count: int = 1, limit: int = 0, retry_failed: bool = False,
            desc: str = "items", progress: bool = True, num_workers: int = 1, num_cpus_per_worker: float = 1.0,
            num_gpus_per_worker: float = 0.0, address: str | None = None,
            init_kwargs: dict[str, Any] | None = None) -> RunSummary:
    import ray

    summary = RunSummary()
    todo = pending_items(items, log, shard_index, shard_count, limit, retry_failed, summary)
    if not todo:
        return summary
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    # Blocks are contiguous runs of whole batches, so every actor sees exactly the batches the local
    # runner would make (same batch → same numbers where a model's output depends on its batch), and
    # several blocks per actor keep the pool busy (a repartition would need CPUs the actors hold).
    item_json = [json.dumps(i, sort_keys=True, default=str) for i in todo]
    batch_size = max(1, batch_size)
    n_batches = math.ceil(len(item_json) / batch_size)
    per_block = batch_size * max(1, min(16, math.ceil(n_batches / (4 * max(1, num_workers)))))
    ds = ray.data.from_pandas([pd.DataFrame({"item_json": item_json[b:b + per_block]})
                               for b in range(0, len(item_json), per_block)])
    mapped = ds.map_batches(_BatchActor, fn_constructor_kwargs={"make_fn": make_fn, "cwd": os.getcwd()},
                            batch_size=batch_size, batch_format="pandas",
                            compute=ray.data.ActorPoolStrategy(size=max(1, num_workers)),
                            num_cpus=num_cpus_per_worker, num_gpus=num_gpus_per_worker, max_restarts=3,
                            max_task_retries=3)
    logged: set[tuple] = set()
    with tqdm(total=len(todo), desc=f"{desc} (ray)", unit="item", disable=not progress, mininterval=1.0) as bar:
        for out in mapped.iter_batches(batch_format="pandas", batch_size=None):
            records = [json.loads(s) for s in out["record_json"]]
            # a batch re-run after a worker died must not be logged twice
            records = [r for r in records if tuple(r[k] for k in log.key) not in logged]
            logged.update(tuple(r[k] for k in log.key) for r in records)
            log.append(records)
            summary.count(records)
            bar.update(len(records))
    return summary
