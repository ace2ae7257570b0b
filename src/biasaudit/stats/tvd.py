"""Total Variation Distance between group distributions (TVD(p, q) = ½ Σ_g |p_g − q_g|), its finite-n
null floor and its bootstrap bias correction.

The TVD of an observed share vector is biased upward: with n images drawn exactly from the benchmark
q, E[TVD(p̂, q)] > 0 (≈ 0.066 at n = 100 for five groups, ≈ 0.46 at n = 2). Because TVD is a sum over
groups of |p̂_g − q_g| and each p̂_g is a binomial share, its expectation is exact and cheap:

    E[TVD(p̂, q) | n, p] = ½ Σ_g Σ_k Bin(k; n, p_g) |k/n − q_g|       (`expected_tvd`)

- the **null floor** of a prompt is expected_tvd(n, q, q): what a model drawing exactly from the
  benchmark would score at that prompt's n;
- the **bias-corrected** TVD of a prompt is the bootstrap bias correction with infinitely many
  resamples, 2·TVD(p̂, q) − expected_tvd(n, p̂, q). It removes most of the finite-n bias when the
  model is away from the benchmark; at the benchmark itself it removes only part of it (the
  calibration suite reports both cases) and can be negative.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def tvd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """TVD along the last axis; p and q are distributions (rows summing to 1)."""
    return 0.5 * np.abs(np.asarray(p, dtype=float) - np.asarray(q, dtype=float)).sum(axis=-1)


def expected_tvd(n, p, q, chunk: int = 4096) -> np.ndarray:
    """Exact E[TVD(X/n, q)] for X ~ Multinomial(n, p), per row of p and q (…×G); NaN where n = 0."""
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    p = np.atleast_2d(np.asarray(p, dtype=np.float64))
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    n, p, q = np.broadcast_arrays(n[:, None], p, q)
    n = n[:, 0]
    out = np.full(len(n), np.nan)
    ok = (n > 0) & np.isfinite(p).all(axis=1) & np.isfinite(q).all(axis=1)
    for value in np.unique(n[ok]):
        rows = np.flatnonzero(ok & (n == value))
        k = np.arange(value + 1)
        for s in range(0, len(rows), chunk):
            r = rows[s:s + chunk]
            pmf = stats.binom.pmf(k[None, None, :], value, np.clip(p[r], 0, 1)[:, :, None])
            out[r] = 0.5 * (pmf * np.abs(k[None, None, :] / value - q[r][:, :, None])).sum(axis=(1, 2))
    return out


def null_floor(n, q) -> np.ndarray:
    """Expected TVD of a model that draws exactly from the benchmark q with n images (per row)."""
    return expected_tvd(n, q, q)


def bias_corrected_tvd(counts: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per row: 2·TVD(p̂, q) − E*[TVD(p̂*, q)], p̂* the multinomial bootstrap of the row's counts."""
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    n = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = counts / n[:, None]
    return 2 * tvd(p, q) - expected_tvd(n.astype(np.int64), p, q)


