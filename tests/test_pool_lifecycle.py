"""The local process pool under failure: a worker that dies (SIGKILL as the out-of-memory killer sends
it, a segfault) costs exactly its item a failed record naming the signal, and no process of a stage
outlives its driver, however the driver ends (SIGKILL, SIGTERM, its process group killed), also when
the driver is a notebook kernel started by scripts/run-notebook."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import Stage, run_stage
from biasaudit.pipeline.scale.pool import WorkerDied, run_pool

ROOT = Path(__file__).resolve().parents[1]
MARK = "BIASAUDIT_TEST_PROCESS_MARK"  # every process of a driver under test inherits it


def crash_batch(items):
    for it in items:
        if it.get("die") == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
        if it.get("die") == "segv":
            ctypes.string_at(0)  # a real segmentation fault, as in a native library
        if it.get("die") == "raise":
            raise ValueError(f"item {it['id']} is bad")
    return [{"id": it["id"], "status": "ok", "value": it["id"] * 10} for it in items]


def make_crash():
    return crash_batch


def broken_factory():
    raise OSError("model weights missing")


def test_a_dying_worker_costs_only_its_item(tmp_path):
    die = {5: "kill", 8: "segv"}
    items = [{"id": i, "die": die.get(i, "")} for i in range(11)]
    stage = Stage("crashy", items, "id", "s", make_crash, tmp_path / "log.jsonl", batch_size=4, cpu_bound=True)
    run = run_stage(stage, Execution(local_workers=2), progress=False)
    rows = {r["id"]: r for r in run.rows()}
    assert sorted(rows) == list(range(11)) and run.summary.processed == 11  # every item has one record
    ok = [i for i in range(11) if i not in die]
    assert all(rows[i]["status"] == "ok" and rows[i]["value"] == 10 * i for i in ok)  # the rest went on
    assert rows[5]["status"] == rows[8]["status"] == "failed"
    assert "SIGKILL" in rows[5]["reason"] and "out-of-memory" in rows[5]["reason"]
    assert "SIGSEGV" in rows[8]["reason"]
    assert run.execution["pool"]["worker_deaths"] == 2
    # a record per line, no duplicates: the log holds exactly the 11 items
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == 11


def test_without_a_death_record_the_pool_names_the_item():
    batches = [[{"id": 0, "die": ""}, {"id": 1, "die": "kill"}], [{"id": 2, "die": ""}]]
    with pytest.raises(WorkerDied, match=r"SIGKILL.*'id': 1"):
        run_pool(batches, make_crash, lambda records: None, 2)


def test_errors_in_a_worker_keep_their_type():
    with pytest.raises(ValueError, match="item 3 is bad"):
        run_pool([[{"id": 3, "die": "raise"}], [{"id": 4, "die": ""}]], make_crash, lambda records: None, 2)
    with pytest.raises(OSError, match="model weights missing"):
        run_pool([[{"id": 0}], [{"id": 1}]], broken_factory, lambda records: None, 2)


# --- nothing lingers ---------------------------------------------------------------------------------

def sleep_batch(items):
    Path(os.environ["BIASAUDIT_TEST_BUSY_DIR"], str(os.getpid())).touch()  # "this worker is busy"
    time.sleep(120)
    return [{"id": it["id"], "status": "ok"} for it in items]


def make_sleeper():
    return sleep_batch


def driver() -> None:
    """A stage-like driver: a real pool of 2 workers (fork server, resource tracker) on long batches."""
    stage = Stage("sleepers", [{"id": i} for i in range(6)], "id", "s", make_sleeper,
                  Path(os.environ["BIASAUDIT_TEST_BUSY_DIR"]) / "log.jsonl", cpu_bound=True)
    run_stage(stage, Execution(local_workers=2), progress=False)


def prestarting_driver() -> None:
    """A driver that starts the fork server early (`prestart`, as the faces stage does) with a preload
    that takes a minute to import, and waits."""
    from types import SimpleNamespace

    from biasaudit.pipeline.scale.pool import prestart

    prestart(SimpleNamespace(runner="local", local_workers=2), ("tests.slow_import",))
    time.sleep(120)


def marked(mark: str) -> list[psutil.Process]:
    """Live (not zombie) processes carrying the marker in their environment."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == mark:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def start(cmd: list[str], tmp_path: Path, new_session: bool) -> tuple[subprocess.Popen, str, Path]:
    mark, busy = uuid.uuid4().hex, tmp_path / "busy"
    busy.mkdir()
    env = os.environ | {MARK: mark, "BIASAUDIT_TEST_BUSY_DIR": str(busy),
                        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=new_session,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, mark, busy


def wait_busy(proc: subprocess.Popen, busy: Path, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len([p for p in busy.iterdir() if p.name.isdigit()]) < n:
        assert proc.poll() is None, f"driver exited early ({proc.returncode})"
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.2)


def remaining_after(mark: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while True:
        left = marked(mark)
        if not left or time.monotonic() > deadline:
            return [" ".join(p.cmdline())[:120] for p in left if p.is_running()]
        time.sleep(0.1)


def kill(proc: subprocess.Popen, how: str) -> None:
    if how == "group":
        os.killpg(proc.pid, signal.SIGKILL)  # what killing dvc's process group does
    else:
        os.kill(proc.pid, signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
    proc.wait(timeout=10)


def cleanup(mark: str) -> None:
    for p in marked(mark):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "group"])
def test_no_process_of_a_killed_driver_remains(tmp_path, how):
    proc, mark, busy = start([sys.executable, "-c", "from tests.test_pool_lifecycle import driver; driver()"],
                             tmp_path, new_session=how == "group")
    try:
        wait_busy(proc, busy, 2, timeout=120)
        before = marked(mark)
        # the driver, the fork server, the resource tracker and the two busy workers
        assert len(before) >= 5, [p.cmdline() for p in before]
        kill(proc, how)
        assert remaining_after(mark, 2.0) == []
    finally:
        cleanup(mark)


@pytest.mark.slow
def test_a_fork_server_still_importing_dies_with_its_driver(tmp_path):
    """The fork server watches its "alive" pipe only after its preload imports (seconds for torch):
    without a parent-death signal of its own it outlived a SIGKILLed driver by that long."""
    proc, mark, busy = start([sys.executable, "-c", "from tests.test_pool_lifecycle import prestarting_driver; "
                              "prestarting_driver()"], tmp_path, new_session=False)
    try:
        wait_busy(proc, busy, 1, timeout=60)  # the server is inside the slow import
        server = [p for p in marked(mark) if "forkserver" in " ".join(p.cmdline())]
        assert len(server) == 1 and server[0].ppid() == proc.pid
        kill(proc, "SIGKILL")
        assert remaining_after(mark, 2.0) == []
    finally:
        cleanup(mark)


POOL_CELL = "from tests.test_pool_lifecycle import driver\n\ndriver()\n"
# a kernel busy in a C call that holds the GIL (a native library, here the regex engine on a
# catastrophic pattern): no Python thread of the kernel can run until it returns
GIL_CELL = ("import os, pathlib, re\n\npathlib.Path(os.environ['BIASAUDIT_TEST_BUSY_DIR'], str(os.getpid())).touch()\n"
            "re.match(r'(a+)+$', 'a' * 64 + 'b')\n")


@pytest.mark.slow
@pytest.mark.parametrize("how,cell", [("SIGKILL", "pool"), ("group", "pool"), ("group", "gil")])
def test_no_process_of_a_killed_notebook_run_remains(tmp_path, how, cell):
    """scripts/run-notebook's kernel runs in a session of its own: it and its pool end with the runner,
    also while the kernel holds the GIL."""
    (tmp_path / "nb.py").write_text("# %%\n" + (POOL_CELL if cell == "pool" else GIL_CELL))
    proc, mark, busy = start([sys.executable, "-m", "biasaudit.report.execute", "nb.py", "nb"], tmp_path,
                             new_session=how == "group")
    try:
        wait_busy(proc, busy, 2 if cell == "pool" else 1, timeout=240)
        before = marked(mark)
        kernels = [p for p in before if "biasaudit.report.kernel" in p.cmdline()]
        assert len(kernels) == 1 and kernels[0].ppid() == proc.pid
        assert os.getsid(kernels[0].pid) != os.getsid(proc.pid)  # not reached by a kill of the runner's group
        if cell == "pool":  # runner, kernel, fork server, tracker, 2 workers
            assert len(before) >= 6, [p.cmdline() for p in before]
        kill(proc, how)
        assert remaining_after(mark, 2.0) == []
    finally:
        cleanup(mark)
