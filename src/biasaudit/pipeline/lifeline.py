"""Processes that end with the process that started them.

A stage's helpers (pool workers, the notebook kernel) must not outlive their driver, however it ends
(SIGKILL, SIGTERM, a killed process group). On Linux the kernel does it for us: `die_with_parent`
asks for a signal (SIGKILL) when the parent exits (prctl PR_SET_PDEATHSIG), which needs no Python
thread and so also fires while the process is deep in a C call that holds the GIL. Elsewhere
`watch` is the fallback: a daemon thread that ends the process when a file descriptor held by the
parent (a pipe end, a process sentinel) closes. A helper that the driver starts by exec (the
multiprocessing fork server) learns which process is its driver from `DRIVER_VAR` (`name_driver`,
`die_with_driver`). Imports nothing from the package.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DRIVER_VAR = "BIASAUDIT_LIFELINE_DRIVER"


def die_with_parent(sig: int | None = None) -> bool:
    """Have the OS send `sig` (SIGKILL by default) to this process when its parent exits (Linux; False elsewhere
    or when the request fails). The caller checks afterwards that the parent it expects is still there: a
    parent that died between the fork and this call sends nothing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL if sig is None else sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


FORKS = sys.platform.startswith("linux") and hasattr(os, "fork")  # where fork_tied is used (die_with_parent works)


def fork_tied() -> int:
    """os.fork() whose child dies (SIGKILL) when this process does (die_with_parent, Linux): the value of fork.
    Call it from the main thread: the signal comes when the forking thread ends (see name_driver)."""
    parent = os.getpid()
    pid = os.fork()
    if pid == 0 and die_with_parent(signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)  # the parent ended before the request: nothing would end this child
    return pid


def name_driver() -> None:
    """Name this process, in the environment its next helpers inherit, as the driver they die with.
    Only from the main thread: the OS sends the parent-death signal when the thread that started the
    helper ends, which for another thread may be long before the process does."""
    if threading.current_thread() is threading.main_thread():
        os.environ[DRIVER_VAR] = str(os.getpid())
    else:
        os.environ.pop(DRIVER_VAR, None)


def die_with_driver() -> None:
    """In a helper started by the driver that `name_driver` named: die (SIGKILL) when it exits, and
    exit now if it already has. Does nothing where no driver was named or this is the driver."""
    driver = os.environ.pop(DRIVER_VAR, "")
    if not driver.isdigit() or int(driver) == os.getpid():
        return
    if die_with_parent(signal.SIGKILL) and os.getppid() != int(driver):
        os._exit(1)


def watch(fd: int, code: int = 1) -> threading.Thread:
    """End this process (os._exit(code)) as soon as `fd` becomes readable: EOF of a pipe whose write
    end only the parent holds, or a multiprocessing sentinel. A daemon thread; returns it."""
    from multiprocessing.connection import wait

    def run() -> None:
        wait([fd])
        os._exit(code)

    thread = threading.Thread(target=run, name="lifeline", daemon=True)
    thread.start()
    return thread
