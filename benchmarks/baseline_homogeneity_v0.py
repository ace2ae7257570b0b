"""Homogeneity gap from group sums in O(N·d) time and memory (DESIGN.md), never an N×N matrix.

For L2-normalised embeddings x_i grouped into g with n_g members, S_g = Σ_{i∈g} x_i, S = Σ_g S_g:

    intra_g = (‖S_g‖² − Σ_{i∈g}‖x_i‖²) / (n_g (n_g − 1))   mean cosine over distinct pairs inside g
    inter_g = S_g · (S − S_g) / (n_g (N − n_g))             mean cosine between g and the rest
    gap_g   = intra_g − inter_g

(Σ‖x_i‖² = n_g for unit rows; using the sum keeps the identity exact in floating point.) All sums are
accumulated in float64. Uncertainty: a cluster bootstrap that resamples prompts (clusters) with
replacement, computed from per-(prompt, group) sums, and a permutation test that shuffles the group
labels, both vectorised over replicates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import sparse

SMALL_GROUP = 50  # the paper's L* < 40 facial result rests on 40 images: flag groups below this


def l2_normalise(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in float64 (zero rows stay zero)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def _codes(groups: Sequence | np.ndarray, categories: Sequence | None = None) -> tuple[np.ndarray, list]:
    cat = pd.Categorical(np.asarray(groups, dtype=object), categories=categories)
    return np.asarray(cat.codes, dtype=np.int64), list(cat.categories)


def group_sums(X: np.ndarray, codes: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S: G×d sums, n: G counts, q: G sums of squared norms) for codes in [0, G); code −1 is dropped."""
    keep = codes >= 0
    X, codes = X[keep], codes[keep]
    ind = sparse.csr_matrix((np.ones(len(codes)), (codes, np.arange(len(codes)))), shape=(n_groups, len(codes)))
    S = np.asarray(ind @ X, dtype=np.float64)
    n = np.bincount(codes, minlength=n_groups).astype(np.float64)
    q = np.bincount(codes, weights=np.einsum("ij,ij->i", X, X), minlength=n_groups)
    return S, n, q


def streamed_group_sums(X: np.ndarray, codes: np.ndarray, n_groups: int, normalise: bool = True,
                        chunk: int = 4096) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """group_sums over row chunks (each normalised in float64): memory O(chunk·d + G·d), so a float32
    N×d matrix (or a memory-mapped .npy) is never copied whole."""
    d = X.shape[1] if X.ndim == 2 else 0
    S, n, q = np.zeros((n_groups, d)), np.zeros(n_groups), np.zeros(n_groups)
    for start in range(0, len(codes), chunk):
        Xc = np.asarray(X[start:start + chunk], dtype=np.float64)
        Xc = l2_normalise(Xc) if normalise else Xc
        Sc, nc, qc = group_sums(Xc, codes[start:start + chunk], n_groups)
        S += Sc
        n += nc
        q += qc
    return S, n, q


def gap_from_sums(S: np.ndarray, n: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """intra, inter, gap per group from sums (any leading batch axes: S …×G×d, n and q …×G)."""
    total = S.sum(axis=-2, keepdims=True)
    N = n.sum(axis=-1, keepdims=True)
    sq = np.einsum("...gd,...gd->...g", S, S)
    cross = np.einsum("...gd,...gd->...g", S, total) - sq
    with np.errstate(invalid="ignore", divide="ignore"):
        intra = np.where(n >= 2, (sq - q) / (n * (n - 1)), np.nan)
        rest = N - n
        inter = np.where((n >= 1) & (rest >= 1), cross / (n * rest), np.nan)
    return intra, inter, intra - inter


def homogeneity_gap(X: np.ndarray, groups: Sequence, categories: Sequence | None = None,
                    small_group: int = SMALL_GROUP, normalise: bool = True) -> pd.DataFrame:
    """Per group: n, intra, inter, gap, small (flag), reason. Rows whose group is NaN/None are dropped.

    `categories` fixes the groups reported (absent ones get n = 0 and a reason)."""
    codes, cats = _codes(groups, categories)
    S, n, q = streamed_group_sums(X, codes, len(cats), normalise)
    intra, inter, gap = gap_from_sums(S, n, q)
    reason = np.where(n == 0, "empty group", np.where(n < 2, "fewer than 2 members: no pairs", ""))
    reason = np.where((reason == "") & (n == n.sum()), "single group: no rest to compare with", reason)
    return pd.DataFrame({"group": cats, "n": n.astype(int), "intra": intra, "inter": inter, "gap": gap,
                         "small": n < small_group, "reason": reason})


def bootstrap_gap(X: np.ndarray, groups: Sequence, clusters: Sequence, n_boot: int = 1000, seed: int = 0,
                  ci: float = 0.95, categories: Sequence | None = None, normalise: bool = True,
                  chunk: int = 256) -> pd.DataFrame:
    """Cluster-bootstrap percentile CIs of intra, inter and gap: resample clusters (prompts) with
    replacement; a resampled cluster contributes all its rows. Cost O(B·(cells)·d) from the per
    (cluster, group) sums, never touching pairs. Returns group, {intra,inter,gap}_{lo,hi}, n_boot."""
    X = l2_normalise(X) if normalise else np.asarray(X, dtype=np.float64)
    gcodes, cats = _codes(groups, categories)
    ccodes, _ = _codes(clusters)
    keep = (gcodes >= 0) & (ccodes >= 0)
    G, P = len(cats), int(ccodes.max()) + 1 if keep.any() else 0
    cell = ccodes[keep] * G + gcodes[keep]
    Sc, nc, qc = group_sums(X[keep], cell, P * G)
    Sc, nc, qc = Sc.reshape(P, G, -1), nc.reshape(P, G), qc.reshape(P, G)
    d = Sc.shape[-1]
    flat = Sc.reshape(P, G * d)
    chunk = max(1, min(chunk, int(2e7 // max(1, G * d))))  # keep each b×G×d block near 160 MB
    rng = np.random.default_rng(seed)
    stats = []
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        W = rng.multinomial(P, np.full(P, 1.0 / P), size=b).astype(np.float64)  # b×P cluster counts
        S = (W @ flat).reshape(b, G, d)
        stats.append(np.stack(gap_from_sums(S, W @ nc, W @ qc), axis=0))  # 3×b×G
    allstats = np.concatenate(stats, axis=1)
    alpha = (1 - ci) / 2
    lo, hi = np.nanquantile(allstats, [alpha, 1 - alpha], axis=1)  # 3×G each
    out = pd.DataFrame({"group": cats})
    for k, name in enumerate(("intra", "inter", "gap")):
        out[f"{name}_lo"], out[f"{name}_hi"] = lo[k], hi[k]
    out["n_boot"] = n_boot
    return out


def permutation_pvalue(X: np.ndarray, groups: Sequence, n_perm: int = 1000, seed: int = 0,
                       categories: Sequence | None = None, normalise: bool = True, chunk: int = 64) -> pd.DataFrame:
    """One-sided permutation p-value that each group's gap exceeds what shuffled labels give:
    p = (1 + #{gap_perm ≥ gap_obs}) / (1 + n_perm). Each chunk of permutations is one sparse
    (chunk·G × N) @ (N × d) product: O(n_perm·N·d), no pairs."""
    X = l2_normalise(X) if normalise else np.asarray(X, dtype=np.float64)
    codes, cats = _codes(groups, categories)
    keep = codes >= 0
    X, codes = X[keep], codes[keep]
    G, N = len(cats), len(codes)
    q_all = np.einsum("ij,ij->i", X, X)
    S0, n0, qq0 = group_sums(X, codes, G)
    observed = gap_from_sums(S0, n0, qq0)[2]
    rng = np.random.default_rng(seed)
    exceed = np.zeros(G)
    for start in range(0, n_perm, chunk):
        b = min(chunk, n_perm - start)
        perm = np.stack([rng.permutation(codes) for _ in range(b)])  # b×N
        rows = (np.arange(b)[:, None] * G + perm).ravel()
        ind = sparse.csr_matrix((np.ones(b * N), (rows, np.tile(np.arange(N), b))), shape=(b * G, N))
        S = np.asarray(ind @ X).reshape(b, G, -1)
        q = np.asarray(ind @ q_all).reshape(b, G)
        gaps = gap_from_sums(S, np.broadcast_to(n0, (b, G)), q)[2]
        exceed += (gaps >= observed - 1e-12).sum(axis=0)
    p = np.where(np.isnan(observed), np.nan, (1 + exceed) / (1 + n_perm))
    return pd.DataFrame({"group": cats, "p_perm": p, "n_perm": n_perm})


def homogeneity_table(X: np.ndarray, meta: pd.DataFrame, by: str, within: str | None = "model",
              cluster: str | None = "prompt_id", n_boot: int = 1000, n_perm: int = 1000, seed: int = 0,
              small_group: int = SMALL_GROUP) -> pd.DataFrame:
    """Gap per group of `meta[by]`, computed separately inside each value of `meta[within]` (e.g. race
    within model: the rest is the same model's other images), with bootstrap CIs and p-values.
    Rows of `meta` align with rows of X; rows whose `by` is missing/'' are left out."""
    frames = []
    blocks = [(None, meta.index.to_numpy())] if within is None else [
        (key, idx.to_numpy()) for key, idx in meta.groupby(within, sort=True).groups.items()]
    pos = pd.Series(np.arange(len(meta)), index=meta.index)
    for key, idx in blocks:
        rows = pos.loc[idx].to_numpy()
        labels = meta[by].iloc[rows].astype(object).where(lambda s: s.notna() & (s != ""), None).to_numpy()
        Xb = X[rows]
        cats = sorted({v for v in labels if v is not None}, key=str)
        if not cats:
            continue
        res = homogeneity_gap(Xb, labels, categories=cats, small_group=small_group)
        if cluster is not None and n_boot > 0:
            res = res.merge(bootstrap_gap(Xb, labels, meta[cluster].iloc[rows].to_numpy(), n_boot=n_boot,
                                          seed=seed, categories=cats), on="group")
        if n_perm > 0:
            res = res.merge(permutation_pvalue(Xb, labels, n_perm=n_perm, seed=seed, categories=cats), on="group")
        res.insert(0, "grouping", by)
        if within is not None:
            res.insert(0, within, key)
        frames.append(res)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def similarity_by_bin(X: np.ndarray, bins: Sequence, categories: Sequence | None = None) -> pd.DataFrame:
    """Mean intra-bin cosine similarity (e.g. per L* bin) with n; the paper's 'similarity by skin tone'."""
    res = homogeneity_gap(X, bins, categories=categories)
    return res[["group", "n", "intra", "small", "reason"]].rename(columns={"intra": "mean_similarity"})


gap_table = homogeneity_table  # short alias
