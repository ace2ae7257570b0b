"""The one resampling engine behind every interval of the audit (percentile, basic and BCa).

Images of one prompt (Method A) or edits of one source photo (Method B) are not independent, so every
interval resamples *clusters* with replacement. A replicate is a vector of cluster multiplicities
w ∈ {0, 1, 2, …}^P (Σw = P), and every statistic is written as a function of w: a mean over prompts
is w·value / w·1, a pooled share w·count_g / w·n, a pair statistic a quadratic form wᵀ K w over
cluster-pair sums. Written that way:

- the point estimate is the statistic at w = 1, the jackknife (for BCa's acceleration) at w = 1 − e_c;
- one call evaluates a whole chunk of replicates (a B×P weight matrix), so nothing loops over
  replicates in Python and nothing materialises resampled rows;
- pair statistics can leave out *copy pairs* (an image paired with its own bootstrap duplicate),
  which a resample-the-rows implementation silently counts as perfectly similar pairs.

Percentile and basic intervals use Hesterberg's expanded levels (`expanded_alpha`): with 50 prompts
the plain percentile interval covers about 93% instead of 95% (benchmarks/calibration.py).

The impact ratio (a rate over the highest rate) is not a smooth statistic: its percentile interval
under-covers and the top category's is [1, 1] in every replicate. `ratio_to_max_intervals` builds it from
the same replicates of the rates instead, through pairwise ratios (simultaneous upper bounds, marginal
lower bounds).

Degenerate cases come out as NaN with a reason, never as a number: no or one cluster, a statistic
undefined on the data, undefined in every replicate, or an interval of zero width (the statistic is
the same in every replicate, so the bootstrap says nothing about its uncertainty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

METHODS = ("percentile", "basic", "BCa")
WeightStatistic = Callable[[np.ndarray], np.ndarray]
"""Maps cluster weights of shape (b, P) to the statistic: shape (b,) or (b, m)."""
Statistic = Callable[[np.ndarray], np.ndarray]
"""Maps column sums of shape (..., k) to the statistic: shape (...) or (..., m)."""


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    se: float
    n_clusters: int
    n_undefined: int = 0  # replicates where the statistic was undefined (excluded)
    reason: str = ""  # why there is no interval, or what was excluded ('' when clean)

    def as_dict(self, prefix: str = "") -> dict[str, float | int | str]:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Replicates:
    """Point estimate, bootstrap distribution and jackknife values of an m-vector statistic."""

    point: np.ndarray  # (m,)
    dist: np.ndarray  # (B, m)
    jack: np.ndarray | None  # (P, m) leave-one-cluster-out values (BCa only)
    n_clusters: int


def cluster_weights(n_clusters: int | tuple[int, ...], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, P) multiplicities of a with-replacement resample of the clusters. A tuple of sizes
    resamples independent strata (e.g. prompts and annotated images), each to its own size, side by side.

    Each replicate draws its k clusters as k independent uniform picks and counts them: exactly
    Multinomial(k, 1/k each), as rng.multinomial would give, at about a fifth of its cost (multinomial
    draws k − 1 conditional binomials per replicate; here one batch of integers and one bincount)."""
    sizes = (n_clusters,) if np.isscalar(n_clusters) else tuple(n_clusters)
    parts = []
    for k in sizes:
        picks = rng.integers(0, k, size=(n_boot, k)) if k else np.zeros((n_boot, 0), dtype=np.int64)
        picks += (np.arange(n_boot) * k)[:, None]
        parts.append(np.bincount(picks.ravel(), minlength=n_boot * k).reshape(n_boot, k))
    return np.hstack(parts).astype(np.float64)


def _as_2d(values: np.ndarray, b: int) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(b, -1)


def replicates(statistic: WeightStatistic, n_clusters: int | tuple[int, ...], *, n_boot: int = 2000,
               seed: int | None = 0, method: str = "percentile", chunk: int | None = None) -> Replicates:
    """Evaluate `statistic` at w = 1, at `n_boot` cluster resamples and (for BCa) at the jackknife.
    `n_clusters` may be a tuple of independent strata sizes (see cluster_weights); the first stratum
    is the one whose size decides whether there is an interval."""
    if method not in METHODS:
        raise ValueError(f"bootstrap method {method!r}: expected one of {METHODS}")
    sizes = (n_clusters,) if np.isscalar(n_clusters) else tuple(n_clusters)
    primary, n_clusters = int(sizes[0]), int(sum(sizes))
    point = _as_2d(statistic(np.ones((1, n_clusters))), 1)[0]
    if primary < 2 or n_boot <= 0:
        return Replicates(point, np.empty((0, point.size)), None, primary)
    rng = np.random.default_rng(seed)
    chunk = chunk or max(1, min(n_boot, 2_000_000 // max(1, n_clusters * max(1, point.size))))
    parts = []
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        parts.append(_as_2d(statistic(cluster_weights(sizes, b, rng)), b))
    jack = None
    if method == "BCa":
        loo = 1.0 - np.eye(n_clusters)
        jack = np.vstack([_as_2d(statistic(loo[s:s + chunk]), len(loo[s:s + chunk])) for s in range(0, n_clusters, chunk)])
    return Replicates(point, np.vstack(parts), jack, primary)


def _bca_levels(point: float, dist: np.ndarray, jack: np.ndarray, alpha: float) -> tuple[float, float, str]:
    """BCa quantile levels (Efron 1987) with z0 from the replicates and a from the jackknife."""
    below = np.mean(dist < point) + 0.5 * np.mean(dist == point)
    if below <= 0 or below >= 1:
        return np.nan, np.nan, "BCa undefined: the estimate lies outside every replicate"
    z0 = stats.norm.ppf(below)
    jack = jack[np.isfinite(jack)]
    dev = jack.mean() - jack if jack.size else np.array([0.0])
    den = 6.0 * (dev ** 2).sum() ** 1.5
    a = (dev ** 3).sum() / den if den > 0 else 0.0
    z = stats.norm.ppf([alpha, 1 - alpha])
    levels = stats.norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))
    return float(levels[0]), float(levels[1]), ""


def expanded_alpha(level: float, n_clusters: int) -> float:
    """Hesterberg's expanded percentile level (Hesterberg 2015, "What teachers should know about the
    bootstrap"): the tail α' with z_{1−α'} = √(P/(P−1)) · t_{1−α, P−1}. The plain percentile interval
    is too narrow with few clusters (its variance is the plug-in one, and z < t); the expansion fixes
    both, e.g. 95% uses the 2.1%/97.9% quantiles at 50 prompts and 0.9%/99.1% at 10."""
    alpha = (1 - level) / 2
    if n_clusters < 2:
        return alpha
    z = np.sqrt(n_clusters / (n_clusters - 1)) * stats.t.ppf(1 - alpha, n_clusters - 1)
    return float(stats.norm.sf(z))


def no_interval(rep: Replicates, point: float) -> Interval | None:
    """The interval-less result when the resamples cannot give one (fewer than two clusters, none drawn)."""
    if rep.n_clusters < 2:
        reason = "no clusters" if rep.n_clusters == 0 else "one cluster: no interval"
        return Interval(point, np.nan, np.nan, np.nan, rep.n_clusters, 0, reason)
    if rep.dist.shape[0] == 0:
        return Interval(point, np.nan, np.nan, np.nan, rep.n_clusters, 0, "no resamples requested")
    return None


def intervals(rep: Replicates, level: float = 0.95, method: str = "percentile", expand: bool = True,
              n_effective: Sequence[float] | None = None) -> list[Interval]:
    """One Interval per component of the statistic (see the module docstring for the NaN rules).
    Percentile and basic intervals use the expanded levels (`expanded_alpha`) unless `expand` is False;
    BCa has its own small-sample corrections. `n_effective` (per component) replaces the cluster count in
    the expansion where a component rests on fewer clusters than the resample (a group present in a few of
    the prompts); below 2 the component gets no interval."""
    counts = np.full(len(rep.point), float(rep.n_clusters)) if n_effective is None else np.asarray(n_effective, float)
    expanded = expand and method != "BCa"
    alphas = {k: expanded_alpha(level, k) if expanded else (1 - level) / 2 for k in set(counts.tolist())}  # t.ppf once per count
    out = []
    for i, p in enumerate(rep.point):
        p = float(p)
        k = counts[i]
        alpha = alphas[k]
        if (none := no_interval(rep, p)) is not None:
            out.append(none)
            continue
        d = rep.dist[:, i]
        ok = d[np.isfinite(d)]
        undefined = len(d) - len(ok)
        se = float(np.std(ok, ddof=1)) if len(ok) > 1 else np.nan
        reason = f"{undefined} of {len(d)} resamples undefined and excluded" if undefined else ""
        if not np.isfinite(p):
            out.append(Interval(p, np.nan, np.nan, np.nan, rep.n_clusters, undefined, "statistic undefined on the data"))
            continue
        if len(ok) < 2:
            out.append(Interval(p, np.nan, np.nan, se, rep.n_clusters, undefined, "statistic undefined in every resample"))
            continue
        if k < 2:
            out.append(Interval(p, np.nan, np.nan, se, rep.n_clusters, undefined,
                                f"rests on {k:g} cluster(s), fewer than 2: no interval"))
            continue
        if method == "BCa":
            a1, a2, why = _bca_levels(p, ok, rep.jack[:, i], (1 - level) / 2)
            if why:
                out.append(Interval(p, np.nan, np.nan, se, rep.n_clusters, undefined, why))
                continue
            lo, hi = np.quantile(ok, [a1, a2])
        else:
            qlo, qhi = np.quantile(ok, [alpha, 1 - alpha])
            lo, hi = (qlo, qhi) if method == "percentile" else (2 * p - qhi, 2 * p - qlo)
        if hi - lo <= 1e-12 * max(1.0, abs(p)):
            why = "zero-width interval: the statistic is the same in every resample"
            out.append(Interval(p, np.nan, np.nan, se, rep.n_clusters, undefined, "; ".join(r for r in (why, reason) if r)))
            continue
        out.append(Interval(p, float(lo), float(hi), se, rep.n_clusters, undefined, reason))
    return out


def ratio_to_max_intervals(rep: Replicates, level: float = 0.95, expand: bool = True) -> list[Interval]:
    """Intervals of θ_c = x_c / max_k x_k for each component c of a nonnegative m-vector statistic x (the
    impact ratio: a category's rate over the highest category's rate), from the replicates of x itself.

    The percentile interval of the replicated ratio-to-max under-covers: the estimated max is biased upward
    (a max of noisy rates), and the top category's replicates are all 1 (a zero-width interval). Instead
    θ_c = min_k r_ck with r_ck = x_c / x_k (r_cc = 1), which is nondecreasing in every r_ck, so
    - upper end = min(1, min_k U_ck) with U_ck *simultaneous* upper bounds over k ≠ c (max-rank percentile
      bounds: one common level such that every pair stays under its bound in 1 − α' of the replicates):
      it misses only when some pair's bound misses, so with probability ≤ α';
    - lower end = min(1, min_k L_ck) with L_ck *marginal* lower bounds: it misses only when even the pair
      with the true maximum k* misses (L_ck* > r_ck* = θ_c), so with probability ≤ α'.
    α' is the tail of `expanded_alpha` (as for every percentile interval of the engine). Coverage ≥ 1 − 2α'
    wherever θ_c < 1; at θ_c = 1 (a category tied for, or at, the top) only the upper end can miss, so such
    a category is covered with probability about 1 − α' (0.975 at 95%). Pairs are read through the pair
    share s = x_c / (x_c + x_k) (monotone in r_ck and bounded), so a replicate with x_k = 0 needs no special
    case; a pair undefined in a replicate (0/0, or a category absent from it) counts as uninformative (no
    upper and no lower constraint). A category that is above every other at this level gets [1, 1]: a real
    interval (its ratio is 1 and which category is highest is not in doubt), with that said in its reason.
    Components whose point estimate is not finite take no part (a category with no data)."""
    point = np.asarray(rep.point, dtype=np.float64)
    m = len(point)
    finite = np.isfinite(point)
    top = float(point[finite].max()) if finite.any() else np.nan
    out = []
    for c in range(m):
        est = float(point[c] / top) if finite[c] and top > 0 else np.nan
        if (none := no_interval(rep, est)) is not None:
            out.append(none)
            continue
        if not np.isfinite(est):
            out.append(Interval(est, np.nan, np.nan, np.nan, rep.n_clusters, 0, "statistic undefined on the data"))
            continue
        others = [k for k in range(m) if k != c and finite[k]]
        if not others:
            out.append(Interval(est, 1.0, 1.0, 0.0, rep.n_clusters, 0, "the only category: ratio 1"))
            continue
        alpha = expanded_alpha(level, rep.n_clusters) if expand else (1 - level) / 2
        x = rep.dist
        with np.errstate(invalid="ignore", divide="ignore"):
            share = x[:, [c]] / (x[:, [c]] + x[:, others])  # (B, m − 1) pair shares, NaN where undefined
            top_b = np.nanmax(np.where(np.isfinite(x), x, -np.inf), axis=1)
            se = float(np.nanstd(np.where(top_b > 0, x[:, c] / top_b, np.nan), ddof=1))
        undefined = int((~np.isfinite(share)).any(axis=1).sum())
        high_s = np.where(np.isfinite(share), share, 1.0)
        low_s = np.where(np.isfinite(share), share, 0.0)
        ecdf = stats.rankdata(high_s, method="max", axis=0) / len(high_s)  # each replicate's ECDF value per pair
        common = np.quantile(ecdf.max(axis=1), 1 - alpha, method="inverted_cdf")
        upper = np.quantile(high_s, common, axis=0, method="inverted_cdf")
        lower = np.quantile(low_s, alpha, axis=0)
        with np.errstate(divide="ignore"):
            hi = min(1.0, float(np.min(np.where(upper < 1, upper / (1 - upper), np.inf))))
            lo = min(1.0, float(np.min(np.where(lower < 1, lower / (1 - lower), np.inf))))
        reasons = [f"{undefined} of {len(share)} resamples have a pair undefined, counted as uninformative"
                   if undefined else ""]
        if lo >= 1.0:
            reasons.insert(0, "above every other category at this level: ratio 1 at both ends")
        out.append(Interval(est, lo, hi, se, rep.n_clusters, undefined, "; ".join(r for r in reasons if r)))
    return out


def resample(statistic: WeightStatistic, n_clusters: int | tuple[int, ...], *, n_boot: int = 2000, level: float = 0.95,
             seed: int | None = 0, method: str = "percentile", chunk: int | None = None,
             expand: bool = True) -> list[Interval]:
    """Cluster-bootstrap intervals of `statistic(weights)` (one per output component)."""
    return intervals(replicates(statistic, n_clusters, n_boot=n_boot, seed=seed, method=method, chunk=chunk),
                     level, method, expand)


def sums_statistic(totals: np.ndarray, statistic: Statistic) -> WeightStatistic:
    """The weight statistic of a statistic of column sums of per-cluster totals (P, k)."""
    totals = np.asarray(totals, dtype=np.float64)
    totals = totals[:, None] if totals.ndim == 1 else totals

    def stat(w: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.asarray(statistic(w @ totals), dtype=np.float64)

    return stat


def cluster_bootstrap(totals: np.ndarray, statistic: Statistic, *, n_boot: int = 2000, level: float = 0.95,
                      seed: int | None = 0, method: str = "percentile", expand: bool = True) -> list[Interval]:
    """Intervals of `statistic(column sums)` resampling the rows (clusters) of `totals` (P, k)."""
    totals = np.asarray(totals, dtype=np.float64)
    totals = totals[:, None] if totals.ndim == 1 else totals
    return resample(sums_statistic(totals, statistic), totals.shape[0], n_boot=n_boot, level=level, seed=seed,
                    method=method, expand=expand)


def ratio(num: int, den: int) -> Statistic:
    """Statistic Σ column[num] / Σ column[den] (NaN where the denominator is 0)."""

    def stat(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sums[..., den] > 0, sums[..., num] / sums[..., den], np.nan)

    return stat


def sign_flip_pvalue(diffs, n_permutations: int = 9999, seed: int | None = 0) -> tuple[float, float, str]:
    """Paired sign-flip permutation test of mean(diffs) = 0, two-sided: (mean, p, reason). Exact under
    H0 "each difference is symmetric about 0" (e.g. two models that are exchangeable on every prompt);
    exact enumeration when 2^n ≤ n_permutations (scipy.stats.permutation_test). One difference:
    p = 1 with a reason (a sign flip of one value cannot reject); every difference 0: NaN with a reason."""
    d = np.asarray(diffs, dtype=float)
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return np.nan, np.nan, "no paired difference"
    if len(d) == 1:
        return float(d[0]), 1.0, "one unit: a sign flip of one difference cannot reject (p = 1)"
    if np.all(d == 0):
        return 0.0, np.nan, "degenerate: every difference is 0 (no variation to test)"
    res = stats.permutation_test((d, np.zeros_like(d)), lambda x, y, axis: np.mean(x - y, axis=axis),
                                 permutation_type="samples", vectorized=True, n_resamples=n_permutations,
                                 alternative="two-sided", random_state=np.random.default_rng(seed))
    return float(d.mean()), float(res.pvalue), ""


P_ADJUST = ("holm", "bh", "none")


def p_adjust(p, method: str = "holm") -> np.ndarray:
    """Holm (family-wise error) or Benjamini–Hochberg (false discovery rate) adjusted p-values over the
    finite entries of `p`; NaN stays NaN. (statsmodels' multipletests gives the same numbers but
    calls gc.collect() on every call, which dominates inside simulations.)"""
    if method not in P_ADJUST:
        raise ValueError(f"p_adjust {method!r}: expected one of {P_ADJUST}")
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = len(ok)
    if method == "none" or m == 0:
        out[ok] = p[ok]
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    ranked = p[order]
    if method == "holm":
        adj = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ranked))
    else:
        adj = np.minimum.accumulate((m / np.arange(1, m + 1) * ranked)[::-1])[::-1].clip(max=1.0)
    out[order] = adj
    return out
