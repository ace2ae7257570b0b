"""Group summaries of skin colour: mean/median L*, C*, circular-mean hue; diversity = mean pairwise
ΔE2000 among the group's skin colours (vectorised, seeded pair capping for large groups); cluster-
bootstrap CIs from the resampling engine (biasaudit.stats.resample).

Diversity in a bootstrap replicate is the mean ΔE2000 over pairs of *different images* of the
resampled multiset: a copy of an image is not paired with itself (that pair would add a ΔE of 0 and
shift the interval down by about D/(n−1)), and no pair joins two draws of the same prompt (each draw
then behaves like a distinct prompt of the original design). With cluster weights w and the pair pool
summed per cluster pair, A[c, c'] = Σ_{pairs (i, j), i in c, j in c'} ΔE_ij and N[c, c'] their count,
a replicate's diversity is (wᵀAw − Σ_c (w_c² − w_c) A_cc) / (the same with N): O(P²) per replicate,
never an n×n matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from biasaudit.faces.colour import delta_e2000, wrap_degrees
from biasaudit.stats.resample import resample

CIRCULAR_TOL = 1e-9  # mean resultant length below this: the hues cancel out and have no mean direction


def circular_mean(h: np.ndarray) -> tuple[float, str]:
    """(mean of angles in degrees in [0, 360), reason). Opposite hues cancel: NaN with a reason."""
    r = np.radians(np.asarray(h, dtype=np.float64))
    r = r[np.isfinite(r)]
    if not r.size:
        return float("nan"), "no hue"
    s, c = np.sin(r).mean(), np.cos(r).mean()
    if np.hypot(s, c) < CIRCULAR_TOL:
        return float("nan"), "hues cancel out (mean resultant length 0): no mean direction"
    return float(wrap_degrees(np.degrees(np.arctan2(s, c)))), ""


def circular_mean_deg(h: np.ndarray) -> float:
    """Mean of angles in degrees, in [0, 360); NaN when there is none (see circular_mean)."""
    return circular_mean(h)[0]


def pair_pool(n: int, max_pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All distinct pairs when n(n−1)/2 ≤ max_pairs, else a seeded uniform sample of distinct-index pairs."""
    if n * (n - 1) // 2 <= max_pairs:
        return np.triu_indices(n, k=1)
    i = rng.integers(0, n, size=max_pairs)
    return i, (i + rng.integers(1, n, size=max_pairs)) % n  # uniform over j ≠ i


def mean_pairwise_de2000(lab: np.ndarray, max_pairs: int = 200_000, seed: int = 0) -> tuple[float, int]:
    """(mean ΔE2000 over distinct pairs, pairs used). All pairs when n(n−1)/2 ≤ max_pairs, else a seeded
    uniform sample of max_pairs distinct-index pairs. Vectorised (one library call per pair block)."""
    lab = np.asarray(lab, dtype=np.float64)
    if len(lab) < 2:
        return float("nan"), 0
    i, j = pair_pool(len(lab), max_pairs, np.random.default_rng(seed))
    return float(delta_e2000(lab[i], lab[j]).mean()), len(i)


def replicate_stats(m: np.ndarray, L: np.ndarray, C: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray,
                    pair_de: np.ndarray) -> np.ndarray:
    """(L_mean, C_mean, diversity) of replicates given as image multiplicities m (replicates × items).

    Diversity averages ΔE2000 over position pairs that are different images, Σ_{i≠j} m_i m_j D_ij /
    Σ_{i≠j} m_i m_j over the pair pool; copies of one image are not pairs."""
    M = m.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = m[:, pair_i] * m[:, pair_j]
        return np.column_stack([(m @ L) / M, (m @ C) / M, (w @ pair_de) / w.sum(axis=1)])


def _cluster_pair_sums(inv: np.ndarray, P: int, i: np.ndarray, j: np.ndarray, de: np.ndarray):
    key = inv[i] * P + inv[j]
    A = np.bincount(key, weights=de, minlength=P * P).reshape(P, P)
    N = np.bincount(key, minlength=P * P).reshape(P, P).astype(float)
    return A, N


def _group_statistic(L, C, inv, P, pair_i, pair_j, pair_de):
    totals = np.column_stack([np.bincount(inv, minlength=P), np.bincount(inv, weights=L, minlength=P),
                              np.bincount(inv, weights=C, minlength=P)]).astype(float)
    A, N = _cluster_pair_sums(inv, P, pair_i, pair_j, pair_de)

    dA, dN = np.diag(A).copy(), np.diag(N).copy()

    def stat(w: np.ndarray) -> np.ndarray:
        s = w @ totals
        extra = w * w - w  # pairs between two draws of the same prompt: left out (see the module docstring)
        with np.errstate(invalid="ignore", divide="ignore"):
            div = (((w @ A) * w).sum(axis=1) - extra @ dA) / (((w @ N) * w).sum(axis=1) - extra @ dN)
            return np.column_stack([s[:, 1] / s[:, 0], s[:, 2] / s[:, 0], div])

    return stat


def skin_summary(df: pd.DataFrame, by: Sequence[str] = ("model", "label"), cluster: str | None = "prompt_id",
                 n_boot: int = 500, ci: float = 0.95, max_pairs: int = 200_000, seed: int = 0,
                 boot_max_pairs: int | None = None, method: str = "percentile") -> pd.DataFrame:
    """Per group of `by`: n, mean/median/sd L*, mean/median C*, circular-mean hue (+ reason),
    diversity (mean pairwise ΔE2000) and cluster-bootstrap CIs (resampling `cluster`, e.g. prompts,
    within each group) of L_mean, C_mean and diversity, each with a `_reason` when it has none.
    Rows with missing L* are left out. The point estimate and every replicate use one seeded pool of at
    most `max_pairs` pairs (`boot_max_pairs` is accepted for the earlier API and ignored)."""
    by = list(by)
    data = df[df["L"].notna()]
    rng = np.random.default_rng(seed)
    rows = []
    for key, g in data.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        lab = g[["L", "a", "b"]].to_numpy(dtype=np.float64)
        L, C = g["L"].to_numpy(np.float64), g["C"].to_numpy(np.float64)
        pair_i, pair_j = pair_pool(len(g), max_pairs, np.random.default_rng(seed))
        pair_de = delta_e2000(lab[pair_i], lab[pair_j]) if len(pair_i) else np.zeros(0)
        h_mean, h_reason = circular_mean(g["h"]) if "h" in g else (np.nan, "no hue column")
        row = dict(zip(by, key)) | {
            "n": len(g), "L_mean": L.mean(), "L_median": float(np.median(L)),
            "L_sd": float(np.std(L, ddof=1)) if len(g) > 1 else np.nan, "C_mean": C.mean(),
            "C_median": float(np.median(C)), "h_mean": h_mean, "h_mean_reason": h_reason,
            "h_median": g["h"].median() if "h" in g else np.nan,
            "diversity_de2000": float(pair_de.mean()) if len(pair_de) else np.nan, "diversity_pairs": len(pair_i)}
        if n_boot > 0:
            clusters = g[cluster].to_numpy() if cluster and cluster in g else np.arange(len(g))
            _, inv = np.unique(clusters.astype(str), return_inverse=True)
            P = int(inv.max()) + 1
            stat = _group_statistic(L, C, inv, P, pair_i, pair_j, pair_de)
            ivs = resample(stat, P, n_boot=n_boot, level=ci, seed=int(rng.integers(2**32)), method=method)
            for iv, name in zip(ivs, ("L_mean", "C_mean", "diversity_de2000")):
                row[f"{name}_lo"], row[f"{name}_hi"], row[f"{name}_reason"] = iv.low, iv.high, iv.reason
        rows.append(row)
    return pd.DataFrame(rows)
