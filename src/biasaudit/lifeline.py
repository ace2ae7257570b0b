"""Processes that end with the process that started them.

A stage's helpers (pool workers, the notebook kernel) must not outlive their driver, however it ends
(SIGKILL, SIGTERM, a killed process group). On Linux the kernel does it for us: `die_with_parent`
asks for a signal (SIGKILL) when the parent exits (prctl PR_SET_PDEATHSIG), which needs no Python
thread and so also fires while the process is deep in a C call that holds the GIL. Elsewhere
`watch` is the fallback: a daemon thread that ends the process when a file descriptor held by the
parent (a pipe end, a process sentinel) closes. Imports nothing from the package.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the OS send `sig` to this process when its parent exits (Linux; False elsewhere or when
    the request fails). The caller checks afterwards that the parent it expects is still there: a
    parent that died between the fork and this call sends nothing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


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
