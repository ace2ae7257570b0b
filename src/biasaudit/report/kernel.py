"""The kernel of a stage notebook: ipykernel, bound to the process that runs the notebook.

jupyter_client starts a kernel in a session of its own (so that an interrupt reaches its whole group),
so killing `dvc repro`'s process group, or SIGKILL of `scripts/run-notebook`, would leave it running
the stage (and appending records) with nobody to read them. `report.execute` launches the kernel as
`python -m biasaudit.report.kernel -f <connection file>` instead of `-m ipykernel_launcher`: this asks
the OS for SIGKILL when the parent exits (lifeline.die_with_parent; ipykernel's own parent poller is a
Python thread that polls once a second and cannot run while a C call holds the GIL), then starts
ipykernel exactly as its launcher does. The kernel's pool workers and fork server follow it
(pipeline/scale/pool.py).

debugpy is marked absent before ipykernel is imported: it serves only a front end's visual debugger,
which a stage never attaches, and importing it (ipykernel.debugger) is 0.07 s of every kernel start.
ipykernel then reports `debugger: false` as for an environment without debugpy; cells run the same.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    from biasaudit.pipeline.lifeline import die_with_parent

    parent = int(os.environ.get("JPY_PARENT_PID") or 0)  # set by jupyter_client to the launching process
    if die_with_parent() and parent and os.getppid() != parent:
        os._exit(1)  # the runner died before the request: nobody is left to read this kernel
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]  # as ipykernel_launcher: the kernel's own init_path adds it back
    sys.modules.setdefault("debugpy", None)  # see the module docstring
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
