"""OLS with cluster-robust standard errors: slope, CI and p-value.

Used for L* against median weekly earnings per occupation: images of one prompt share the
occupation's earnings, so errors are clustered by prompt (CR1 small-sample correction, t
reference distribution with G−1 degrees of freedom, as statsmodels does with use_t; computed here
with numpy: importing statsmodels cost the analyze stage about a CPU second, and its fit equals
this one to rounding, tests/test_stats_bootstrap_regression.py)."""

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


def ols_cluster(y, x, clusters, level: float = 0.95, min_clusters: int = 3, fixed=None) -> SlopeFit:
    """y = a + b·x + e with errors clustered by `clusters`. Rows with a missing y/x are dropped.

    `fixed` (optional, one category per row): adds a fixed effect (an intercept shift) per category, so b is
    the slope within categories (e.g. L* against the share of women holding the face's race label fixed);
    `intercept` is then the first category's.

    With two clusters the slope through two cluster means has a cluster-robust SE of exactly 0,
    so at least `min_clusters` (default 3) are required."""
    from scipy import stats as st

    frame = pd.DataFrame({"y": np.asarray(y, dtype=float), "x": np.asarray(x, dtype=float),
                          "g": np.asarray(clusters)})
    if fixed is not None:
        frame["f"] = np.asarray(fixed, dtype=object)
    frame = frame.dropna()
    n, g = len(frame), frame["g"].nunique()
    if n < 3:
        return _empty(n, g, f"too few observations ({n})")
    if g < min_clusters:
        return _empty(n, g, f"too few clusters ({g}) for cluster-robust errors (need ≥ {min_clusters})")
    if np.ptp(frame["x"].to_numpy()) == 0:
        return _empty(n, g, "x does not vary")
    codes = pd.factorize(frame["g"])[0]
    y = frame["y"].to_numpy()
    design = np.column_stack([np.ones(n), frame["x"].to_numpy()])
    if fixed is not None:
        dummies = pd.get_dummies(frame["f"].astype(str), drop_first=True, dtype=float).to_numpy()
        design = np.column_stack([design, dummies])
    k = design.shape[1]
    pinv = np.linalg.pinv(design)  # as statsmodels' OLS: β = X⁺y, and X⁺ = (XᵀX)⁻¹Xᵀ is _cluster_se's A
    beta = pinv @ y
    resid = y - design @ beta
    se = float(_cluster_se(pinv[1:2], resid, codes, g, g / (g - 1) * (n - 1) / (n - k))[0])  # CR1
    t = st.t(df=g - 1)
    half = t.ppf(1 - (1 - level) / 2) * se
    centred = y - y.mean()
    return SlopeFit(float(beta[1]), float(beta[0]), se, float(beta[1] - half), float(beta[1] + half),
                    float(2 * t.sf(abs(beta[1] / se))), n, g, float(1 - resid @ resid / (centred @ centred)))


# ---------------------------------------------------------------- Method B: OLS with unit fixed effects

WILD_WEIGHTS = ("webb", "rademacher")


def _demean(values: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Subtract each cluster's mean (the within transformation that absorbs cluster fixed effects)."""
    counts = np.bincount(codes, minlength=n_groups).astype(float)
    if values.ndim == 1:
        return values - (np.bincount(codes, weights=values, minlength=n_groups) / counts)[codes]
    means = np.stack([np.bincount(codes, weights=v, minlength=n_groups) for v in values.T], axis=1) / counts[:, None]
    return values - means[codes]


def _cluster_se(A: np.ndarray, resid: np.ndarray, codes: np.ndarray, n_groups: int, factor: float) -> np.ndarray:
    """CR1 standard errors: A = (XᵀX)⁻¹Xᵀ (k×n), resid n or n×B → k or k×B."""
    resid = resid[:, None] if resid.ndim == 1 else resid
    out = []
    for a in A:  # per coefficient: per-cluster sums of a_i·e_i, squared and summed
        u = np.zeros((n_groups, resid.shape[1]))
        np.add.at(u, codes, a[:, None] * resid)
        out.append(np.sqrt(factor * (u ** 2).sum(axis=0)))
    return np.squeeze(np.array(out), axis=-1) if resid.shape[1] == 1 else np.array(out)


def wild_weights(kind: str, size: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Rademacher (±1) or Webb's six-point weights (±√½, ±1, ±√1.5): better with few clusters."""
    if kind == "rademacher":
        return rng.choice(np.array([-1.0, 1.0]), size=size)
    if kind == "webb":
        return rng.choice(np.array([-np.sqrt(1.5), -1.0, -np.sqrt(0.5), np.sqrt(0.5), 1.0, np.sqrt(1.5)]), size=size)
    raise ValueError(f"wild bootstrap weights {kind!r}: expected one of {WILD_WEIGHTS}")


def fe_ols_cluster(y, X, clusters, names: list[str], level: float = 0.95, n_wild: int = 999,
                   weights: str = "webb", seed: int = 0) -> tuple[pd.DataFrame | None, str]:
    """y = Xβ + α_cluster + e: OLS with cluster fixed effects (within transformation), CR1 errors
    clustered by the same units, t(G − 1) reference, and a wild cluster restricted bootstrap p-value
    per coefficient (Cameron, Gelbach & Miller 2008; H0 β_j = 0 imposed; `n_wild` = 0 turns it off).

    The fixed effects are nested in the clusters, so the CR1 factor uses the k regressors only:
    G/(G−1)·(n−1)/(n−k), G counting only the photos in which an effect varies. Returns (term, coef, se,
    df, ci_low, ci_high, p_t, p_wild, n, n_clusters, reason). A coefficient without a standard error (an
    exact fit, or an SE at rounding level) has no interval and no p (NaN, with the reason); an effect that
    varies within no photo gets a row with its reason and the others are still fitted; the wild p is
    (1 + #|t*| ≥ |t|)/(1 + B), never 0."""
    from scipy import stats as st

    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float)
    names = list(names)
    if not np.isfinite(y).all():
        return None, f"{int((~np.isfinite(y)).sum())} non-finite answer values"
    codes, uniq = pd.factorize(pd.Series(np.asarray(clusters)))
    if len(uniq) < 2:
        return None, f"one source photo: no cluster-robust inference ({len(y)} rows)"
    Xd_all = _demean(X, codes, len(uniq))
    varies = np.abs(Xd_all).sum(axis=0) > 1e-12
    if not varies.any():
        return None, "no effect varies within any source photo: " + ", ".join(names)
    # Only photos in which some effect varies identify the effects (a photo with one retained answer, or
    # answers of one group only, adds nothing to X'X nor to the scores): they are the clusters that count.
    contributing = np.bincount(codes, weights=np.abs(Xd_all[:, varies]).sum(axis=1), minlength=len(uniq)) > 1e-12
    G = int(contributing.sum())
    if G < 2:
        return None, f"only {G} source photo has answers that vary in the effects: no cluster-robust inference"
    rows = contributing[codes]
    codes = pd.factorize(codes[rows])[0]
    y, X = y[rows], X[rows][:, varies]
    kept = [nm for nm, v in zip(names, varies) if v]
    n, k = X.shape
    if n <= k + G:
        return None, f"too few observations ({n}) for {k} effects and {G} photo fixed effects"
    yd, Xd = _demean(y, codes, G), _demean(X, codes, G)
    XtX_inv = np.linalg.pinv(Xd.T @ Xd)
    A = XtX_inv @ Xd.T
    beta = A @ yd
    resid = yd - Xd @ beta
    factor = G / (G - 1) * (n - 1) / (n - k)
    se = _cluster_se(A, resid, codes, G, factor)
    df = G - 1
    # No residual variation (the model fits every answer exactly, e.g. a deterministic VLM), or an SE at
    # rounding level on the data's own scale: no standard error, so no interval and no p.
    y_norm = float(np.linalg.norm(yd))
    exact_fit = float(np.linalg.norm(resid)) <= 1e-9 * max(y_norm, 1e-300)
    scale = y_norm / np.maximum(np.linalg.norm(Xd, axis=0), 1e-300)
    degenerate = exact_fit | ~np.isfinite(se) | (se <= 1e-10 * (scale + np.abs(beta)))
    why = ("degenerate: the photo fixed-effects model fits every retained answer exactly (no residual "
           "variation), so there is no standard error" if exact_fit else
           "degenerate: zero cluster-robust standard error")
    reason = np.where(degenerate, why, "")
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(degenerate, np.nan, beta / np.where(degenerate, 1.0, se))
    p_t = np.where(degenerate, np.nan, 2 * st.t.sf(np.abs(t), df))
    half = st.t.ppf(0.5 + level / 2, df) * se
    p_wild = np.full(k, np.nan)
    if n_wild > 0:
        rng = np.random.default_rng(seed)
        V = wild_weights(weights, (G, n_wild), rng)  # G × B, one weight per cluster

        def sums(w: np.ndarray) -> np.ndarray:  # per-cluster sums of the columns of w (n × m) → G × m
            return np.stack([np.bincount(codes, weights=c, minlength=G) for c in w.T], axis=1)

        for j in np.flatnonzero(~degenerate):
            others = [c for c in range(k) if c != j]
            Xr = Xd[:, others]
            br = np.linalg.lstsq(Xr, yd, rcond=None)[0] if others else np.zeros(0)
            fit_r = Xr @ br if others else np.zeros(n)
            u_r = yd - fit_r
            # The replicates Y = fit_r + u_r·V[cluster] are linear in the cluster weights, so their
            # coefficients B = A·Y and the per-cluster scores Σ_i∈g a_j,i (Y − Xd·B)_i follow from per-cluster
            # sums (G × B) without forming the n × B replicates
            B = (A @ fit_r)[:, None] + sums(A.T * u_r[:, None]).T @ V
            a = A[j]
            scores = sums(np.column_stack([a * fit_r, a * u_r]))
            u = scores[:, :1] + scores[:, 1:] * V - sums(a[:, None] * Xd) @ B
            se_b = np.sqrt(factor * (u ** 2).sum(axis=0))
            with np.errstate(invalid="ignore", divide="ignore"):
                tb = B[j] / se_b
            tb = tb[np.isfinite(tb)]  # a replicate with no residual variation has no statistic
            # (1 + #as extreme) / (1 + B): the observed statistic counts as one draw, so p is never 0
            p_wild[j] = (1 + np.sum(np.abs(tb) >= np.abs(t[j]) - 1e-12)) / (1 + len(tb)) if len(tb) else np.nan
    table = pd.DataFrame({"term": kept, "coef": beta, "se": se, "df": df,
                          "ci_low": np.where(degenerate, np.nan, beta - half),
                          "ci_high": np.where(degenerate, np.nan, beta + half), "p_t": p_t, "p_wild": p_wild,
                          "n": n, "n_clusters": G, "reason": reason})
    if G < len(uniq):
        table["reason"] = [r or f"{G} of {len(uniq)} source photos vary in the effects (the clusters that count)"
                           for r in table["reason"]]
    dropped = [nm for nm, v in zip(names, varies) if not v]
    if dropped:  # reported, not fitted: the other effects keep their estimates
        table = pd.concat([table, pd.DataFrame({"term": dropped, "n": n, "n_clusters": G, "df": df,
                                                "reason": "does not vary within any source photo"})],
                          ignore_index=True)
    return table, ""
