"""Rows of a known-truth validation table (Method A and Method B alike): a PLANTED value beside the
audit's estimate and interval, whether the interval covers it, and whether the interval says anything.

An interval at least as wide as the plausible range of its quantity (a share's [0, 1], say) covers the
planted value without telling anything about it: such a row is *uninformative* and is counted apart,
never as covered. `check` rows are estimators beside their own estimand; rows with check False are raw
or paper-style estimates, shown for the size of what the corrections remove.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

COLUMNS = ["quantity", "planted", "estimate", "low", "high", "width", "plausible_range", "covered", "informative",
           "excludes_null", "check", "note"]


def covered(planted: float, low: float, high: float) -> bool:
    return bool(np.isfinite(low) and np.isfinite(high) and low <= planted <= high)


def row(quantity: str, planted: float, estimate: float, low: float, high: float, plausible_range: float,
        note: str = "", check: bool = True, null: float | None = None, **keys: Any) -> dict[str, Any]:
    """One validation row; `keys` are the table's identifying columns (model, task, group, …). `null` is
    the quantity's no-effect value (0.5 for a win rate, 0 for a gap): `excludes_null` says whether the
    interval rules it out, so a table also shows how often its intervals could tell an effect from none."""
    low, high = float(low), float(high)
    width = high - low if np.isfinite(low) and np.isfinite(high) else np.nan
    return {**keys, "quantity": quantity, "planted": float(planted), "estimate": float(estimate), "low": low,
            "high": high, "width": width, "plausible_range": float(plausible_range),
            "covered": covered(planted, low, high),
            "informative": bool(np.isfinite(width) and width < plausible_range),
            "excludes_null": None if null is None or not np.isfinite(width) else not (low <= null <= high),
            "check": bool(check), "note": note}


def summary(table: pd.DataFrame, level: float) -> dict[str, Any]:
    """Counts of a validation table: checks, informative checks and how many of those cover."""
    checks = table[table["check"]]
    info = checks[checks["informative"]]
    return {"rows": len(table), "checks": len(checks), "informative": len(info),
            "uninformative": int(len(checks) - len(info)), "covered": int(info["covered"].sum()),
            "covered_share": float(info["covered"].mean()) if len(info) else None,
            # of the informative checks with a no-effect value, how many intervals exclude it (power)
            "with_null": int(info["excludes_null"].notna().sum()),
            "excludes_null": int(info["excludes_null"].fillna(False).astype(bool).sum()),
            "misses_expected_at_level": round((1 - level) * len(info), 1),
            "median_width_over_range": float((info["width"] / info["plausible_range"]).median()) if len(info) else None}


__all__ = ["COLUMNS", "confusion_array", "covered", "row", "summary"]


def confusion_array(confusion: dict[str, dict[str, float]], groups: tuple[str, ...]) -> np.ndarray:
    """Row-stochastic G×G array M[true, said] from the nested mapping (rows renormalised)."""
    M = np.array([[float(confusion[t].get(c, 0.0)) for c in groups] for t in groups])
    return M / M.sum(axis=1, keepdims=True)
