"""Group summaries of skin colour: mean/median L*, C*, hue; diversity = mean pairwise ΔE2000 among the
group's skin colours (vectorised, seeded pair capping for large groups); cluster-bootstrap CIs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from biasaudit.faces.colour import delta_e2000


def circular_mean_deg(h: np.ndarray) -> float:
    """Mean of angles in degrees, in [0, 360) (hue is circular)."""
    r = np.radians(np.asarray(h, dtype=np.float64))
    return float(np.mod(np.degrees(np.arctan2(np.sin(r).mean(), np.cos(r).mean())), 360.0)) if r.size else np.nan


def mean_pairwise_de2000(lab: np.ndarray, max_pairs: int = 200_000, seed: int = 0) -> tuple[float, int]:
    """(mean ΔE2000 over distinct pairs, pairs used). All pairs when n(n−1)/2 ≤ max_pairs, else a seeded
    uniform sample of max_pairs distinct-index pairs. Vectorised (one library call per pair block)."""
    lab = np.asarray(lab, dtype=np.float64)
    n = len(lab)
    total = n * (n - 1) // 2
    if total == 0:
        return float("nan"), 0
    if total <= max_pairs:
        i, j = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        i = rng.integers(0, n, size=max_pairs)
        j = (i + rng.integers(1, n, size=max_pairs)) % n  # uniform over j ≠ i
    return float(delta_e2000(lab[i], lab[j]).mean()), len(i)


def _stats(g: pd.DataFrame, max_pairs: int, seed: int) -> dict[str, float]:
    lab = g[["L", "a", "b"]].to_numpy(dtype=np.float64)
    div, pairs = mean_pairwise_de2000(lab, max_pairs, seed)
    return {"n": len(g), "L_mean": g["L"].mean(), "L_median": g["L"].median(), "L_sd": g["L"].std(ddof=1),
            "C_mean": g["C"].mean(), "C_median": g["C"].median(), "h_mean": circular_mean_deg(g["h"]),
            "h_median": g["h"].median(), "diversity_de2000": div, "diversity_pairs": pairs}


def replicate_stats(m: np.ndarray, L: np.ndarray, C: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray,
                    pair_de: np.ndarray) -> np.ndarray:
    """(L_mean, C_mean, diversity) of each bootstrap replicate given as multiplicities m (replicates × items).

    Diversity is the mean ΔE2000 over distinct positions of the resampled multiset, where copies of one
    image are pairs at distance 0: Σ_{i≠j} m_i m_j D_ij / (M(M−1)), M = Σ m_i. The sum runs over a fixed
    pool of distinct-image pairs (all of them, or a seeded sample) weighted by m_i m_j, so no replicate
    materialises its images or an n×n matrix."""
    M = m.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        l_mean = (m @ L) / M
        c_mean = (m @ C) / M
        w = m[:, pair_i] * m[:, pair_j]
        pooled = (w @ pair_de) / w.sum(axis=1)
        distinct = M * M - (m * m).sum(axis=1)  # ordered position pairs that are different images
        diversity = np.where(distinct == 0, 0.0, pooled * distinct) / (M * (M - 1))
    return np.column_stack([l_mean, c_mean, diversity])


def _pair_pool(n: int, max_pairs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if n * (n - 1) // 2 <= max_pairs:
        return np.triu_indices(n, k=1)
    i = rng.integers(0, n, size=max_pairs)
    return i, (i + rng.integers(1, n, size=max_pairs)) % n


def skin_summary(df: pd.DataFrame, by: Sequence[str] = ("model", "label"), cluster: str | None = "prompt_id",
                 n_boot: int = 500, ci: float = 0.95, max_pairs: int = 200_000, seed: int = 0,
                 boot_max_pairs: int = 5_000) -> pd.DataFrame:
    """Per group of `by`: n, mean/median/sd L*, mean/median C*, circular-mean hue, diversity (mean pairwise
    ΔE2000) and cluster-bootstrap percentile CIs (resampling `cluster`, e.g. prompts, within each group)
    of L_mean, C_mean and diversity. Rows with missing L* are left out. The bootstrap is vectorised over
    replicates (multiplicity matrices, in chunks); diversity uses a seeded pool of `boot_max_pairs` pairs."""
    by = list(by)
    data = df[df["L"].notna()]
    rng = np.random.default_rng(seed)
    rows = []
    for key, g in data.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key)) | _stats(g, max_pairs, seed)
        if n_boot > 0 and len(g) >= 2:
            clusters = g[cluster].to_numpy() if cluster and cluster in g else np.arange(len(g))
            _, inv = np.unique(clusters, return_inverse=True)
            n_clusters, n = int(inv.max()) + 1, len(g)
            L, C = g["L"].to_numpy(np.float64), g["C"].to_numpy(np.float64)
            lab = g[["L", "a", "b"]].to_numpy(dtype=np.float64)
            pair_i, pair_j = _pair_pool(n, boot_max_pairs, rng)
            pair_de = delta_e2000(lab[pair_i], lab[pair_j])
            boots = []
            chunk = max(1, 4_000_000 // max(n, len(pair_i)))  # bounded memory per chunk of replicates
            for start in range(0, n_boot, chunk):
                b = min(chunk, n_boot - start)
                picks = rng.integers(0, n_clusters, size=(b, n_clusters))
                counts = np.zeros((b, n_clusters))
                np.add.at(counts, (np.arange(b)[:, None], picks), 1.0)
                boots.append(replicate_stats(counts[:, inv], L, C, pair_i, pair_j, pair_de))
            lo, hi = np.nanquantile(np.vstack(boots), [(1 - ci) / 2, 1 - (1 - ci) / 2], axis=0)
            for k, name in enumerate(("L_mean", "C_mean", "diversity_de2000")):
                row[f"{name}_lo"], row[f"{name}_hi"] = lo[k], hi[k]
        rows.append(row)
    return pd.DataFrame(rows)
