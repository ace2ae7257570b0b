"""A local process pool for CPU-bound stages (`execution.local_workers`): the same batches as the
serial loop, one batch function per worker process, records handed to the engine's driver-side sink
as each batch finishes (log order may differ; the records do not).

Workers fork from a fork server (a clean process that has only imported the stage's modules, never
run a model thread, so forking it is safe), which makes a worker start in a fraction of a second
after the first pool of a session; where there is no fork server (Windows, macOS defaults aside),
they are spawned. Each worker gets an equal share of the cores for its BLAS / torch threads, so `n`
workers on `n` cores do not oversubscribe them.

A worker that dies (killed for memory, a segfault in a native library) ends neither the pool nor the
stage: its batch is split into one-item batches that run again on a fresh worker, and a one-item batch
whose worker dies is that item's fault: `on_death(item, reason)` becomes its record (the reason names
the signal), the other items of the batch get their records as usual. Without `on_death` the pool
stops with `WorkerDied`, naming the item.

Nothing outlives the driver: the fork server, before its imports, asks the OS for SIGKILL when the
driver exits (`scale.server_lifeline`); each worker asks the OS for SIGKILL when its parent (the fork server, or
the driver itself when spawned) exits, and closes its copy of the fork server's "alive" pipe, so that
the fork server sees the driver go and exits (it would otherwise wait for the workers, which wait for
it); a watchdog thread on the driver's sentinel covers systems without a parent-death signal. The
resource tracker exits when the last of them has.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import sys
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from biasaudit.pipeline.lifeline import die_with_parent, name_driver, watch
from biasaudit.pipeline.work import BatchFn, Item

_FN: BatchFn | None = None
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


class WorkerDied(RuntimeError):
    """A pool worker died on one item and the caller gave no `on_death` record for it."""


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


def _bind_to_driver() -> None:
    """End this worker with its driver, however the driver ends (see the module docstring)."""
    from multiprocessing import forkserver

    die_with_parent(signal.SIGKILL)
    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)  # only the driver may keep the fork server alive
        except OSError:
            pass
        server._forkserver_alive_fd = None
    parent = mp.parent_process()
    if parent is not None:
        watch(parent.sentinel)
        if not parent.is_alive():  # the driver died before the parent-death signal was asked for
            os._exit(1)


def _send_error(conn: Any, where: str, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    try:
        conn.send(("error", where, exc, text))
    except Exception:  # an exception that does not pickle: its text still tells what happened
        conn.send(("error", where, None, text))


def _worker(conn: Any, make_fn: Callable[[], BatchFn], threads: int) -> None:
    """A worker's life: build the batch function, say so, then one batch at a time until told to stop
    (None) or the driver is gone (EOF)."""
    _bind_to_driver()
    try:
        _init(make_fn, threads)
    except BaseException as exc:
        _send_error(conn, "starting", exc)
        return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        try:
            records = _call(batch)
        except Exception as exc:
            _send_error(conn, "batch", exc)
            continue
        conn.send(("done", records, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def context(preload: tuple[str, ...] = ()) -> mp.context.BaseContext:
    """The fork server (preloading `preload`, e.g. the stage's heavy imports) where there is one, else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    name_driver()  # read by server_lifeline, first in the list: a server importing torch dies with us
    ctx.set_forkserver_preload(["biasaudit.pipeline.scale.server_lifeline", "biasaudit.pipeline.engine", *preload])  # only counts before the server starts
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


def death_reason(exitcode: int | None) -> str:
    """Why a worker ended, in words: the signal that killed it (SIGKILL is what the out-of-memory
    killer sends) or its exit status."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the out-of-memory killer sends SIGKILL)" if -exitcode == signal.SIGKILL else ""
        return f"worker process killed by {name}{hint} while computing this item"
    return f"worker process exited with status {exitcode} while computing this item"


@dataclass(eq=False)
class _Slot:
    proc: Any
    conn: Any
    ready: bool = False  # its batch function is built
    batch: list[Item] | None = None  # the batch it is computing


def run_pool(batches: list[list[Item]], make_fn: Callable[[], BatchFn], sink: Callable[[list[Item]], None],
             workers: int, bar: Any = None, preload: tuple[str, ...] = (),
             on_death: Callable[[Item, str], Item] | None = None) -> dict[str, Any]:
    """Map `batches` over `workers` processes, one batch in flight per worker. Returns how many
    workers were started, how many items were recorded with `on_death`, and the largest peak resident
    memory of a worker (MiB, the OS's high-water mark after its last batch)."""
    ctx = context(preload)
    threads = max(1, (os.cpu_count() or 1) // workers)
    queue: deque[list[Item]] = deque(batches)
    slots: list[_Slot] = []
    report = {"workers_started": 0, "worker_deaths": 0, "worker_peak_rss_mib": 0.0}

    def start() -> None:
        ours, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_worker, args=(theirs, make_fn, threads))  # not daemonic: may have children
        proc.start()
        theirs.close()  # the worker holds the only other end: its EOF is the driver's end
        slots.append(_Slot(proc, ours))
        report["workers_started"] += 1

    try:
        for _ in range(min(workers, len(queue))):
            start()
        while queue or any(s.batch is not None for s in slots):
            for slot in slots:
                if slot.ready and slot.batch is None and queue:
                    batch = queue.popleft()
                    try:
                        slot.conn.send(batch)
                        slot.batch = batch
                    except OSError:  # it died idle: the batch never reached it (wait() below sees it go)
                        queue.appendleft(batch)
            waiting = {s.conn: s for s in slots} | {s.proc.sentinel: s for s in slots}
            for ready in wait(list(waiting)):
                slot = waiting[ready]
                if slot not in slots:  # retired earlier in this round
                    continue
                try:
                    message = slot.conn.recv() if slot.conn.poll() else None
                except (EOFError, OSError):
                    message = None
                if message is None:  # its pipe closed or its sentinel fired: it is gone or going
                    slot.proc.join(timeout=5)
                    if slot.proc.is_alive():
                        slot.proc.kill()
                        slot.proc.join()
                    slots.remove(slot)
                    slot.conn.close()
                    if _died(slot, queue, sink, bar, on_death):
                        report["worker_deaths"] += 1
                    if queue and len(slots) < workers:
                        start()
                elif message[0] == "ready":
                    slot.ready = True
                elif message[0] == "done":
                    slot.batch = None
                    peak = message[2] / 1024  # ru_maxrss is in KiB on Linux
                    report["worker_peak_rss_mib"] = max(report["worker_peak_rss_mib"], round(peak, 1))
                    sink(message[1])
                    if bar is not None:
                        bar.update(len(message[1]))
                else:  # ("error", where, exception or None, traceback text)
                    _, where, exc, text = message
                    if exc is not None:
                        raise exc from RuntimeError(f"in a pool worker ({where}):\n{text}")
                    raise RuntimeError(f"pool worker failed ({where}):\n{text}")
    finally:
        for slot in slots:
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                pass
        for slot in slots:
            slot.proc.join(timeout=5)
            if slot.proc.is_alive():
                slot.proc.kill()
                slot.proc.join(timeout=5)
            slot.conn.close()
    return report


def _died(slot: _Slot, queue: deque, sink: Callable[[list[Item]], None], bar: Any,
          on_death: Callable[[Item, str], Item] | None) -> bool:
    """A worker is gone: before it was ready (the pool cannot work: raise), on a batch of several
    items (each runs again alone, first), or on one item (that item's record is `on_death`; True)."""
    reason = death_reason(slot.proc.exitcode)
    if not slot.ready:
        raise RuntimeError(f"a pool worker died while starting: {reason.removesuffix(' while computing this item')}")
    batch = slot.batch
    if not batch:
        return False
    if len(batch) > 1:
        queue.extendleft([it] for it in reversed(batch))
        return False
    if on_death is None:
        raise WorkerDied(f"{reason}: {batch[0]!r:.300}")
    sink([on_death(batch[0], reason)])
    if bar is not None:
        bar.update(1)
    return True
