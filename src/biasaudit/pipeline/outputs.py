"""Writing analysis results, for both methods: figures (PNG + SVG), tables (CSV + Markdown), plot CSVs,
metrics.json, and a manifest (`reports/t2i/manifest.json`, `reports/vlm/manifest.json`) the HTML report
reads to lay out every section."""

from __future__ import annotations

import math
import os
import pickle
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import check_table
from biasaudit.pipeline.io import (
    atomic_path,
    atomic_write_json,
    atomic_write_table,
    atomic_write_text,
    display_table,
    remove_stale_temporaries,
)
from biasaudit.pipeline.lifeline import FORKS, fork_tied

OK, NO_DATA = "ok", "no data"


@dataclass
class Figure:
    fig: Any  # matplotlib Figure
    title: str
    caption: str


@dataclass
class Result:
    """One section of the analysis: its status, tables, figures and headline metrics."""

    name: str
    title: str
    status: str = OK
    reason: str = ""
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, pd.DataFrame] = field(default_factory=dict)  # CSVs declared as DVC plots
    notes: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, name: str, title: str, status: str, reason: str) -> "Result":
        return cls(name, title, status, reason)


def json_safe(obj: Any) -> Any:
    """JSON-safe: NaN/inf → None, numpy scalars → Python."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def to_markdown(df: pd.DataFrame, digits: int = 3) -> str:
    return display_table(df, digits).to_markdown(index=False) + "\n"


def tight_bbox(fig: Any, dpi: float) -> Any:
    """The bounding box (inches) that savefig's bbox_inches="tight" computes at `dpi`, computed once so
    that the PNG and the SVG share it: "tight" costs each format an extra layout pass over every artist.
    A figure with a layout engine keeps "tight" (its layout runs at save time); the placeholder engine that
    tight_layout() leaves runs nothing, and is dropped: with any engine, savefig measures the figure again
    for every format, whatever box it is given."""
    import matplotlib as mpl
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):
        fig.set_layout_engine(None)
    if fig.get_layout_engine() is not None:
        return "tight"
    saved = fig.dpi
    try:
        fig.dpi = dpi
        fig.draw_without_rendering()  # ticks and text placed, as savefig does before measuring
        pad = mpl.rcParams["savefig.pad_inches"]
        return fig.get_tightbbox().padded(pad, pad)
    finally:
        fig.dpi = saved


def silence() -> None:
    """In a forked child: nothing it writes to stdout or stderr, Python's or C's, reaches the parent's streams (a
    notebook kernel captures file descriptors 1 and 2 into whichever cell runs at that moment)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1), os.dup2(devnull, 2)
    sys.stdout = sys.stderr = open(os.devnull, "w")


class OutputWriter:
    """Writes every Result under `out_dir` (reports/t2i or reports/vlm) and records it in the manifest.
    A table declared in contracts.py must carry its declared columns (ContractError otherwise).

    `processes` > 0 (Linux): each Result's files are written by a forked child process, at most that many at
    once, while the caller goes on (the PNG and SVG writes hold the GIL, so a thread would not help). The child
    holds an exact copy of the Result, so the files are the bytes the caller would have written; `finish` (or
    `wait`) waits for every child and raises with a child's traceback if one failed."""

    def __init__(self, out_dir: str | Path, dpi: int = 150, processes: int = 0):
        self.out = Path(out_dir)
        self.dpi = dpi
        self.sections: list[dict[str, Any]] = []
        self.metrics: dict[str, Any] = {}
        self.processes = processes if FORKS else 0
        if self.out.is_dir():  # a killed stage's writers (children included) leave their temporaries in DVC outputs
            remove_stale_temporaries(self.out)
        self._children: list[tuple[int, int, str]] = []  # (pid, read end of its error pipe, section name)

    def add(self, result: Result) -> dict[str, Any]:
        import matplotlib.pyplot as plt

        entry: dict[str, Any] = {"name": result.name, "title": result.title, "status": result.status,
                                 "reason": result.reason, "notes": result.notes, "figures": [], "tables": []}
        method = "vlm" if self.out.name == C.VLM_REPORTS.name else "t2i"  # reports/vlm: Method B's contracts
        for name, table in result.tables.items():
            check_table(name, list(table.columns), len(table), method)
        for name, table in result.tables.items():
            entry["tables"].append({"name": name, "csv": f"tables/{name}.csv", "md": f"tables/{name}.md",
                                    "rows": len(table)})
        for name, fig in result.figures.items():
            entry["figures"].append({"name": name, "title": fig.title, "caption": fig.caption,
                                     "png": f"figures/{name}.png", "svg": f"figures/{name}.svg"})
        if self.processes and (result.tables or result.figures or result.plots):
            self._fork(result)
        else:
            self._write(result)
        for fig in result.figures.values():
            plt.close(fig.fig)
        if result.metrics:
            self.metrics[result.name] = result.metrics
        self.metrics.setdefault("sections", {})[result.name] = {"status": result.status, "reason": result.reason}
        self.sections.append(entry)
        return entry

    def _write(self, result: Result) -> None:
        """The files of one Result: tables (CSV + Markdown), figures (PNG + SVG), plot CSVs."""
        import matplotlib.pyplot as plt

        for name, table in result.tables.items():
            atomic_write_table(table, self.out / "tables" / f"{name}.csv")
            atomic_write_text(self.out / "tables" / f"{name}.md", to_markdown(table))
        for name, fig in result.figures.items():
            bbox = tight_bbox(fig.fig, self.dpi)
            for ext in ("png", "svg"):
                # no date, and element ids from a fixed salt (random by default): the same figure, the same bytes
                with atomic_path(self.out / "figures" / f"{name}.{ext}") as tmp, \
                        plt.rc_context({"svg.hashsalt": "biasaudit"}):
                    fig.fig.savefig(tmp, format=ext, dpi=self.dpi, bbox_inches=bbox,
                                    metadata={"Date": None} if ext == "svg" else None)
        for name, table in result.plots.items():
            atomic_write_table(table, self.out / "plots" / f"{name}.csv")

    def _fork(self, result: Result) -> None:
        """_write in a forked child (an exact copy of this process: the same bytes), at most `processes` at once."""
        while len(self._children) >= self.processes:
            self._reap(self._children.pop(0))
        read, write = os.pipe()
        try:
            pid = fork_tied()  # the child ends with this process, whatever ends it
        except OSError:  # no memory or process left for a child: write here
            os.close(read), os.close(write)
            return self._write(result)
        if pid == 0:  # the child: write, report a failure through the pipe, never return
            status = 0
            try:
                os.close(read)
                silence()
                self._write(result)
            except BaseException:
                os.write(write, traceback.format_exc().encode()[-60_000:])  # within a pipe's buffer
                status = 1
            finally:
                os._exit(status)
        os.close(write)
        self._children.append((pid, read, result.name))

    @staticmethod
    def _reap(child: tuple[int, int, str]) -> None:
        pid, read, name = child
        status = os.waitpid(pid, 0)[1]
        with os.fdopen(read, "rb") as pipe:
            error = pipe.read().decode(errors="replace")
        if status:
            raise RuntimeError(f"writing section {name!r} failed in its process (status {status}):\n{error}")

    def wait(self) -> None:
        """Wait for every section still being written (processes > 0); raise if one failed."""
        children, self._children = self._children, []
        errors = []
        for child in children:
            try:
                self._reap(child)
            except RuntimeError as exc:
                errors.append(str(exc))
        if errors:
            raise RuntimeError("\n".join(errors))

    def finish(self, expected_plots: dict[str, list[str]] | None = None, **header: Any) -> None:
        """Write metrics.json and manifest.json; declared outputs always exist (empty plot CSVs with
        their header, figures/index.json) so DVC finds them even when a section had no data. Waits for every
        section still being written first."""
        self.wait()
        for name, columns in (expected_plots or {}).items():
            path = self.out / "plots" / f"{name}.csv"
            if not path.exists():
                atomic_write_table(pd.DataFrame(columns=columns), path)
        figures = [f for s in self.sections for f in s["figures"]]
        atomic_write_json(self.out / "figures" / "index.json", json_safe(figures), sort_keys=False)
        atomic_write_json(self.out / "metrics.json", json_safe({**header, **self.metrics}))
        manifest = {**header, "sections": self.sections}
        atomic_write_json(self.out / "manifest.json", json_safe(manifest), sort_keys=False)


class Elsewhere:
    """`steps` (each `step(*args)` → a picklable value, e.g. the Result of a section without figures) computed one
    after the other in a forked child process while this process goes on: the analyze notebook's second core for
    the sections bound to the GIL (t2i.analysis.ELSEWHERE). `result(step)` waits for that step's value (its
    exception: RuntimeError with the child's traceback; its warnings: warned here). The child holds a copy of
    the inputs and of numpy's global generator, and none of these steps draws from the latter, so the values are
    the ones computed here. Create it before any thread of your own (a fork copies only the calling thread). Where
    fork is missing (lifeline.FORKS), `result` computes the step here."""

    def __init__(self, steps: tuple[Callable[..., Any], ...], *args: Any):
        self.steps, self.args = tuple(steps), args
        self.pid, self.reaped, self.done = 0, False, {}
        if not FORKS:
            return
        # per step: an unlinked file for its pickled value (nothing to clean up), a pipe that says it is there
        self.files = [tempfile.TemporaryFile() for _ in steps]
        pipes = [os.pipe() for _ in steps]
        try:
            self.pid = fork_tied()  # the child ends with this process, whatever ends it
        except OSError:  # no memory or process left for a child: `result` computes here
            for file, (read, write) in zip(self.files, pipes):
                file.close(), os.close(read), os.close(write)
            return
        if self.pid == 0:  # the child: each step's (ok, value or traceback, warnings); never returns
            status = 0
            try:
                silence()
                for (read, write), file, step in zip(pipes, self.files, steps):
                    os.close(read)
                    with warnings.catch_warnings(record=True) as caught:
                        try:
                            done = (True, step(*args))
                        except BaseException:
                            done = (False, traceback.format_exc())
                    said = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
                    pickle.dump((*done, said), file, protocol=pickle.HIGHEST_PROTOCOL)
                    file.flush()
                    os.write(write, b"1")
                    os.close(write)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        self.reads = [read for read, _ in pipes]
        for _, write in pipes:
            os.close(write)

    def result(self, step: Callable[..., Any]) -> Any:
        if not self.pid:
            return step(*self.args)
        i = self.steps.index(step)
        if i in self.done:  # a cell run again (interactive use): the value it read the first time
            ok, value = self.done[i]
        else:
            ready = os.read(self.reads[i], 1)
            os.close(self.reads[i])
            with self.files[i] as file:
                file.seek(0)
                ok, value, said = pickle.load(file) if ready else (False, "(the child process ended early)", [])
            if (i == len(self.steps) - 1 or not ready) and not self.reaped:
                status = os.waitpid(self.pid, 0)[1]
                self.reaped = True
                if not ready:
                    value += f" (exit code {os.waitstatus_to_exitcode(status)})"
            self.done[i] = ok, value
            for message, category, filename, lineno in said:  # as if warned here
                warnings.warn_explicit(message, category, filename, lineno)
        if not ok:
            raise RuntimeError(f"{step.__module__}.{step.__qualname__} failed in the child process:\n{value}")
        return value
