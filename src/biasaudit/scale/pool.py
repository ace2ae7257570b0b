"""A local process pool for CPU-bound stages (`execution.local_workers`): the same batches as the
serial loop, one batch function per worker process, records handed to the engine's driver-side sink
as each batch finishes (log order may differ; the records do not).

Workers fork from a fork server (a clean process that has only imported the stage's modules, never
run a model thread, so forking it is safe), which makes a worker start in a fraction of a second
after the first pool of a session; where there is no fork server (Windows, macOS defaults aside),
they are spawned. Each worker gets an equal share of the cores for its BLAS / torch threads, so `n`
workers on `n` cores do not oversubscribe them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from biasaudit.work import BatchFn, Item

_FN: BatchFn | None = None
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _init(make_fn: Callable[[], BatchFn], threads: int) -> None:
    global _FN
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")  # a torch imported later reads OMP_NUM_THREADS; importing it here
    if torch is not None:              # would cost a worker of a stage without torch 1.6 s
        torch.set_num_threads(threads)
    _FN = make_fn()


def _call(batch: list[Item]) -> list[Item]:
    assert _FN is not None
    records = _FN(batch)
    if len(records) != len(batch):
        raise RuntimeError(f"batch function returned {len(records)} records for {len(batch)} items")
    return records


def context(preload: tuple[str, ...] = ()) -> mp.context.BaseContext:
    """The fork server (preloading `preload`, e.g. the stage's heavy imports) where there is one, else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["biasaudit.engine", *preload])  # only counts before the server starts
    return ctx


def prestart(execution: Any, preload: tuple[str, ...] = ()) -> None:
    """Start the fork server now, when the `execution:` section makes a CPU-bound stage use the local
    pool (runner local, local_workers > 1), so that its imports and model loads overlap what the driver
    does before the pool (its own model loads, a notebook's controls): a few seconds per stage."""
    if (execution.runner == "local" and int(execution.local_workers or 1) > 1
            and "forkserver" in mp.get_all_start_methods()):
        from multiprocessing import forkserver

        context(preload)
        forkserver.ensure_running()  # returns at once; the server imports in its own process


def run_pool(batches: list[list[Item]], make_fn: Callable[[], BatchFn], sink: Callable[[list[Item]], None],
             workers: int, bar: Any = None, preload: tuple[str, ...] = ()) -> None:
    """Map `batches` over `workers` processes; at most 2 batches in flight per worker."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context(preload), initializer=_init,
                             initargs=(make_fn, threads)) as pool:
        queue = list(reversed(batches))
        running: set = set()
        while queue or running:
            while queue and len(running) < 2 * workers:
                running.add(pool.submit(_call, queue.pop()))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                records = future.result()
                sink(records)
                if bar is not None:
                    bar.update(len(records))
