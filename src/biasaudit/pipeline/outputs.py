"""Writing analysis results, for both methods: figures (PNG + SVG), tables (CSV + Markdown), plot CSVs,
metrics.json, and a manifest (`reports/t2i/manifest.json`, `reports/vlm/manifest.json`) the HTML report
reads to lay out every section."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import check_table
from biasaudit.pipeline.io import atomic_path, atomic_write_json, atomic_write_table, atomic_write_text, stable_table

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
    """The table as Markdown at `digits` decimals, from the floats its CSV holds (`stable_table`); a value that
    rounds to zero is written "0", never "-0" (the sign of a residue such as -3e-9 is the CPU kernel's)."""
    rounded = stable_table(df).round(digits)
    floats = rounded.select_dtypes("float").columns
    rounded[floats] = rounded[floats] + 0.0  # -0.0 + 0.0 is +0.0
    return rounded.to_markdown(index=False) + "\n"


def tight_bbox(fig: Any, dpi: float) -> Any:
    """The bounding box (inches) that savefig's bbox_inches="tight" computes at `dpi`, computed once so
    that the PNG and the SVG share it: "tight" costs each format an extra layout pass over every artist.
    A figure with a layout engine keeps "tight" (its layout runs at save time)."""
    import matplotlib as mpl

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


class OutputWriter:
    """Writes every Result under `out_dir` (reports/t2i or reports/vlm) and records it in the manifest.
    A table declared in contracts.py must carry its declared columns (ContractError otherwise)."""

    def __init__(self, out_dir: str | Path, dpi: int = 150):
        self.out = Path(out_dir)
        self.dpi = dpi
        self.sections: list[dict[str, Any]] = []
        self.metrics: dict[str, Any] = {}

    def add(self, result: Result) -> dict[str, Any]:
        import matplotlib.pyplot as plt

        entry: dict[str, Any] = {"name": result.name, "title": result.title, "status": result.status,
                                 "reason": result.reason, "notes": result.notes, "figures": [], "tables": []}
        method = "vlm" if self.out.name == C.VLM_REPORTS.name else "t2i"  # reports/vlm: Method B's contracts
        for name, table in result.tables.items():
            check_table(name, list(table.columns), len(table), method)
        for name, table in result.tables.items():
            csv = atomic_write_table(table, self.out / "tables" / f"{name}.csv")
            md = atomic_write_text(self.out / "tables" / f"{name}.md", to_markdown(table))
            entry["tables"].append({"name": name, "csv": csv.relative_to(self.out).as_posix(),
                                    "md": md.relative_to(self.out).as_posix(), "rows": len(table)})
        for name, fig in result.figures.items():
            paths = {}
            bbox = tight_bbox(fig.fig, self.dpi)
            for ext in ("png", "svg"):
                target = self.out / "figures" / f"{name}.{ext}"
                target.parent.mkdir(parents=True, exist_ok=True)
                # no date, and element ids from a fixed salt (random by default): the same figure, the same bytes
                with atomic_path(target) as tmp, plt.rc_context({"svg.hashsalt": "biasaudit"}):
                    fig.fig.savefig(tmp, format=ext, dpi=self.dpi, bbox_inches=bbox,
                                    metadata={"Date": None} if ext == "svg" else None)
                paths[ext] = target.relative_to(self.out).as_posix()
            plt.close(fig.fig)
            entry["figures"].append({"name": name, "title": fig.title, "caption": fig.caption, **paths})
        for name, table in result.plots.items():
            atomic_write_table(table, self.out / "plots" / f"{name}.csv")
        if result.metrics:
            self.metrics[result.name] = result.metrics
        self.metrics.setdefault("sections", {})[result.name] = {"status": result.status, "reason": result.reason}
        self.sections.append(entry)
        return entry

    def finish(self, expected_plots: dict[str, list[str]] | None = None, **header: Any) -> None:
        """Write metrics.json and manifest.json; declared outputs always exist (empty plot CSVs with
        their header, figures/index.json) so DVC finds them even when a section had no data."""
        for name, columns in (expected_plots or {}).items():
            path = self.out / "plots" / f"{name}.csv"
            if not path.exists():
                atomic_write_table(pd.DataFrame(columns=columns), path)
        figures = [f for s in self.sections for f in s["figures"]]
        atomic_write_json(self.out / "figures" / "index.json", json_safe(figures), sort_keys=False)
        atomic_write_json(self.out / "metrics.json", json_safe({**header, **self.metrics}))
        manifest = {**header, "sections": self.sections}
        atomic_write_json(self.out / "manifest.json", json_safe(manifest), sort_keys=False)
