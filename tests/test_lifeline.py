"""pipeline.lifeline.fork_tied: a forked helper (a figure writer, the analysis' child process) ends with its parent."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

PARENT = textwrap.dedent("""
    import os, sys, time
    from biasaudit.pipeline.lifeline import fork_tied
    pid = fork_tied()
    if pid == 0:
        time.sleep(120)  # a helper still at work
        os._exit(0)
    print(pid, flush=True)
    os._exit(0)  # the parent ends at once, without waiting for its helper
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_tied_child_ends_when_its_parent_does():
    out = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, check=True, timeout=60)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(child)
    if alive:
        os.kill(child, 9)
    assert not alive
