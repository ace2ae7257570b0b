"""Reading the stages' outputs defensively: a missing file, table or column becomes a reason, never a crash.

Tables are read by their contract (`biasaudit.contracts`: name and columns, the same declaration the
writers are checked against): a table another stage has not written becomes a reason, and a declared
column that is missing becomes "contract broken: … lacks column(s) …", never a guess.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit.contracts import Table

CONTRACT_BROKEN = "contract broken"


@dataclass
class Loaded:
    """A table with where it came from, or the reason it is missing."""

    name: str
    df: pd.DataFrame | None
    path: Path | None = None
    reason: str = ""
    section: str = ""  # the manifest section (Result name) that wrote it, when known

    @property
    def ok(self) -> bool:
        return self.df is not None and len(self.df) > 0


def read_csv(path: Path) -> pd.DataFrame | None:
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError):
        return None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


@dataclass
class Outputs:
    """One analysis folder (reports/t2i or reports/vlm): its manifest sections and tables by name."""

    root: Path
    sections: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> "Outputs":
        manifest = read_json(root / "manifest.json")
        metrics = read_json(root / "metrics.json")
        sections = manifest.get("sections", []) if isinstance(manifest, dict) else []
        return cls(root, [s for s in sections if isinstance(s, dict)], metrics if isinstance(metrics, dict) else {})

    def section(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.sections if s.get("name") == name), None)

    def section_of_table(self, table: str) -> str:
        for s in self.sections:
            if any(t.get("name") == table for t in s.get("tables", [])):
                return str(s.get("name", ""))
        return ""

    def table(self, spec: Table, vlm: str = "", task: str = "", where: str = "") -> Loaded:
        """The table `spec` declares (contracts.py), for one VLM/task where it has placeholders, read from
        tables/ (or `where`): only its declared columns, so code reading an undeclared one fails; a
        declared column that is missing leaves no data and a reason naming it (tests fail on those)."""
        name = spec.of(vlm, task)
        path = (self.root / where / f"{name}.csv") if where else self.root / "tables" / f"{name}.csv"
        if not path.exists():
            return Loaded(name, None, None, self._why_missing((name,)) or f"no table {name} under {self.root}")
        return _checked(spec, name, path, self.section_of_table(name))

    def tables_of(self, spec: Table) -> list[tuple[dict[str, str], Loaded]]:
        """Every written table of a per-VLM contract, with its placeholders' values ({"vlm": …, "task": …})."""
        out = []
        for path in sorted((self.root / "tables").glob("*.csv")):
            parts = spec.parts(path.stem)
            if parts is not None:
                out.append((parts, _checked(spec, path.stem, path, self.section_of_table(path.stem))))
        return out

    def _why_missing(self, names: tuple[str, ...]) -> str:
        if not (self.root / "manifest.json").exists():
            return f"{self.root}/manifest.json not found (the stage has not run)"
        for s in self.sections:
            if s.get("status") != "ok" and any(n.startswith(str(s.get("name", ""))) for n in names):
                return f"section {s.get('name')}: {s.get('status')} — {s.get('reason', '')}"
        return ""


def _checked(spec: Table, name: str, path: Path, section: str = "") -> Loaded:
    df = read_csv(path)
    if df is None:
        return Loaded(name, None, path, f"{path.name} is empty or unreadable")
    missing = spec.missing(list(df.columns)) if len(df) or len(df.columns) else []
    if missing:
        return Loaded(name, None, path, f"{CONTRACT_BROKEN}: {path.name} lacks column(s) {', '.join(missing)} "
                                        "declared in biasaudit/contracts.py")
    df = df[[c for c in (*spec.columns, *spec.optional) if c in df.columns]
            + [c for c in df.columns if spec.prefixes and c not in spec.columns and c not in spec.optional and spec.keeps(c)]]
    return Loaded(name, df, path, "" if len(df) else f"{path.name} has no rows", section)


def num(v: Any) -> float:
    try:
        out = float(v)
    except (TypeError, ValueError):
        return math.nan
    return out


def truthy(v: Any) -> bool:
    """A boolean cell read back from CSV (True / 1 / 1.0 / yes)."""
    return str(v).lower() in ("true", "1", "1.0", "yes")


def fmt(v: Any, digits: int = 3) -> str:
    x = num(v)
    if math.isnan(x):
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
    return f"{x:.{digits}f}"


def ci(est: Any, low: Any = None, high: Any = None, digits: int = 3) -> str:
    e, lo, hi = num(est), num(low), num(high)
    if math.isnan(e):
        return "—"
    if math.isnan(lo) or math.isnan(hi):
        return f"{e:.{digits}f}"
    return f"{e:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def pval(v: Any) -> str:
    x = num(v)
    if math.isnan(x):
        return "—"
    return "<0.001" if x < 0.001 else f"{x:.3f}"
