"""Execute one stage notebook quietly: jupytext percent `.py` → parameters → nbclient → `.ipynb`.

`scripts/run-notebook NOTEBOOK.py NAME [-p|-r|-y ...]` calls `main`. Compared with running the jupytext,
papermill and nbconvert command lines one after the other, it starts one Python process instead of
three, injects the parameters as papermill does without importing papermill (0.7 s of imports, mostly
its cloud I/O handlers), and exports no HTML (the report stage exports every notebook once). The terminal gets one line
when the stage starts and one when it ends (duration, item counts); a failing stage's first line is
its cause (`ParamsError: …`, a missing weight: checked before the start line; a failure inside the
kernel: the end line, right after the start line, which in a terminal it replaces), the traceback
stays in the executed notebook. The kernel is launched first, so that it boots while this process
checks the stage and converts the notebook (`launch_kernel`). The kernel:

- draws with the inline backend, so `display(fig)` stores a PNG in the notebook (not `<Figure …>`);
- writes its own process log (transport warning, the interrupt jupyter_client sends at shutdown) to
  a file, not the terminal; cell output is unaffected;
- shows tqdm bars as text (no ipywidgets warning); in a terminal they are also echoed live, in a log
  as a line every LOG_EVERY_S seconds.
- ends when this process ends, however it ends (`report/kernel.py`), and so do its pool workers.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from biasaudit.report.trail import FORMAT_CHECKERS, skip_imports

INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
LOG_EVERY_S = 30.0  # not a terminal (a log file, CI): a stage's progress bar as one line at most this often
NOTEBOOKS_DIR = Path("reports/notebooks")
_BAR = re.compile(r"\d+%\|")  # a tqdm bar: "45%|████"
_BAR_CLOCK = re.compile(r" \[(?:\d+:)?\d+:\d+<[^\]\n]*\]")  # its " [02:32<00:00,  1.18item/s]": differs every run
_PADDING = re.compile(r"[ \t]+(?=\r|\n|$)")  # a bar line's trailing spaces


# Imported by jupytext and never used by the runner, so marked absent (both imports are optional there):
# - jupyter_server, tornado.web: jupytext's contents managers for JupyterLab, 0.25 s and 0.05 s.
# - jsonschema's optional string-format checkers (report.trail.FORMAT_CHECKERS: rfc3987_syntax, 1.2 s, ...).
UNUSED_IMPORTS = ("jupyter_server", "tornado.web", *FORMAT_CHECKERS)


def skip_unused_imports() -> None:
    """Mark UNUSED_IMPORTS absent in this process (before jupytext is imported); one already imported stays."""
    skip_imports(UNUSED_IMPORTS)


def resolve_type(value: str) -> Any:
    """papermill's `-p` typing: True/False/None, int, float, else the string."""
    if value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value]
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_parameters(args: list[str]) -> dict[str, Any]:
    """papermill's flags: `-p NAME VALUE` (typed), `-r NAME VALUE` (string), `-y YAML` (a mapping)."""
    import yaml

    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("-p", "--parameters", "-r", "--parameters_raw"):
            if i + 2 >= len(args):
                raise SystemExit(f"run-notebook: {flag} needs NAME VALUE")
            name, value = args[i + 1], args[i + 2]
            out[name] = value if flag in ("-r", "--parameters_raw") else resolve_type(value)
            i += 3
        elif flag in ("-y", "--parameters_yaml") and i + 1 < len(args):
            loaded = yaml.safe_load(args[i + 1]) or {}
            if not isinstance(loaded, dict):
                raise SystemExit(f"run-notebook: -y needs a YAML mapping, got {args[i + 1]!r}")
            out.update(loaded)
            i += 2
        else:
            raise SystemExit(f"run-notebook: unexpected argument {flag!r} (use -p/-r NAME VALUE or -y YAML)")
    return out


def kernel_env() -> None:
    """Environment the kernel inherits (set before it starts)."""
    os.environ["MPLBACKEND"] = INLINE_BACKEND
    warn = os.environ.get("PYTHONWARNINGS", "")
    if "IProgress" not in warn:  # tqdm.auto falls back to text bars; the warning says nothing new
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [warn, "ignore:IProgress not found"]))


class BarEcho:
    """Echoes tqdm bars from the notebook's stderr: in a terminal live, on the stage's own line; in a
    log (`live=False`) as a line of its own at most every `every_s` seconds, so a long per-item stage
    (faces, reflect) shows where it is while a short one adds nothing."""

    def __init__(self, stream: TextIO, prefix: str, live: bool = True, every_s: float = LOG_EVERY_S,
                 clock: Any = time.monotonic):
        self.stream, self.prefix, self.shown = stream, prefix, False
        self.live, self.every_s, self.clock = live, every_s, clock
        self.last = clock()

    def write(self, text: str) -> None:
        bars = [part for part in re.split(r"[\r\n]", text) if _BAR.search(part)]
        if not bars:
            return
        width = 118 - len(self.prefix)
        if self.live:
            self.stream.write(f"\r{self.prefix}{bars[-1].strip()[:width]:<{width}}")
            self.stream.flush()
            self.shown = True
        elif self.clock() - self.last >= self.every_s:
            self.stream.write(f"{self.prefix}{bars[-1].strip()[:width]}\n")
            self.stream.flush()
            self.last = self.clock()

    def flush(self) -> None:
        pass

    def clear(self) -> None:
        if self.live and self.shown:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()


KERNEL_MODULE = "biasaudit.report.kernel"  # ipykernel, ended with this process (report/kernel.py)


def kernel_cmd(cmd: list[str]) -> list[str]:
    """The kernelspec's command with `-m ipykernel_launcher` replaced by `-m biasaudit.report.kernel`."""
    cmd = list(cmd)
    for i in range(len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] == "ipykernel_launcher":
            cmd[i + 1] = KERNEL_MODULE
    return cmd


def _quiet_kernel_manager(log: TextIO):
    from jupyter_client.manager import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw: Any) -> None:  # the kernel process's own stderr → log file
            kw.setdefault("stderr", log)
            kw.setdefault("stdout", log)
            await super().start_kernel(**kw)

        def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
            return kernel_cmd(super().format_kernel_cmd(extra_arguments))

        def client(self, **kw: Any) -> Any:
            kc = super().client(**kw)
            kc.wait_for_ready = partial(wait_for_ready, kc)
            return kc

    return QuietKernelManager(kernel_name="python3")


async def wait_for_ready(kc: Any, timeout: float | None = None) -> None:
    """jupyter_client's `wait_for_ready` (kernel_info answered on the shell channel, IOPub connected)
    without its last step, which waits for 0.2 s of silence on IOPub to drop stale messages: 0.2 s idle
    in every stage's start. nbclient takes only the IOPub messages whose parent is its own request
    (msg_id), so a status message left from this check is ignored anyway."""
    from queue import Empty

    deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
    while True:
        kc.kernel_info()
        try:
            msg = await kc.shell_channel.get_msg(timeout=1)
        except Empty:
            msg = None
        if msg is not None and msg["msg_type"] == "kernel_info_reply":
            try:
                await kc.iopub_channel.get_msg(timeout=0.2)  # the reply's own status message: IOPub is connected
            except Empty:
                pass
            else:
                kc._handle_kernel_info_reply(msg)
                return
        if not await kc.is_alive():
            raise RuntimeError("Kernel died before replying to kernel_info")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")


HIST_FILE = ":memory:"  # nbclient's default for the kernel's IPython history (NotebookClient.ipython_hist_file)


def launch_kernel(log: TextIO):
    """Launch the kernel now and return its manager, without waiting for it: it boots (0.5 s of its
    own imports) while this process checks the stage, imports jupytext and converts the notebook. The
    arguments are those nbclient passes when it starts the kernel; given a started kernel, it only
    connects. If the launch fails, the manager comes back without a kernel: nbclient then starts it
    and its error becomes the stage's failure line."""
    from jupyter_core.utils import run_sync

    km = _quiet_kernel_manager(log)
    try:
        run_sync(km.start_kernel)(extra_arguments=[f"--HistoryManager.hist_file={HIST_FILE}"], cwd=".")
    except Exception:
        return _quiet_kernel_manager(log)
    return km


def stop_kernel(km: Any) -> None:
    """Shut down a launched kernel whose notebook will not run (a blocked stage, an unreadable notebook)."""
    if km.has_kernel:
        from jupyter_core.utils import run_sync

        run_sync(km.shutdown_kernel)(now=True)


def stage_outs(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """The `outs` of a dvc.yaml stage (`name` or `name@key` of a foreach), `${key}` filled in."""
    import yaml

    if not stage or not dvc_yaml.exists():
        return []
    name, _, key = stage.partition("@")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the same values, 10x faster
    spec = (yaml.load(dvc_yaml.read_text(), Loader=loader) or {}).get("stages", {}).get(name) or {}
    spec = spec.get("do", spec)
    outs = []
    for out in spec.get("outs", []) or []:
        path = next(iter(out)) if isinstance(out, dict) else out
        outs.append(str(path).replace("${key}", key))
    return outs


def item_counts(paths: list[str]) -> dict[str, int]:
    """Counts per status from the `status` column of the parquet outputs (a file, or a folder's
    manifest.parquet); {} when no output has one."""
    counts: dict[str, int] = {}
    for p in map(Path, paths):
        target = p if p.suffix == ".parquet" else p / "manifest.parquet"
        if not target.is_file():
            continue
        import pyarrow.parquet as pq  # only when there is a table to count

        try:
            schema = pq.read_schema(target)
            if "status" not in schema.names:
                continue
            column = pq.read_table(target, columns=["status"]).column("status").to_pylist()
        except (OSError, ValueError):
            continue
        for status in column:
            counts[str(status)] = counts.get(str(status), 0) + 1
    return counts


def format_counts(counts: dict[str, int]) -> str:
    """' · ok 30 · failed 0 · refused 0', then any other status by name (e.g. ' · no_face 30')."""
    if not counts:
        return ""
    keys = ["ok", "failed", "refused"] + sorted(k for k in counts if k not in ("ok", "failed", "refused"))
    return " · " + " · ".join(f"{k} {counts.get(k, 0)}" for k in keys)


def first_line(ename: str, evalue: str, width: int = 400) -> str:
    """The exception as one line: a multi-line message (ParamsError lists every bad key) is joined."""
    parts = [re.sub(r"^[-*] ", "", line.strip()) for line in (evalue or "").strip().splitlines()]
    text = "; ".join(p for p in parts if p).replace(":;", ":")
    text = text if len(text) <= width else text[: width - 1] + "…"
    return f"{ename}: {text}" if text else ename


def missing_needs(stage: str, cfg: Any = None) -> list[str]:
    """The weights, keys and servers `stage` needs and lacks (biasaudit.weights), one line each with
    its fix; checked before the notebook runs, so a stage without its model fails in a second with the
    fix as its first line while stages that need nothing missing still run."""
    if not stage:
        return []
    from biasaudit.check import describe_need
    from biasaudit.config import ParamsError, load_params
    from biasaudit.weights import missing

    if cfg is None:
        try:
            cfg = load_params()
        except ParamsError:
            return []  # preflight reports it
    return [describe_need(n) for n in missing(cfg, stage=stage) if n.blocks_stage]


def preflight(stage: str) -> str:
    """Why `stage` cannot start, as the one line the terminal shows first ('' = it can): an invalid
    params.yaml (ParamsError naming every bad key; a value the stage's model does not accept), an unreadable
    lifecycle file, or the weights, keys and servers it lacks."""
    if not stage:
        return ""
    from biasaudit.config import ParamsError, load_params
    from biasaudit.lifecycle import LifecycleError, refused_values

    try:
        cfg = load_params()
        refused = refused_values(cfg, stage)  # a value its model does not take: every request would fail alike
        if refused:
            raise ParamsError("invalid parameters:\n  - " + "\n  - ".join(refused))
        lacking = missing_needs(stage, cfg)
    except (ParamsError, LifecycleError) as exc:  # a malformed lifecycle file: its name and line, no traceback
        return first_line(type(exc).__name__, str(exc))
    if lacking:
        from biasaudit.check import plural

        return (f"needs {plural(len(lacking), 'thing')} this machine lacks (not run):\n"
                + "".join(f"  - {line}\n" for line in lacking)).rstrip("\n")
    return ""


def inject_parameters(nb: Any, parameters: dict[str, Any]) -> None:
    """papermill's injection: a cell tagged `injected-parameters` (`name = value` lines) right after
    the cell tagged `parameters` (at the top without one), replacing an earlier injected cell."""
    import nbformat

    if not parameters:
        return
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    where = next((i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), 0)
    nb.cells.insert(where, cell)


def without_clocks(nb: Any) -> None:
    """Drop what differs between two runs of the same code from an executed notebook (a DVC output,
    whose hash dvc.lock records): progress bars' elapsed time and rate, and the spaces tqdm pads a line with
    to cover a longer previous one (its length is the previous rate's). Cells carry no execution timestamps (the
    client does not record them) and the wall time goes to record_run."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and _BAR.search(out.get("text", "")):
                out["text"] = _PADDING.sub("", _BAR_CLOCK.sub("", out["text"]))


def record_run(name: str, stage: str, seconds: float, failure: str, runs_dir: Path | None = None) -> Path:
    """When the stage ran, for how long, at which commit: `reports/runs/<name>.json`, outside every
    tracked output."""
    from datetime import datetime, timezone

    from biasaudit import contracts as C
    from biasaudit.pipeline.io import atomic_write_json
    from biasaudit.pipeline.provenance import git_commit

    path = (runs_dir or C.RUNS_DIR) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, {"stage": stage, "notebook": f"{name}.ipynb", "wall_s": round(seconds, 2),
                                    "status": "failed" if failure else "ok", "reason": failure,
                                    "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "git_commit": git_commit()})


def read_notebook(notebook: Path, parameters: dict[str, Any]) -> Any:
    """The percent `.py` notebook as a notebook node, parameters injected, cell ids by position
    (nbformat draws random ids: the same notebook, the same ids)."""
    import jupytext

    nb = jupytext.read(notebook)
    inject_parameters(nb, parameters)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
    return nb


def _client(nb: Any, km: Any, echo: BarEcho | None):
    from nbclient import NotebookClient

    class Client(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            if echo is not None and msg.get("msg_type") == "stream" and msg["content"].get("name") == "stderr":
                echo.write(msg["content"].get("text", ""))
            return super().output(outs, msg, display_id, cell_index)

    return Client(nb, km=km, kernel_name="python3", timeout=None, startup_timeout=120,
                  coalesce_streams=True, record_timing=False, resources={"metadata": {"path": "."}})


def run(notebook: Path, name: str, parameters: dict[str, Any], stage: str = "",
        out_dir: Path = NOTEBOOKS_DIR, terminal: TextIO = sys.stderr) -> int:
    """Execute `notebook` into `<out_dir>/<name>.ipynb`; returns the exit status (0 ok, 1 failed).
    Parameters are injected as papermill does; the kernel runs through nbclient (papermill's engine)
    without papermill's own import cost."""
    skip_unused_imports()
    kernel_env()
    failure = ""
    with tempfile.TemporaryFile("w+") as log:
        # the kernel boots (0.5-0.8 s) while this process finds the stage's place, checks params.yaml
        # and the weights (0.4 s) and converts the notebook
        km = launch_kernel(log)
        from biasaudit.pipeline.progress import current_position

        where = current_position(stage) if stage else ""  # "9/20": this stage's place in the order dvc repro runs them
        label = f"{where} {stage}" if where else (stage or name)
        start = time.perf_counter()
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / f"{name}.ipynb"
        blocked = preflight(stage)
        if blocked:  # before the start line: a stage that cannot start prints its cause first
            stop_kernel(km)
            terminal.write(f"✗ {label}: {blocked}\n")
            terminal.flush()
            return 1
        from biasaudit.pipeline.keep_outputs import keep_outputs

        kept = keep_outputs(stage, keep=(target,))  # DVC no longer deletes outputs (persist): moved aside here
        tty = terminal.isatty()
        # a terminal keeps one line per stage: the start line, then its live bar, then its end line in place
        terminal.write(f"▶ {label}" + ("" if tty else "\n"))
        terminal.flush()
        echo = BarEcho(terminal, f"▶ {label} ") if tty else BarEcho(terminal, f"  … {label} ", live=False)
        try:
            nb = read_notebook(notebook, parameters)
        except BaseException:
            stop_kernel(km)
            raise
        from nbclient.exceptions import CellExecutionError

        client = _client(nb, km, echo)
        try:
            client.execute()
        except CellExecutionError as exc:
            failure = first_line(exc.ename, exc.evalue)
        except Exception as exc:  # kernel died, bad notebook, ...: its own message, and the kernel's log
            log.seek(0)
            tail = log.read().strip().splitlines()[-5:]
            failure = first_line(type(exc).__name__, str(exc)) + "".join(f"\n  kernel: {t}" for t in tail)
    if tty:
        echo.clear()
        terminal.write("\r\033[K")
    seconds = time.perf_counter() - start
    nb.metadata["biasaudit"] = {"stage": stage or name, "status": "failed" if failure else "ok",
                                "reason": failure, "parameters": parameters}
    without_clocks(nb)
    import nbformat

    nbformat.write(nb, target)
    record_run(name, stage or name, seconds, failure, runs_dir=out_dir.parent / "runs")
    if failure:
        back = kept.restore()  # a failed stage keeps its previous outputs
        if back:
            failure += f"\n  (its previous outputs are kept: {', '.join(p.as_posix() for p in back)})"
    else:
        kept.discard()
    if failure:
        terminal.write(f"✗ {label}: {failure}\n  (failed after {seconds:.1f} s; traceback in {target})\n")
        terminal.flush()
        return 1
    terminal.write(f"✓ {label} {seconds:.1f} s{format_counts(item_counts(stage_outs(stage)))}\n")
    terminal.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run-notebook", add_help=True,
                                     usage="run-notebook NOTEBOOK.py OUTPUT_NAME [-p|-r NAME VALUE] [-y YAML]")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("name")
    args, rest = parser.parse_known_args(argv)
    parameters = parse_parameters(rest)
    return run(args.notebook, args.name, parameters, stage=os.environ.get("DVC_STAGE", ""))


if __name__ == "__main__":
    sys.exit(main())
