"""Total Variation Distance between group distributions (TVD(p, q) = ½ Σ_g |p_g − q_g|)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from biasaudit import GROUPS, UNKNOWN


def tvd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """TVD along the last axis; p and q are distributions (rows summing to 1)."""
    return 0.5 * np.abs(np.asarray(p, dtype=float) - np.asarray(q, dtype=float)).sum(axis=-1)


def label_shares(labels: pd.DataFrame, by: str | list[str] = "prompt_id", label_col: str = "label",
                 groups: tuple[str, ...] = GROUPS) -> pd.DataFrame:
    """Share of each group among the non-abstaining labels per `by`, plus n and abstention counts."""
    by = [by] if isinstance(by, str) else list(by)
    counts = pd.crosstab([labels[c] for c in by], labels[label_col])
    for g in (*groups, UNKNOWN):
        if g not in counts:
            counts[g] = 0
    n = counts[list(groups)].sum(axis=1)
    shares = counts[list(groups)].div(n.where(n > 0), axis=0)
    shares["n"] = n
    shares["n_unknown"] = counts[UNKNOWN] + counts.drop(columns=[*groups, UNKNOWN]).sum(axis=1)
    return shares.reset_index()
