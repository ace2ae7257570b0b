"""Cluster bootstrap with percentile intervals (scipy.stats.bootstrap, vectorised).

Images of one prompt (or edits of one source photo) are not independent, so every confidence
interval resamples *clusters* with replacement. Almost every statistic in the audit is a function of
per-cluster totals — a mean over prompts is Σ value / Σ 1, a pooled share is Σ count_g / Σ n, a
regression-free mean L* is Σ L / Σ n — so the interface takes one row of totals per cluster and a
statistic of the column sums. scipy draws the resamples (paired across columns) and computes the
interval; resamples in which the statistic is undefined (0/0) are excluded and counted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

Statistic = Callable[[np.ndarray], np.ndarray]
"""Maps column sums of shape (..., k) to the statistic: shape (...) or (..., m)."""


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    se: float
    n_clusters: int
    n_undefined: int = 0  # resamples where the statistic was undefined (excluded)
    reason: str = ""  # why there is no interval ('' when there is one)

    def as_dict(self, prefix: str = "") -> dict[str, float | int | str]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def ratio(num: int, den: int) -> Statistic:
    """Statistic Σ column[num] / Σ column[den] (NaN where the denominator is 0)."""

    def stat(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sums[..., den] > 0, sums[..., num] / sums[..., den], np.nan)

    return stat


def cluster_bootstrap(totals: np.ndarray, statistic: Statistic, *, n_boot: int = 2000, level: float = 0.95,
                      seed: int | None = 0, method: str = "percentile") -> list[Interval]:
    """Bootstrap CIs of `statistic(column sums)` resampling the rows (clusters) of `totals`.

    totals: (n_clusters, k) per-cluster totals. Returns one Interval per statistic output
    (a list of length 1 for a scalar statistic).
    """
    totals = np.asarray(totals, dtype=float)
    if totals.ndim == 1:
        totals = totals[:, None]
    n_clusters = totals.shape[0]
    point = np.atleast_1d(np.asarray(statistic(totals.sum(axis=0)), dtype=float))
    if n_clusters < 2:
        reason = "no clusters" if n_clusters == 0 else "one cluster: no interval"
        return [Interval(float(p), np.nan, np.nan, np.nan, n_clusters, 0, reason) for p in point]

    def wrapped(x: np.ndarray, axis: int = -1) -> np.ndarray:
        # x: (k, batch, n_clusters) → sums (batch, k) → statistic (batch,) or (batch, m) → (m, batch)
        out = np.asarray(statistic(np.moveaxis(x.sum(axis=axis), 0, -1)), dtype=float)
        return out if out.ndim == 1 else np.moveaxis(out, -1, 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((totals.T,), wrapped, n_resamples=n_boot, vectorized=True, axis=-1,
                              confidence_level=level, method=method, rng=np.random.default_rng(seed))
    dist = np.atleast_2d(res.bootstrap_distribution)  # (m, n_boot)
    low, high = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    out = []
    alpha = (1 - level) / 2
    for i, p in enumerate(point):
        d = dist[i]
        undefined = int(np.isnan(d).sum())
        lo, hi, reason = float(low[i]), float(high[i]), ""
        if not np.isfinite(p):
            lo = hi = np.nan
            reason = "statistic undefined on the data"
        elif undefined:
            if undefined == len(d):
                lo = hi = np.nan
                reason = "statistic undefined in every resample"
            else:  # percentile interval over the resamples where it is defined
                lo, hi = (float(v) for v in np.nanquantile(d, [alpha, 1 - alpha]))
                reason = f"{undefined} of {len(d)} resamples undefined and excluded"
        se = float(np.nanstd(d, ddof=1)) if undefined < len(d) - 1 else np.nan
        out.append(Interval(float(p), lo, hi, se, n_clusters, undefined, reason))
    return out
