"""Run a stage's batch function on a Ray cluster with Ray Data (`map_batches` on an actor pool).

The engine (biasaudit.pipeline.engine) decides what is pending and owns the log; this module only maps the
pending items to records. Each actor builds the batch function once with `make_fn()` (loading its
model), then maps batches of items to records. Items and records travel as JSON strings so any
record schema survives Arrow. Every batch of records goes to `sink` (the engine's driver-side
append) as it arrives: a killed worker's batch is retried by Ray and the engine logs it once.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import pandas as pd

from biasaudit.pipeline.work import BatchFn, Item


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


def run_ray(todo: list[Item], make_fn: Callable[[], BatchFn], key: tuple[str, ...],
            sink: Callable[[list[Item]], None], batch_size: int = 1, num_workers: int = 1,
            num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0, address: str | None = None,
            init_kwargs: dict[str, Any] | None = None, bar: Any = None) -> int:
    """Map `todo` through the batch function on an actor pool; returns the number of records sunk."""
    import ray

    if not todo:
        return 0
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
    n = 0
    for out in mapped.iter_batches(batch_format="pandas", batch_size=None):
        records = [json.loads(s) for s in out["record_json"]]
        sink(records)
        n += len(records)
        if bar is not None:
            bar.update(len(records))
    return n
