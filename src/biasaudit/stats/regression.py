"""OLS with cluster-robust standard errors (statsmodels): slope, CI and p-value.

Used for L* against median weekly earnings per occupation: images of one prompt share the
occupation's earnings, so errors are clustered by prompt (CR1 small-sample correction, t
reference distribution with G−1 degrees of freedom, as statsmodels does with use_t)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class SlopeFit:
    slope: float
    intercept: float
    se: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    n_clusters: int
    r2: float
    reason: str = ""  # why there is no fit ('' when there is one)

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _empty(n: int, g: int, reason: str) -> SlopeFit:
    return SlopeFit(*(np.nan,) * 6, n, g, np.nan, reason)


def ols_cluster(y, x, clusters, level: float = 0.95, min_clusters: int = 3) -> SlopeFit:
    """y = a + b·x + e with errors clustered by `clusters`. Rows with a missing y/x are dropped.

    With two clusters the slope through two cluster means has a cluster-robust SE of exactly 0,
    so at least `min_clusters` (default 3) are required."""
    import statsmodels.api as sm

    frame = pd.DataFrame({"y": np.asarray(y, dtype=float), "x": np.asarray(x, dtype=float),
                          "g": np.asarray(clusters)}).dropna()
    n, g = len(frame), frame["g"].nunique()
    if n < 3:
        return _empty(n, g, f"too few observations ({n})")
    if g < min_clusters:
        return _empty(n, g, f"too few clusters ({g}) for cluster-robust errors (need ≥ {min_clusters})")
    if np.ptp(frame["x"].to_numpy()) == 0:
        return _empty(n, g, "x does not vary")
    codes = pd.factorize(frame["g"])[0]
    fit = sm.OLS(frame["y"].to_numpy(), sm.add_constant(frame["x"].to_numpy())).fit(
        cov_type="cluster", cov_kwds={"groups": codes}, use_t=True)
    low, high = fit.conf_int(alpha=1 - level)[1]
    return SlopeFit(float(fit.params[1]), float(fit.params[0]), float(fit.bse[1]), float(low), float(high),
                    float(fit.pvalues[1]), n, g, float(fit.rsquared))
