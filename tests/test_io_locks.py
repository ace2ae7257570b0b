"""One log, several processes: appends are serialised (nothing lost, nothing cut), and a second driver
of a stage stops at once, naming the first."""

import multiprocessing as mp
import os

import pytest

from biasaudit.pipeline.io import DriverLock, RecordLog


def _append(path: str, who: str, n: int, size: int) -> None:
    log = RecordLog(path, "id")
    for i in range(n):
        log.append([{"id": f"{who}-{i}", "payload": "x" * size}])


@pytest.mark.parametrize("size", [3_000, 70_000])
def test_two_processes_appending_to_one_log_lose_nothing(tmp_path, size):
    path = str(tmp_path / "log.jsonl")
    n = 500 if size < 10_000 else 60
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_append, args=(path, who, n, size)) for who in ("a", "b")]
    for p in procs:
        p.start()
    reader = RecordLog(path, "id")
    seen = 0
    while any(p.is_alive() for p in procs):  # a reader during the writes: repairs nothing it should not
        seen = max(seen, len(reader.records()))
    for p in procs:
        p.join()
        assert p.exitcode == 0
    records = RecordLog(path, "id").records()
    assert len(records) == 2 * n and seen <= 2 * n
    assert not reader.torn_path.exists()  # no line was ever taken for torn


def _hold(path: str, ready, release) -> None:
    with DriverLock(path, "stage 'x'"):
        ready.set()
        release.wait(30)


def test_a_second_driver_stops_at_once_naming_the_first(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_hold, args=(str(tmp_path / "log.jsonl"), ready, release))
    first.start()
    assert ready.wait(30)
    with pytest.raises(RuntimeError) as err:
        with DriverLock(tmp_path / "log.jsonl", "stage 'x'"):
            pass
    assert f"pid {first.pid}" in str(err.value) and "already running" in str(err.value)
    release.set()
    first.join()
    with DriverLock(tmp_path / "log.jsonl", "stage 'x'"):  # free again once the first has ended
        assert (tmp_path / "log.jsonl.driver").read_text().startswith(f"pid {os.getpid()}")
