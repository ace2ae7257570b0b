"""Homogeneity gap from group sums in O(N·d) time and memory, never an N×N matrix.

For L2-normalised embeddings x_i grouped into g with n_g members, S_g = Σ_{i∈g} x_i, S = Σ_g S_g:

    intra_g = (‖S_g‖² − n_g) / (n_g (n_g − 1))    mean cosine over distinct pairs inside g
    inter_g = S_g · (S − S_g) / (n_g (N − n_g))    mean cosine between g and the rest
    gap_g   = intra_g − inter_g

Rows that are zero or not finite have no direction: they are dropped, counted (`n_dropped`) and the
reason is given. X is read once in float32 row chunks (a memory-mapped .npy is never copied whole);
sums are accumulated across chunks in float64.

Uncertainty (the resampling engine, biasaudit.stats.resample):
- cluster bootstrap over prompts. With cluster weights w, ‖S_g*‖² = wᵀ K_g w, where K_g[c, c'] =
  S_cg · S_c'g is the Gram matrix of the per-(prompt, group) sums, so a replicate costs O(P²) and
  never touches d. Copy pairs are left out: an image is never paired with its own bootstrap duplicate
  (cosine 1), and more generally no pair joins two draws of the same prompt, so each draw behaves
  like a distinct prompt of the original design (gap_weight_statistic).
- permutation test of "the labels add similarity": by default labels are permuted *within* prompts
  (design 'within'), which asks whether race labels make images more alike than the prompt alone
  explains (H0: given the prompt, the embedding does not depend on the label). Design 'across'
  permutes over all images (H0: embeddings do not depend on the label at all): it also rejects when
  prompts shape both the embeddings and the label mix. Each chunk of permutations is one float32
  GEMM Xᵀ Z with Z the (N × chunk·(G−1)) one-hot of permuted labels scaled by 1/‖x_i‖, so a chunk
  costs about one pass over X.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import sparse

from biasaudit.contracts import MIN_PROMPTS_CI
from biasaudit.stats import kernels
from biasaudit.stats.resample import Replicates, intervals, p_adjust, replicates, sums_statistic

DESIGNS = ("within", "across")
ROW_CHUNK = 8192


def l2_normalise(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in float64 (zero rows stay zero)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def _codes(groups: Sequence | np.ndarray, categories: Sequence | None = None) -> tuple[np.ndarray, list]:
    cat = pd.Categorical(np.asarray(groups, dtype=object), categories=categories)
    return np.asarray(cat.codes, dtype=np.int64), list(cat.categories)


def _work_dtype(X: np.ndarray) -> type:
    """float64 input is summed in float64; anything else (float32 embeddings) in float32 BLAS."""
    return np.float64 if getattr(X, "dtype", None) == np.float64 else np.float32


def one_pass(X: np.ndarray, codes: np.ndarray, n_cells: int, normalise: bool = True, chunk: int = ROW_CHUNK
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One chunked pass over X: (S: cells×d float64 sums of the (normalised) rows, n: counts,
    q: sums of squared norms, scale: per row 1/‖x‖ (1 without normalising), 0 for a zero or
    non-finite row, which is left out). Code −1 rows are left out too."""
    codes = np.asarray(codes, dtype=np.int64)
    d = X.shape[1] if X.ndim == 2 else 0
    S, n, q = np.zeros((n_cells, d)), np.zeros(n_cells), np.zeros(n_cells)
    scale = np.zeros(len(codes))
    _accumulate(X, codes[:, None], normalise, chunk, S, n, q, scale)
    return S, n, q, scale


def _check_codes(codes: np.ndarray, n: int, what: str) -> None:
    """Codes run from −1 (none) to n − 1; the compiled loop would write out of bounds otherwise."""
    if codes.size and (int(codes.max()) >= n or int(codes.min()) < -1):
        raise ValueError(f"{what} code out of range: {int(codes.min())} to {int(codes.max())} for {n} {what}s "
                         "(codes run from −1, none, to n − 1)")


def _accumulate(X, cell, normalise, chunk, S, n, q, scale) -> None:
    """kernels.accumulate_cell_sums over `chunk` rows at a time, each converted to the working dtype
    (float16 or memory-mapped input; float32 and float64 arrays are read in place). The compiled loop does
    not check bounds, so a code outside [−1, cells) is refused here."""
    _check_codes(cell, len(S), "cell")
    if len(cell) != len(X):
        raise ValueError(f"{len(cell)} codes for {len(X)} rows of X")
    dtype = _work_dtype(X)
    block = kernels.block_rows(cell)
    for s in range(0, len(cell), chunk):
        kernels.accumulate_cell_sums(np.ascontiguousarray(X[s:s + chunk], dtype=dtype), cell[s:s + chunk],
                                     bool(normalise), S, n, q, scale[s:s + chunk], block)


def row_scales(X: np.ndarray, normalise: bool = True, chunk: int = ROW_CHUNK) -> np.ndarray:
    """Per row: 1/‖x‖ (1 when not normalising) for usable rows, 0 for zero or non-finite rows."""
    return one_pass(X, np.full(len(X), -1), 0, normalise, chunk)[3]


def group_sums(X: np.ndarray, codes: np.ndarray, n_groups: int, normalise: bool = False
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S: G×d sums, n: G counts, q: G sums of squared norms) for codes in [0, G); code −1, zero
    and non-finite rows are dropped."""
    return one_pass(X, codes, n_groups, normalise)[:3]


def streamed_group_sums(X: np.ndarray, codes: np.ndarray, n_groups: int, normalise: bool = True,
                        chunk: int = ROW_CHUNK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """group_sums in row chunks (kept for callers of the earlier API)."""
    return one_pass(X, codes, n_groups, normalise, chunk)[:3]


def gap_from_sums(S: np.ndarray, n: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """intra, inter, gap per group from sums (any leading batch axes: S …×G×d, n and q …×G)."""
    total = S.sum(axis=-2, keepdims=True)
    sq = np.einsum("...gd,...gd->...g", S, S)
    cross = np.einsum("...gd,...gd->...g", S, total) - sq
    return gap_from_products(sq, cross, n, q, n, n)


def gap_from_products(sq, cross, n, q, pairs_n2=None, copies=None):
    """intra, inter, gap from ‖S_g‖² (sq), S_g·(S − S_g) (cross), counts n and Σ‖x‖² (q).

    The intra denominator is n² − `copies` (n² − n without a bootstrap: the i = j pairs)."""
    N = n.sum(axis=-1, keepdims=True)
    copies = n if copies is None else copies
    with np.errstate(invalid="ignore", divide="ignore"):
        den = n * n - copies
        intra = np.where((n >= 2) & (den > 0), (sq - q) / np.where(den > 0, den, 1), np.nan)
        rest = N - n
        inter = np.where((n >= 1) & (rest >= 1), cross / (n * rest), np.nan)
    return intra, inter, intra - inter


def _reasons(n: np.ndarray) -> np.ndarray:
    reason = np.where(n == 0, "empty group", np.where(n < 2, "fewer than 2 members: no pairs", ""))
    return np.where((reason == "") & (n == n.sum()), "single group: no rest to compare with", reason)


def homogeneity_gap(X: np.ndarray, groups: Sequence, categories: Sequence | None = None, *,
                    small_group: int | None, normalise: bool = True) -> pd.DataFrame:
    """Per group: n, intra, inter, gap, small (flag: n below `small_group`; no column when it is None, as in the
    stages that measure and leave display thresholds to the analysis), n_dropped (zero/non-finite rows), reason.

    Rows whose group is NaN/None are left out. `categories` fixes the groups reported (absent ones
    get n = 0 and a reason)."""
    codes, cats = _codes(groups, categories)
    S, n, q, scale = one_pass(X, codes, len(cats), normalise)
    dropped = np.bincount(codes[(codes >= 0) & (scale == 0)], minlength=len(cats))
    intra, inter, gap = gap_from_sums(S, n, q)
    reason = _reasons(n).astype(object)
    for i, k in enumerate(dropped):
        if k:
            reason[i] = "; ".join(r for r in (reason[i], f"{k} zero or non-finite embedding rows dropped") if r)
    out = pd.DataFrame({"group": cats, "n": n.astype(int), "intra": intra, "inter": inter, "gap": gap,
                        "small": n < (small_group or 0), "n_dropped": dropped.astype(int), "reason": reason})
    return out if small_group is not None else out.drop(columns="small")


# ---------------------------------------------------------------- bootstrap

def cell_products(X: np.ndarray, gcodes: np.ndarray, ccodes: np.ndarray, n_groups: int, n_clusters: int,
                  normalise: bool = True) -> dict[str, np.ndarray]:
    """Per (cluster, group) cell sums reduced to Gram matrices: K[g] (P×P) = S_cg·S_c'g,
    T[g] (P×P) = S_cg·S_c' (S_c the cluster's total), counts n (P×G) and Σ‖x‖² q (P×G)."""
    return products_from_cells(*cell_sums(X, gcodes, ccodes, n_groups, n_clusters, normalise))


def cell_sums(X: np.ndarray, gcodes: np.ndarray, ccodes: np.ndarray, n_groups: int, n_clusters: int,
              normalise: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One pass over X: per (cluster, group) cell the sum of the unit rows S (P×G×d), the count n and
    Σ‖x‖² q (P×G)."""
    return cell_sums_many(X, [gcodes], ccodes, [n_groups], n_clusters, normalise)[0]


def cell_sums_many(X: np.ndarray, gcodes: Sequence[np.ndarray], ccodes: np.ndarray, n_groups: Sequence[int],
                   n_clusters: int, normalise: bool = True, chunk: int = ROW_CHUNK
                   ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """cell_sums of several labellings of the same rows in one pass over X: each row's norm and its additions
    to the cell of each labelling (weight 1/‖x_i‖) while the row is in cache (stats/kernels.py). Rows of code
    −1 (no group or no cluster) and zero or non-finite rows are left out; `chunk` rows at a time."""
    ccodes = np.asarray(ccodes, dtype=np.int64)
    sizes = [int(g) for g in n_groups]
    _check_codes(ccodes, n_clusters, "cluster")
    for j, (g, G) in enumerate(zip(gcodes, sizes)):
        _check_codes(np.asarray(g), G, f"group (labelling {j})")
    # labelling j's cells are the contiguous rows [P·o_j, P·o_{j+1}) of one S, so each labelling's P×G×d block
    # comes back C-contiguous (kernels.cell_dots reads it in place)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int) * n_clusters
    cells = [np.where((np.asarray(g, dtype=np.int64) >= 0) & (ccodes >= 0), o + ccodes * G + np.asarray(g), -1)
             for g, G, o in zip(gcodes, sizes, offsets[:-1])]
    cell = np.stack(cells, axis=1) if cells else np.zeros((len(ccodes), 0), np.int64)  # N × labellings
    d = X.shape[1] if X.ndim == 2 else 0
    S = np.zeros((int(offsets[-1]), d))
    n, q = np.zeros(int(offsets[-1])), np.zeros(int(offsets[-1]))
    _accumulate(X, cell, normalise, chunk, S, n, q, np.empty(len(ccodes)))
    return [(S[a:b].reshape(n_clusters, G, d), n[a:b].reshape(n_clusters, G), q[a:b].reshape(n_clusters, G))
            for a, b, G in zip(offsets[:-1], offsets[1:], sizes)]


def products_from_cells(S: np.ndarray, n: np.ndarray, q: np.ndarray) -> dict[str, np.ndarray]:
    """cell_products from the cell sums (P×G×d, P×G, P×G)."""
    Sg = np.moveaxis(S, 1, 0)  # G×P×d
    K = Sg @ Sg.transpose(0, 2, 1)  # BLAS; einsum without optimize would loop
    T = Sg @ S.sum(axis=1).T
    return {"K": K, "T": T, "n": n, "q": q}


def gap_weight_statistic(cells: dict[str, np.ndarray], exclude_copies: bool = True):
    """Weight statistic (b×P → b×3G: intra, inter, gap per group).

    With `exclude_copies`, a prompt drawn w_c times contributes its own pairs w_c times and no pair
    between two of its draws: such a pair is an image with its own duplicate (cosine 1) or two images
    of one prompt posing as a between-draw pair. Each draw then looks like a distinct prompt of the
    original design, so the replicates centre on the estimate."""
    K, T, n, q = cells["K"], cells["T"], cells["n"], cells["q"]
    R = T - K  # S_cg · (S_c' − S_c'g): group g of cluster c against the rest of cluster c'
    dK, dR = np.einsum("gpp->pg", K), np.einsum("gpp->pg", R)
    rest = n.sum(axis=1, keepdims=True) - n

    def quad(w: np.ndarray, M: np.ndarray) -> np.ndarray:  # wᵀ M_g w for every replicate and group: b×G
        return (np.matmul(w[None], M) * w[None]).sum(axis=-1).T

    def stat(w: np.ndarray) -> np.ndarray:
        sq, cross = quad(w, K), quad(w, R)
        nw, qw = w @ n, w @ q
        if not exclude_copies:
            return np.concatenate(gap_from_products(sq, cross, nw, qw), axis=1)
        extra = w * w - w
        N = nw.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            den_intra = nw * nw - extra @ (n * n) - nw
            intra = np.where(den_intra > 0, (sq - extra @ dK - qw) / np.where(den_intra > 0, den_intra, 1), np.nan)
            den_inter = nw * (N - nw) - extra @ (n * rest)
            inter = np.where(den_inter > 0, (cross - extra @ dR) / np.where(den_inter > 0, den_inter, 1), np.nan)
        return np.concatenate([intra, inter, intra - inter], axis=1)

    return stat


def gap_replicates(X: np.ndarray, groups: Sequence, clusters: Sequence, n_boot: int = 1000, seed: int = 0,
                   categories: Sequence | None = None, normalise: bool = True, method: str = "percentile"
                   ) -> tuple[Replicates, list]:
    gcodes, cats = _codes(groups, categories)
    ccodes, _ = _codes(clusters)
    P = int(ccodes.max()) + 1 if len(ccodes) and ccodes.max() >= 0 else 0
    cells = cell_products(X, gcodes, ccodes, len(cats), P, normalise)
    return replicates(gap_weight_statistic(cells), P, n_boot=n_boot, seed=seed, method=method), cats


def bootstrap_gap(X: np.ndarray, groups: Sequence, clusters: Sequence, n_boot: int = 1000, seed: int = 0,
                  ci: float = 0.95, categories: Sequence | None = None, normalise: bool = True,
                  chunk: int = 256, method: str = "percentile") -> pd.DataFrame:
    """Cluster-bootstrap CIs of intra, inter and gap (resampling clusters = prompts, copy pairs left
    out). Returns group, {intra,inter,gap}_{lo,hi}, gap_se, ci_reason, n_boot."""
    rep, cats = gap_replicates(X, groups, clusters, n_boot, seed, categories, normalise, method)
    ivs = intervals(rep, ci, method)
    G = len(cats)
    out = pd.DataFrame({"group": cats})
    for k, name in enumerate(("intra", "inter", "gap")):
        out[f"{name}_lo"] = [ivs[k * G + i].low for i in range(G)]
        out[f"{name}_hi"] = [ivs[k * G + i].high for i in range(G)]
    out["gap_se"] = [ivs[2 * G + i].se for i in range(G)]
    out["ci_reason"] = [ivs[2 * G + i].reason for i in range(G)]
    out["n_boot"] = n_boot
    return out


# ---------------------------------------------------------------- permutation test

def _permuted_codes(codes: np.ndarray, clusters: np.ndarray | None, b: int, rng: np.random.Generator) -> np.ndarray:
    """(b, N) label codes permuted over all rows (clusters None) or within each cluster."""
    if clusters is None:
        return rng.permuted(np.broadcast_to(codes, (b, len(codes))), axis=1)
    order = np.argsort(clusters, kind="stable")  # rows grouped by cluster
    key = clusters[order][None, :] + rng.random((b, len(codes)))  # shuffle inside each cluster block
    shuffled = order[np.argsort(key, axis=1)]
    out = np.empty((b, len(codes)), dtype=codes.dtype)
    out[:, order] = codes[shuffled]
    return out


def permutation_pvalue(X: np.ndarray, groups: Sequence, n_perm: int = 1000, seed: int = 0,
                       categories: Sequence | None = None, normalise: bool = True, chunk: int = 64,
                       clusters: Sequence | None = None, design: str | None = None) -> pd.DataFrame:
    """One-sided permutation p-value that each group's gap exceeds what permuted labels give:
    p = (1 + #{gap_perm ≥ gap_obs}) / (1 + n_perm). design 'within' permutes inside `clusters`
    (prompts), 'across' over all rows; None = 'within' when clusters are given, else 'across'.
    Returns group, p_perm, n_perm, design."""
    design = design or ("within" if clusters is not None else "across")
    if design not in DESIGNS:
        raise ValueError(f"permutation design {design!r}: expected one of {DESIGNS}")
    codes, cats = _codes(groups, categories)
    G = len(cats)
    scale = row_scales(X, normalise)
    keep = (codes >= 0) & (scale > 0)
    if design == "within":
        if clusters is None:
            raise ValueError("design 'within' needs the clusters (prompts) to permute within")
        ccodes = _codes(clusters)[0]
        keep &= ccodes >= 0
        ccodes = ccodes[keep]
    rows = np.flatnonzero(keep)
    codes, w = codes[rows], scale[rows].astype(np.float32)
    N = len(rows)
    result = pd.DataFrame({"group": cats, "p_perm": np.nan, "n_perm": n_perm, "design": design})
    if N < 3 or G < 2 or n_perm <= 0:
        return result
    # Usable rows as one float32 matrix: X itself when nothing is dropped (no copy), else the kept rows.
    Xk = np.asarray(X, dtype=np.float32) if N == len(X) and X.dtype == np.float32 else np.ascontiguousarray(
        np.concatenate([np.asarray(X[r], np.float32) for r in np.array_split(rows, max(1, N // ROW_CHUNK))]))
    total = (w @ Xk).astype(np.float64)
    n = np.bincount(codes, minlength=G).astype(np.float64)
    q = n.copy() if normalise else np.bincount(codes, weights=np.einsum("ij,ij->i", Xk, Xk, dtype=np.float64),
                                               minlength=G)
    rng = np.random.default_rng(seed)
    cl = ccodes if design == "within" else None

    d = Xk.shape[1]

    def gaps(perm: np.ndarray) -> np.ndarray:  # perm: b×N codes → b×G gaps
        b = len(perm)
        if d >= 128:  # wide embeddings: one float32 GEMM against the scaled one-hot (G − 1 columns per permutation)
            Z = np.zeros((N, b * (G - 1)), np.float32)
            r, k = np.nonzero(perm.T < G - 1)
            Z[r, k * (G - 1) + perm.T[r, k]] = w[r]
            Sg = (Xk.T @ Z).T.reshape(b, G - 1, -1).astype(np.float64)
        else:  # narrow: a sparse (b·(G−1) × N) indicator is cheaper than zero-filling Z
            keep = perm < G - 1
            rows = (np.arange(b)[:, None] * (G - 1) + perm)[keep]
            cols = np.broadcast_to(np.arange(N), (b, N))[keep]
            ind = sparse.csr_matrix((np.broadcast_to(w, (b, N))[keep], (rows, cols)), shape=(b * (G - 1), N))
            Sg = np.asarray(ind @ Xk, dtype=np.float64).reshape(b, G - 1, -1)
        S = np.concatenate([Sg, (total - Sg.sum(axis=1))[:, None, :]], axis=1)
        return gap_from_sums(S, np.broadcast_to(n, (b, G)), np.broadcast_to(q, (b, G)))[2]

    observed = gaps(codes[None, :])[0]
    exceed = np.zeros(G)
    for start in range(0, n_perm, chunk):
        b = min(chunk, n_perm - start)
        exceed += (gaps(_permuted_codes(codes, cl, b, rng)) >= observed - 1e-6).sum(axis=0)
    result["p_perm"] = np.where(np.isnan(observed), np.nan, (1 + exceed) / (1 + n_perm))
    return result


# ---------------------------------------------------------------- tables

def homogeneity_table(X: np.ndarray, meta: pd.DataFrame, by: str, within: str | None = "model",
                      cluster: str | None = "prompt_id", n_boot: int = 1000, n_perm: int = 1000, seed: int = 0, *,
                      small_group: int | None, method: str = "percentile", design: str = "within",
                      p_adjust_method: str | None = "holm", level: float = 0.95) -> pd.DataFrame:
    """Gap per group of `meta[by]`, computed separately inside each value of `meta[within]` (e.g. race
    within model: the rest is the same model's other images), with bootstrap CIs, permutation p-values
    (`p_value`) and, when `p_adjust_method` is set, their adjustment over the rows of this table
    (`p_adjusted`). Rows of `meta` align with rows of X; rows whose `by` is missing/'' are left out."""
    frames = []
    blocks = [(None, meta.index.to_numpy())] if within is None else [
        (key, idx.to_numpy()) for key, idx in meta.groupby(within, sort=True).groups.items()]
    pos = pd.Series(np.arange(len(meta)), index=meta.index)
    if design == "within" and cluster is None:
        design = "across"
    for key, idx in blocks:
        rows = pos.loc[idx].to_numpy()
        labels = meta[by].iloc[rows].astype(object).where(lambda s: s.notna() & (s != ""), None).to_numpy()
        Xb = X[rows]
        cats = sorted({v for v in labels if v is not None}, key=str)
        if not cats:
            continue
        res = homogeneity_gap(Xb, labels, categories=cats, small_group=small_group)
        clusters = meta[cluster].iloc[rows].to_numpy() if cluster is not None else None
        if cluster is not None and n_boot > 0:
            res = res.merge(bootstrap_gap(Xb, labels, clusters, n_boot=n_boot, seed=seed, categories=cats,
                                          ci=level, method=method), on="group")
        if n_perm > 0:
            res = res.merge(permutation_pvalue(Xb, labels, n_perm=n_perm, seed=seed, categories=cats,
                                               clusters=clusters, design=design), on="group")
            res["p_value"] = res["p_perm"]
        res.insert(0, "grouping", by)
        if within is not None:
            res.insert(0, within, key)
        frames.append(res)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if p_adjust_method and "p_value" in out:
        out = add_p_adjusted(out, p_adjust_method)
    return out


def add_p_adjusted(table: pd.DataFrame, method: str = "holm") -> pd.DataFrame:
    """`p_adjusted` over every row of the table (its groups, spaces and models) and `p_adjust_method`."""
    return table.assign(p_adjusted=p_adjust(table["p_value"].to_numpy(float), method), p_adjust_method=method)


def similarity_by_bin(X: np.ndarray, bins: Sequence, categories: Sequence | None = None, *,
                      small_group: int | None) -> pd.DataFrame:
    """Mean intra-bin cosine similarity (e.g. per L* bin) with n; the paper's 'similarity by skin tone'."""
    res = homogeneity_gap(X, bins, categories=categories, small_group=small_group)
    return res[[c for c in ("group", "n", "intra", "small", "reason") if c in res]].rename(
        columns={"intra": "mean_similarity"})


gap_table = homogeneity_table  # short alias


def relative_gaps(model_gaps: pd.DataFrame, baseline_gaps: pd.DataFrame) -> pd.DataFrame:
    """Each model's gap per (space, group) next to the baseline's, and their difference.

    Both tables have columns space, group, gap, n (the homogeneity table, plus the embedding space);
    the baseline has one row per (space, group)."""
    base = baseline_gaps[["space", "group", "gap", "n"]].rename(columns={"gap": "baseline_gap", "n": "baseline_n"})
    out = model_gaps.merge(base, on=["space", "group"], how="left")
    out["gap_minus_baseline"] = out["gap"] - out["baseline_gap"]
    return out


# ---------------------------------------------------------------- within-prompt gap (the headline estimator)
#
# The unstratified gap above counts pairs across prompts. Images of one prompt look alike, so a group
# concentrated in a few prompts gets a positive gap with no effect of its own. The within-prompt gap
# compares only pairs that share a prompt p:
#
#     intra_pg = (‖S_pg‖² − q_pg) / (n_pg (n_pg − 1))       S_pg = Σ x over group g in prompt p
#     inter_pg = S_pg · (S_p − S_pg) / (n_pg (m_p − n_pg))   S_p = Σ x over the labelled images of p
#     Δ_pg     = intra_pg − inter_pg                          (m_p labelled images, q_pg = Σ ‖x‖²)
#
# and averages the prompts with the two-sample weights w_pg = n_pg (m_p − n_pg) / m_p = 1 / (1/n_pg +
# 1/(m_p − n_pg)) where Δ_pg is defined (n_pg ≥ 2, m_p − n_pg ≥ 1), else 0: a prompt counts as much as
# its difference of two means is precise (a prompt the group dominates has few "others" to compare
# with), and a prompt's own level of similarity enters intra and inter with the same weight, so it
# cancels inside each prompt whatever the group's prompt mix. (Weighting by n_pg alone let a few
# prompts dominated by the group carry the estimate: its CI covered 0.92-0.93 at 50 prompts against
# 0.945 with these weights; equal weights per prompt over-cover at 0.97 with a 1.6× wider interval.)
#
#     wp_gap_g = Σ_p w_pg Δ_pg / Σ_p w_pg
#
# Estimand: the population ratio E_p[w_pg Δ_pg] / E_p[w_pg] over the population of prompts (and
# their images); the interval is a prompt-cluster bootstrap of the ratio of per-prompt totals (the
# resampling engine's sums_statistic). Over distinct pairs of unit rows, Σ cos = (‖S_pg‖² − Σ‖x‖²)/2
# inside g and S_pg · S_ph between g and h, so the point, the bootstrap and every permutation draw need
# only per-(prompt, group) sums: O(n_p · d) per prompt and draw, linear in the images per prompt. Only the
# near-duplicate pairs (cosine ≥ a threshold) are pairwise by nature: each prompt's Gram matrix, in row
# blocks, O(n_p² · d), below LSH_MIN_ROWS images per prompt, and a linear LSH screen from there (near_duplicate_pairs;
# benchmarks/results/homogeneity_scaling.txt).

@dataclass
class PromptBlocks:
    """The usable rows of X scaled to unit length, grouped by prompt: prompt p is rows bounds[p]:bounds[p + 1]
    of `units` (float32, or float64 for float64 input). The permutation test reads them in O(n_p · d) per
    prompt and draw; only the near-duplicate pairs of a prompt below LSH_MIN_ROWS form its Gram matrix, in row
    blocks."""

    prompts: list  # prompt names
    rows: list[np.ndarray]  # per prompt: indices into X of its usable rows
    n_dropped: np.ndarray  # per row of X: True where the row was zero or not finite (left out)
    units: np.ndarray  # (Σ n_p) × d unit rows, prompt by prompt
    bounds: np.ndarray  # P + 1 offsets into units
    coordinates: tuple[np.ndarray, np.ndarray] | None = None  # prompt_coordinates, built on first use

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)


def prompt_blocks(X: np.ndarray, prompts: Sequence, normalise: bool = True) -> PromptBlocks:
    """One pass over X, prompt by prompt: norms and unit rows of each prompt's usable rows. Rows without a
    prompt (NaN/None) and zero or non-finite rows are left out."""
    pcodes, names = _codes(prompts)
    order = np.argsort(pcodes, kind="stable")
    order = order[pcodes[order] >= 0]
    bounds = np.searchsorted(pcodes[order], np.arange(len(names) + 1))
    dtype = _work_dtype(X)
    U = np.empty((len(order), X.shape[1] if X.ndim == 2 else 0), dtype)  # each prompt's unit rows written in place
    rows, at = [], 0
    dropped = np.zeros(len(pcodes), dtype=bool)
    in_place = isinstance(X, np.ndarray) and X.flags.c_contiguous  # a prompt's adjacent rows are read as a view
    for p in range(len(names)):
        idx = order[bounds[p]:bounds[p + 1]]  # ascending: the sort is stable
        k = len(idx)
        Xp = np.asarray(X[idx[0]:idx[0] + k] if in_place and k and idx[-1] - idx[0] == k - 1 else X[idx], dtype=dtype)
        sq = np.einsum("ij,ij->i", Xp, Xp).astype(np.float64)
        good = np.isfinite(sq) & (sq > 0)
        if not good.all():
            dropped[idx[~good]] = True
            idx, Xp, sq = idx[good], Xp[good], sq[good]
        if normalise:
            np.multiply(Xp, (1.0 / np.sqrt(sq)).astype(dtype)[:, None], out=U[at:at + len(idx)])
        else:
            U[at:at + len(idx)] = Xp
        rows.append(idx)
        at += len(idx)
    return PromptBlocks(list(names), rows, dropped, U[:at], np.concatenate([[0], np.cumsum([len(r) for r in rows])]))


GRAM_ROWS = 128  # rows of a prompt's Gram matrix formed at once: small enough that the triangle wastes little

# the permutation test reads a prompt's rows in triangular coordinates when every prompt has at most this share
# of d usable rows (prompt_coordinates): then a draw adds about n_p / 2 numbers per row instead of d, 8× fewer or
# better; above it the unit rows themselves (n_p · d per draw: linear in the images per prompt)
COORDINATE_SHARE = 0.25


def prompt_coordinates(blocks: PromptBlocks) -> tuple[np.ndarray, np.ndarray]:
    """(C, lens): the rows the permutation test sums, aligned with blocks.units, and how many leading entries of
    each are read (kernels.permuted_cell_dots). Where every prompt has at most COORDINATE_SHARE · d rows, prompt
    p's rows in an n_p-dimensional basis of their span: its Gram matrix K_p = U_p U_pᵀ (a float32 GEMM for
    float32 rows, as the sums it replaces) factored by pivoted Cholesky (LAPACK ?pstrf, rank-revealing: copies
    and other dependent rows are fine), K_p = L Lᵀ in pivot order, and row i's coordinates are its row of L:
    ‖Σ_{i∈g} L_i‖² = 1_gᵀ K_p 1_g = ‖S_pg‖² and (Σ_g L_i)·(Σ_p L_i) = S_pg·S_p, exactly in exact arithmetic,
    and the row in pivot position k has at most k + 1 non-zero coordinates. Else the unit rows, read whole."""
    if blocks.coordinates is not None:
        return blocks.coordinates
    from scipy.linalg import lapack

    U = blocks.units
    n, d = U.shape
    sizes = np.diff(blocks.bounds)
    if n == 0 or sizes.max() > COORDINATE_SHARE * d:
        blocks.coordinates = (U, np.full(n, d, np.int64))
        return blocks.coordinates
    C = np.zeros((n, int(sizes.max())), U.dtype)
    lens = np.zeros(n, np.int64)
    for p in range(blocks.n_prompts):
        a, e = blocks.bounds[p], blocks.bounds[p + 1]
        if e == a:
            continue
        Up = U[a:e]
        c, piv, rank, info = lapack.dpstrf(np.asarray(Up @ Up.T, dtype=np.float64), lower=1)
        if info < 0:
            raise ValueError(f"pivoted Cholesky of prompt {blocks.prompts[p]!r}: LAPACK argument {-info}")
        rows = a + piv - 1
        C[rows, :rank] = np.tril(c)[:, :rank]
        lens[rows] = np.minimum(np.arange(1, e - a + 1), rank)
    blocks.coordinates = (C, lens)
    return blocks.coordinates


@functools.lru_cache(maxsize=4)
def _above_diagonal(k: int) -> np.ndarray:
    return np.triu(np.ones((k, k), dtype=bool), 1)


def _delta(n, q, sq, tot, m):
    """Per prompt (…×G): intra, inter, Δ and the weight w = n (m − n) / m where Δ is defined, else 0."""
    rest = m[..., None] - n
    ok = (n >= 2) & (rest >= 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        intra = np.where(ok, (sq - q) / np.where(ok, n * (n - 1), 1), 0.0)
        inter = np.where(ok, (tot - sq) / np.where(ok, n * rest, 1), 0.0)
        w = np.where(ok, n * rest / np.where(ok, m[..., None], 1), 0.0)
    return intra, inter, intra - inter, w


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def within_prompt_totals_from_cells(S: np.ndarray, n: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(P, 4G) per-prompt totals [w·Δ, w·intra, w·inter, w] of one labelling from the per-(prompt, group)
    sums of one pass over X (cell_sums): ‖S_pg‖² and S_pg · S_p need no pair, so the point estimate
    and its bootstrap cost one pass."""
    S = np.ascontiguousarray(S, dtype=np.float64)
    sq, tot = np.empty(S.shape[:2]), np.empty(S.shape[:2])
    kernels.cell_dots(S, sq, tot)
    intra, inter, delta, w = _delta(n, q, sq, tot, n.sum(axis=1))
    return np.concatenate([w * delta, w * intra, w * inter, w], axis=1)


def within_prompt_statistic(n_groups: int):
    """Column sums of within_prompt_totals_from_cells → (…, 3G): wp_gap, wp_intra, wp_inter per group."""

    def stat(s: np.ndarray) -> np.ndarray:
        G = n_groups
        w = s[..., 3 * G:]
        return np.concatenate([_ratio(s[..., :G], w), _ratio(s[..., G:2 * G], w), _ratio(s[..., 2 * G:3 * G], w)],
                              axis=-1)

    return stat


def _moments(terms: np.ndarray, g: int) -> np.ndarray:
    """(5, b, G) prompt sums Σa, Σw, Σa², Σaw, Σw² of the (k, b, 4G) per-prompt terms (a = w·Δ)."""
    a, w = terms[..., :g], terms[..., 3 * g:]
    return np.stack([a.sum(axis=0), w.sum(axis=0), (a * a).sum(axis=0), (a * w).sum(axis=0), (w * w).sum(axis=0)])


def _studentised(m: np.ndarray) -> np.ndarray:
    """Σa / √Σ(a − Δ̂ w)², Δ̂ = Σa / Σw: the within-prompt gap over its prompt-cluster (linearised) SE.
    Where the SE is 0 (one contributing prompt) the plain gap stands in: a group's statistic is the
    same kind in every draw, since a within-prompt shuffle keeps each prompt's group counts."""
    sa, sw, saa, saw, sww = m
    delta = _ratio(sa, sw)
    with np.errstate(invalid="ignore"):
        ss = saa - 2 * delta * saw + delta * delta * sww
    se_ok = ss > 1e-12 * np.maximum(saa, 1e-300)
    t = _ratio(sa, np.sqrt(np.where(se_ok, ss, 0.0)))
    return np.where(se_ok, t, delta)


@dataclass
class _Labelled:
    """One labelling's labelled usable rows, prompt by prompt: positions `idx` into blocks.units, their codes,
    per-prompt offsets `bounds` into idx, and the labelled counts m per prompt."""

    idx: np.ndarray
    codes: np.ndarray
    bounds: np.ndarray
    m: np.ndarray
    n_groups: int


def _labelled(blocks: PromptBlocks, codes: np.ndarray, n_groups: int) -> _Labelled:
    rows = np.concatenate(blocks.rows) if blocks.rows else np.zeros(0, np.int64)
    c = np.asarray(codes)[rows].astype(np.int16)
    keep = c >= 0
    prompt = np.repeat(np.arange(blocks.n_prompts), np.diff(blocks.bounds))
    m = np.bincount(prompt[keep], minlength=blocks.n_prompts)
    return _Labelled(np.flatnonzero(keep), c[keep], np.concatenate([[0], np.cumsum(m)]), m.astype(np.float64),
                     int(n_groups))


def _draw_terms(blocks: PromptBlocks, lab: _Labelled, drawn: np.ndarray) -> np.ndarray:
    """(P, b, 4G) per-prompt terms [w·Δ, w·intra, w·inter, w] of the (b, M) drawn codes of the labelled rows:
    ‖S_pg‖², S_pg·S_p, Σ‖u‖² and counts from kernels.permuted_cell_dots, O(n_p · d) per prompt and draw."""
    b, G, P = len(drawn), lab.n_groups, blocks.n_prompts
    sq, tot, q, cnt = (np.zeros((P, b, G)) for _ in range(4))
    rows, lens = prompt_coordinates(blocks)
    kernels.permuted_cell_dots(rows, lens, lab.idx, lab.bounds, np.ascontiguousarray(drawn), sq, tot, q, cnt)
    m = np.broadcast_to(lab.m[:, None], (P, b))
    intra, inter, delta, w = _delta(cnt, q, sq, tot, m)
    return np.concatenate([w * delta, w * intra, w * inter, w], axis=-1)


def _statistics(terms: np.ndarray, g: int, studentise: bool) -> np.ndarray:
    """(b, G + 1): each group's (studentised) within-prompt gap, then the pooled within-prompt gap."""
    s = _moments(terms, g)
    own = _studentised(s) if studentise else _ratio(s[0], s[1])
    return np.concatenate([own, _ratio(s[0].sum(axis=1, keepdims=True), s[1].sum(axis=1, keepdims=True))], axis=1)


DRAW_UNIFORMS = 1 << 17


def draw_within(lab: _Labelled, b: int, rng: np.random.Generator, design: str = "within") -> np.ndarray:
    """(b, M) codes of the labelled rows, shuffled within each prompt ('within') or over all of them
    ('across'): vectorised draws of uniforms, then a Fisher–Yates pass per segment (kernels). The uniforms
    come a few draws at a time (DRAW_UNIFORMS values, about 1 MB, stay in cache; all b × M at once were 100 MB
    at 1,000 images per prompt): the generator yields the same stream in either case, so the draws are
    identical."""
    seg = lab.bounds if design == "within" else np.array([0, len(lab.codes)])
    M = len(lab.codes)
    out = np.empty((b, M), np.int16)
    step = max(1, DRAW_UNIFORMS // max(M, 1))
    for t in range(0, b, step):
        kernels.shuffle_segments(lab.codes, seg, rng.random((min(step, b - t), M)), out[t:t + step])
    return out


def within_prompt_statistics(blocks: PromptBlocks, labellings: Sequence[tuple[np.ndarray, int]],
                             studentise: bool = True) -> list[np.ndarray]:
    """The observed test statistics of within_prompt_permutations, per labelling (G + 1): each group's
    within-prompt gap over its prompt-cluster SE (or the plain gap), then the pooled gap."""
    out = []
    for c, g in labellings:
        lab = _labelled(blocks, c, g)
        out.append(_statistics(_draw_terms(blocks, lab, lab.codes[None, :]), g, studentise)[0])
    return out


def _chunks(n_perm: int, first: int = 32, most: int = 256):
    """Draws per batch: `first`, then doubling up to `most`, summing to n_perm."""
    done = 0
    while done < n_perm:
        b = min(n_perm - done, first if done == 0 else min(done, most))
        yield b
        done += b


def within_prompt_permutations(blocks: PromptBlocks, labellings: Sequence[tuple[np.ndarray, int]], n_perm: int,
                               seed: int = 0, design: str = "within", stop_after: int = 0,
                               first_chunk: int = 32, max_chunk: int = 256, studentise: bool = True
                               ) -> tuple[list[np.ndarray], list[float], int]:
    """One-sided permutation p-values of every group's within-prompt gap and of each labelling's global
    statistic (the pooled within-prompt gap Σ w·Δ / Σ w over all groups): each labelling's codes are
    shuffled among its own labelled rows (unlabelled rows keep weight 0), within each prompt ('within') or
    across all prompts ('across'), the same number of draws for every labelling.

    Cost linear in the images per prompt: a draw needs, per prompt and group, only ‖S_pg‖², S_pg · S_p,
    Σ‖u‖² and the count (S_pg the sum of the group's unit rows), since over distinct pairs Σ cos =
    (‖S_pg‖² − Σ‖u‖²)/2 inside g and S_pg · S_ph between g and h: O(n_p · d) per prompt and draw
    (kernels.permuted_cell_dots), never a prompt's n_p × n_p Gram matrix
    (benchmarks/results/homogeneity_scaling.txt).

    A group's test asks whether its own members are more alike than the prompt's other labelled
    images. With `studentise` (the default) its statistic is the group's within-prompt gap over its
    prompt-cluster SE, recomputed in every draw (Chung & Romano 2013, Ann. Statist. 41:484): the test
    stays exact when labels are exchangeable within prompts, and is asymptotically valid (in the
    number of prompts) for H0 "this group's own gap is 0" when they are not — another group's
    homogeneity breaks exchangeability, and the unstudentised test then over-rejects for null groups
    (the calibration table's "null group beside a homogeneous one", at several strengths ρ). The
    global test keeps the plain pooled gap: its null is exchangeability itself.

    Besag–Clifford sequential stopping (`stop_after` = h > 0): a test whose h-th exceedance comes at
    permutation L has p = h / L (valid, and exact for clearly large p); the batch stops when every
    test has h exceedances. Otherwise p = (1 + #{stat_perm ≥ stat_obs}) / (1 + permutations run).
    Returns (per labelling: G p-values, per labelling: global p, permutations run)."""
    if design not in DESIGNS:
        raise ValueError(f"permutation design {design!r}: expected one of {DESIGNS}")
    sizes = [g for _, g in labellings]
    labs = [_labelled(blocks, c, g) for c, g in labellings]
    rng = np.random.default_rng(seed)
    observed = np.concatenate([_statistics(_draw_terms(blocks, lab, lab.codes[None, :]), lab.n_groups, studentise)[0]
                               for lab in labs])
    T = len(observed)
    exceed, stopped_at = np.zeros(T), np.full(T, np.nan)
    done = 0
    for b_now in _chunks(n_perm, first_chunk, max_chunk):
        if stop_after > 0 and np.isfinite(stopped_at[np.isfinite(observed)]).all():
            break
        stats = [_statistics(_draw_terms(blocks, lab, draw_within(lab, b_now, rng, design)), lab.n_groups, studentise)
                 for lab in labs]
        hits = np.concatenate(stats, axis=1) >= observed - 1e-6  # NaN is no hit
        cum = exceed + np.cumsum(hits, axis=0)
        if stop_after > 0:
            for t in np.flatnonzero(np.isnan(stopped_at) & (cum[-1] >= stop_after)):
                stopped_at[t] = done + 1 + int(np.argmax(cum[:, t] >= stop_after))
        exceed = cum[-1]
        done += b_now
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(np.isfinite(stopped_at), stop_after / stopped_at, (1 + exceed) / (1 + done))
    p = np.where(np.isnan(observed) | (n_perm <= 0), np.nan, p)
    out, glob, k = [], [], 0
    for g in sizes:
        out.append(p[k:k + g])
        glob.append(float(p[k + g]))
        k += g + 1
    return out, glob, done


def within_prompt_table(X: np.ndarray, prompts: Sequence, labellings: dict[str, Sequence], *,
                        categories: dict[str, list] | None = None, n_boot: int = 1000, n_perm: int = 1000,
                        seed: int = 0, level: float = 0.95, method: str = "percentile", design: str = "within",
                        stop_after: int = 0, near_dup_cosine: float | None = None, small_group: int,
                        paper: bool = True, blocks: PromptBlocks | None = None, localise_alpha: float | None = None,
                        pairs_out: dict[str, pd.DataFrame] | None = None,
                        ordered: tuple[str, ...] = ("L_bin",)) -> dict[str, pd.DataFrame]:
    """Per labelling (e.g. race, L_bin: one label or None per row of X) a table per group:

    the within-prompt gap (wp_intra, wp_inter, wp_gap, its prompt-cluster bootstrap CI wp_gap_lo/hi,
    wp_gap_se, wp_ci_reason, n_prompts contributing), the one-sided within-prompt permutation p-value
    of wp_gap > 0 (p_perm) and the labelling's global test (p_global), the near-duplicate rate at
    cosine ≥ `near_dup_cosine` (near_dup_rate: share of the group's images with another image of the
    same prompt at least that similar), and with `paper` the paper's unstratified gap (intra, inter,
    gap, gap_lo, gap_hi, intra_lo, intra_hi: pairs across prompts too) beside it, and for an `ordered`
    labelling (its categories in order, the L* bins) intra_minus_next with its interval. Per labelling, one pass over X gives the
    per-(prompt, group) sums behind both gaps and their bootstraps; the unit rows by prompt (one more
    pass, `blocks`) serve the permutation test (linear in n_p) and the near-duplicates (near_duplicate_pairs: a
    prompt's Gram matrix below LSH_MIN_ROWS images, the LSH screen from there), and are built only when one of them is asked for.

    The localising test (pairwise gaps, intersection-union rule at `localise_alpha`, default 1 − level) adds
    p_localise and flagged; with `near_dup_cosine`, the same with near-duplicate pairs left out (p_dedup_localise,
    dedup_flagged) and the within-prompt gap without them (wp_gap_dedup, its CI and SE). `pairs_out`, when
    given, receives each labelling's pairwise table (pairwise_gaps, one row per ordered pair of groups)."""
    alpha = 1 - level if localise_alpha is None else localise_alpha
    if blocks is None and (n_perm > 0 or near_dup_cosine is not None):
        blocks = prompt_blocks(X, prompts)
    elif blocks is None:  # no pairs needed: only the names of the prompts and the unusable rows
        blocks = PromptBlocks(_codes(prompts)[1], [], row_scales(X) == 0, np.zeros((0, np.shape(X)[-1]), np.float32),
                              np.zeros(1, np.int64))
    coded, dropped = _coded_labellings(labellings, categories, blocks.n_dropped)
    p_group, p_glob, used = ({}, {}, 0)
    if n_perm > 0 and coded:
        ps, gs, used = within_prompt_permutations(blocks, [(c, len(k)) for c, k in coded.values()], n_perm, seed,
                                                  design, stop_after)
        p_group, p_glob = dict(zip(coded, ps)), dict(zip(coded, gs))
    dup, dup_pairs = None, {}
    if near_dup_cosine is not None:  # one Gram pass per prompt for the flags and every labelling's copy pairs
        dup, sums = near_duplicate_pairs(blocks, [(c, len(k)) for c, k in coded.values()], near_dup_cosine)
        dup_pairs = dict(zip(coded, sums))
    out = {}
    # one pass over X for every labelling's per-(prompt, group) sums: point, CI, paper gap
    cells = cell_sums_many(X, [c for c, _ in coded.values()], _codes(prompts)[0],
                           [len(k) for _, k in coded.values()], blocks.n_prompts)
    boot = dict(n_boot=n_boot, level=level, method=method)
    for j, (name, (codes, cats)) in enumerate(coded.items()):
        G = len(cats)
        S, n_c, q_c = cells[j]
        t, n_prompts = _wp_gap_columns(S, n_c, q_c, codes, cats, small_group, seed=seed + 7919 * (j + 1), **boot)
        if n_perm > 0:
            t["p_perm"], t["p_global"], t["n_perm"], t["design"] = p_group[name], p_glob[name], used, design
        n = t["n"].to_numpy()
        if dup is not None:
            k = np.bincount(codes[(codes >= 0) & dup], minlength=G)
            t["n_near_dup"] = k.astype(int)
            t["near_dup_rate"] = _ratio(k.astype(float), n.astype(float))
            t["near_dup_cosine"] = near_dup_cosine
        if paper:
            t = t.assign(**_paper_columns(S, n_c, q_c, n, dropped[name], seed=seed, ordered=name in ordered, **boot))
        A, Np = pair_sums_from_cells(S, n_c, q_c)
        pairs = pairwise_gaps(A, Np, n_c, cats, level)
        loc = localise(pairs, cats, alpha)
        if near_dup_cosine is not None:
            Ad, Nd = A - dup_pairs[name][0], Np - dup_pairs[name][1]  # near-duplicate pairs left out
            pairs = pairs.merge(pairwise_gaps(Ad, Nd, n_c, cats, level, "dedup_"), on=["group", "other"])
            loc = loc.merge(localise(pairs, cats, alpha, "dedup_"), on="group")
            t = t.assign(**_dedup_columns(Ad, Nd, n_c, n_prompts, seed=seed + 7919 * (j + 1), **boot))
        t = t.merge(loc, on="group", how="left")
        t["reason"] = t["wp_reason"]
        out[name] = t
        if pairs_out is not None:
            pairs_out[name] = pairs
    return out


def _coded_labellings(labellings: dict[str, Sequence], categories: dict[str, list] | None, unusable: np.ndarray):
    """Per labelling with any label: (codes per row of X, -1 for unlabelled or unusable rows; its categories),
    and per group the count of its rows left out as unusable (zero or non-finite embeddings)."""
    coded, dropped = {}, {}
    for name, labels in labellings.items():
        cats = (categories or {}).get(name)
        labels = np.asarray(labels, dtype=object)
        if cats is None:
            cats = sorted({v for v in labels if v is not None and v == v and v != ""}, key=str)
        codes, cats = _codes(labels, cats)
        if cats:
            coded[name] = (np.where(unusable, -1, codes), cats)
            dropped[name] = np.bincount(codes[unusable & (codes >= 0)], minlength=len(cats))
    return coded, dropped


def _wp_gap_columns(S, n_c, q_c, codes, cats, small_group, *, n_boot, level, method, seed):
    """One labelling's within-prompt gap per group from its per-(prompt, group) sums: the point, its prompt-cluster
    bootstrap interval and why an interval is missing or under-covers; and per group the prompts it rests on."""
    G = len(cats)
    totals = within_prompt_totals_from_cells(S, n_c, q_c)
    rep = replicates(sums_statistic(totals, within_prompt_statistic(G)), len(S), n_boot=n_boot, seed=seed,
                     method=method)
    n_prompts = (totals[:, 3 * G:] > 0).sum(axis=0)
    # a group's gap rests on the prompts where it has pairs, not on all P: the small-cluster expansion of
    # the interval uses that count (benchmarks/results/calibration.csv, the rare-group rows)
    ivs = intervals(rep, level, method, n_effective=np.tile(n_prompts, 3))
    n = np.bincount(codes[codes >= 0], minlength=G)
    few = (n_prompts >= 1) & (n_prompts < MIN_PROMPTS_CI)
    ci_reason = [ivs[i].reason for i in range(G)]
    for i in np.flatnonzero(few):
        why = (f"only {n_prompts[i]} prompt(s) with 2 or more of the group and another labelled image: an "
               f"interval over so few under-covers (fewer than {MIN_PROMPTS_CI})")
        ci_reason[i] = "; ".join(r for r in (ci_reason[i], why) if r)
    reason = np.where(n == 0, "empty group", np.where(n_prompts == 0, "no prompt with 2 or more of the group "
                                                     "and another labelled image: no within-prompt pairs", ""))
    t = pd.DataFrame({"group": cats, "n": n.astype(int), "n_prompts": n_prompts.astype(int),
                      "wp_intra": rep.point[G:2 * G], "wp_inter": rep.point[2 * G:], "wp_gap": rep.point[:G],
                      "wp_gap_lo": [ivs[i].low for i in range(G)], "wp_gap_hi": [ivs[i].high for i in range(G)],
                      "wp_gap_se": [ivs[i].se for i in range(G)],
                      "wp_ci_reason": ci_reason, "wp_reason": reason, "few_prompts": few,
                      "small": n < small_group})
    return t, n_prompts


def _paper_columns(S, n_c, q_c, n, dropped, *, n_boot, level, method, seed, ordered: bool = False) -> dict:
    """The paper's unstratified gap (pairs across prompts too) from the same cells, its interval, and why; the
    mean intra-group similarity's interval (intra_lo/hi); with `ordered` (groups in a meaningful order, such as
    the L* bins from dark to light) each group's intra minus the next group's, from the same replicates
    (intra_minus_next and its interval; the paper's "0.405 versus 0.183 … a difference of 0.222")."""
    G = len(n)
    prep = replicates(gap_weight_statistic(products_from_cells(S, n_c, q_c)), len(S), n_boot=n_boot, seed=seed,
                      method=method)
    why = _reasons(n).astype(object)
    for i, kd in enumerate(dropped):
        if kd:
            why[i] = "; ".join(r for r in (why[i], f"{kd} zero or non-finite embedding rows dropped") if r)
    cols = dict(intra=prep.point[:G], inter=prep.point[G:2 * G], gap=prep.point[2 * G:],
                n_dropped=dropped.astype(int), paper_reason=why)
    if ordered and G > 1:
        cols["intra_minus_next"] = np.append(prep.point[:G - 1] - prep.point[1:G], np.nan)
    if n_boot > 0:
        every = intervals(prep, level, method)
        piv = every[2 * G:]
        cols.update(gap_lo=[iv.low for iv in piv], gap_hi=[iv.high for iv in piv], gap_se=[iv.se for iv in piv],
                    ci_reason=[iv.reason for iv in piv], intra_lo=[iv.low for iv in every[:G]],
                    intra_hi=[iv.high for iv in every[:G]])
        if ordered and G > 1:
            jack = None if prep.jack is None else prep.jack[:, :G - 1] - prep.jack[:, 1:G]
            diff = intervals(Replicates(prep.point[:G - 1] - prep.point[1:G], prep.dist[:, :G - 1] - prep.dist[:, 1:G],
                                        jack, prep.n_clusters), level, method)
            cols.update(intra_minus_next_lo=[iv.low for iv in diff] + [np.nan],
                        intra_minus_next_hi=[iv.high for iv in diff] + [np.nan])
    return cols


def _dedup_columns(Ad, Nd, n_c, n_prompts, *, n_boot, level, method, seed) -> dict:
    """The within-prompt gap without the near-duplicate pairs (pair sums Ad, counts Nd), with its interval."""
    G = len(n_prompts)
    drep = replicates(sums_statistic(dedup_gap_totals(Ad, Nd, n_c), within_prompt_statistic(G)), len(Ad),
                      n_boot=n_boot, seed=seed, method=method)
    div = intervals(drep, level, method, n_effective=np.tile(n_prompts, 3))
    return dict(wp_gap_dedup=drep.point[:G], wp_gap_dedup_lo=[div[i].low for i in range(G)],
                wp_gap_dedup_hi=[div[i].high for i in range(G)], wp_gap_dedup_se=[div[i].se for i in range(G)])


# ---------------------------------------------------------------- pairwise within-prompt gaps (the localising test)
#
# The per-group gap of g against "the rest" rises for every group when one group h has a look of its own:
# every other group's inter similarity falls because h is in its rest. Pairs of groups localise. Within
# prompt p, from the pair sums A_p[g, h] (Σ cosine over pairs of one image of g and one of h, distinct images)
# and their counts N_p[g, h]:
#
#     intra_pg = A_p[g, g] / N_p[g, g]      between_pgh = A_p[g, h] / N_p[g, h]
#     D_pgh    = intra_pg − between_pgh     g closer to itself than to h (the pairwise gap)
#     C_pgh    = intra_pg − intra_ph        g tighter than h (= D_pgh − D_phg: antisymmetric)
#
# averaged over the prompts with the two-sample weights n_pg n_ph / (n_pg + n_ph) where defined. "g is more
# self-similar than the others" is H1_g: D_gh > 0 and C_gh > 0 for every h ≠ g. Its null is a union, so the
# intersection-union test (Berger 1982, Technometrics 24:295) rejects it at level α when every one of the
# 2(G − 1) one-sided component tests rejects at α: p_localise = max of their p-values, no adjustment. Since C
# is antisymmetric, at most one group can be flagged. A group beside a shifted one is not flagged (its C
# against the shifted group is negative), nor are groups with equal copy rates once copy pairs (cosine ≥ the
# near-duplicate threshold) are left out of A and N (the `dedup` pair sums).
#
# Each component is a ratio of prompt sums, tested by its linearised prompt-cluster t statistic
# θ̂ / SE, SE² = P'/(P' − 1) · Σ_p w_p² (x_p − θ̂)² / (Σ_p w_p)² over the P' prompts where it is defined,
# against t(P' − 1): no resampling, so its cost is that of the pair sums (one pass over the cell sums).

def pair_sums_from_cells(S: np.ndarray, n: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(A, N): per prompt the G×G sums of cosine over pairs of distinct images of groups g and h, and their
    counts, from the per-(prompt, group) sums of unit rows S (P×G×d), counts n and Σ‖x‖² q (P×G)."""
    S = np.asarray(S, dtype=np.float64)
    A = np.matmul(S, np.swapaxes(S, 1, 2))
    G = A.shape[-1]
    diag = np.arange(G)
    A[:, diag, diag] -= q
    N = n[:, :, None] * n[:, None, :]
    N[:, diag, diag] -= n
    return A, N


# A float32 GEMM's cosines differ from CPU to CPU (the kernel's summation order) by ~1e-7: they only nominate
# the candidate pairs, and each candidate's cosine is recomputed in float64, row by row (exact_cosines), so the
# pairs found and their sums are the same on every CPU (tests/test_stable_bytes.py).
CANDIDATE_SLACK = 1e-4


def exact_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of two stacks of unit rows, in float64 (no BLAS: the same sums on every CPU's
    kernel up to float64's last bits)."""
    return np.einsum("ij,ij->i", np.asarray(a, np.float64), np.asarray(b, np.float64))


# Near-duplicates in linear time (prompts of at least LSH_MIN_ROWS usable rows): random-hyperplane LSH on each
# prompt's centred unit rows, exact float64 cosines on the candidates only. A pair at cosine ≥ t is at distance
# ‖u − v‖² ≤ δ² = 2(1 − t); with both rows at distance ≥ m from the prompt's mean unit row μ, the angle θ between
# u − μ and v − μ obeys cos θ ≥ 1 − δ²/(2m²) (the law of cosines, the worst case at equal distances). Centring
# matters: the images of one prompt are alike (cosines of 0.5–0.9), and hyperplanes through μ separate them
# where hyperplanes through 0 would not. The core, the ⌊LSH_CORE_SHARE · n_p⌋ rows nearest μ, is compared exactly
# with every row of the prompt (its columns ride on the projection GEMM), and m is the distance of the nearest
# row outside it. Every other pair lands in the same bucket of a table (LSH_BAND bits drawn from LSH_BITS signs
# of Gaussian projections) with a probability that only θ decides, so the design recall at the threshold,
# 1 − E_h[(1 − C(B − h, r)/C(B, r))^L] with h ~ Bin(B, θ/π) differing bits (and h ≤ LSH_MAX_DIFF), holds for
# every pair, whatever the data (lsh_recall). A prompt takes the exact Gram pass instead where that design
# recall falls below LSH_RECALL (a prompt packed so tightly around μ that m is tiny) or where its buckets hold
# more than LSH_PAIR_SHARE of its pairs (many copies: one huge bucket, which the Gram pass does for less).
# Work per prompt: the projections (n_p · d · B, one GEMM), the tables (bucket numbers by a GEMM of the signs,
# one sort of n_p keys per table), the bucket mates (about n_p² · L · 2^−r / 2 for rows spread around μ; each
# decided by a popcount of its 128 signs before any cosine): linear in n_p in practice
# (benchmarks/results/homogeneity_scaling.txt); recall against brute force in tests/test_homogeneity_pairs.py.
LSH_MIN_ROWS = 500  # smaller prompts: the Gram pass (exact; at d = 512 within 6% of the screen at 400 rows, cheaper below)
LSH_BITS, LSH_BAND, LSH_TABLES = 128, 12, 130  # LSH_BITS: a multiple of 64 (the signs as uint64 words)
LSH_CORE_SHARE = 0.02
LSH_MAX_DIFF = 40  # signs a candidate pair may differ in (of 128): beyond, not a near-duplicate (recall counts it)
LSH_RECALL = 0.999
LSH_PAIR_SHARE = 0.125  # bucket mates (repeats across tables counted) above this share of the pairs: the Gram pass
# (at 1,000 rows of d = 512 a bucket mate costs ~50 ns and the Gram pass as much as 0.14 of the pairs as mates)
LSH_SEED = 20260417  # fixed: the same hyperplanes, the same candidates, in every run


@functools.lru_cache(maxsize=8)
def _lsh_planes(d: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(d × LSH_BITS Gaussian projections, LSH_TABLES × LSH_BITS weights that turn a row of signs into each
    table's bucket: 2^j on the table's j-th bit, LSH_BAND distinct bits per table; exact in float32)."""
    rng = np.random.default_rng(LSH_SEED)
    R = rng.standard_normal((d, LSH_BITS)).astype(dtype)
    W = np.zeros((LSH_TABLES, LSH_BITS), np.float32)
    for t in range(LSH_TABLES):
        W[t, rng.choice(LSH_BITS, LSH_BAND, replace=False)] = 2.0 ** np.arange(LSH_BAND)
    return R, W


def lsh_recall(theta: float, bits: int = LSH_BITS, band: int = LSH_BAND, tables: int = LSH_TABLES,
               max_diff: int | None = LSH_MAX_DIFF) -> float:
    """Probability that a pair at angle θ (radians, between its centred rows) shares a bucket in at least one
    of `tables` tables of `band` distinct bits drawn from `bits` random-hyperplane signs, and its signs differ
    in at most `max_diff` places (None: no such filter)."""
    from scipy import stats as st
    from scipy.special import gammaln

    h = np.arange(bits + 1)
    pmf = st.binom.pmf(h, bits, theta / np.pi)
    ok = bits - h >= band  # C(B − h, r) / C(B, r): the table's r bits all among the B − h equal ones
    log_c = np.where(ok, gammaln(np.maximum(bits - h, band) + 1) - gammaln(np.maximum(bits - h - band, 0) + 1)
                     - gammaln(bits + 1) + gammaln(bits - band + 1), -np.inf)
    kept = h <= (bits if max_diff is None else max_diff)
    return float((pmf * (1 - (1 - np.exp(log_c)) ** tables) * kept).sum())


@functools.lru_cache(maxsize=64)
def _lsh_recall_cached(theta_milli: int) -> float:
    return lsh_recall(theta_milli / 1000)


def _gram_candidates(Up: np.ndarray, threshold: float):
    """(i, j) with i < j over one prompt's rows whose float32 GEMM cosine is ≥ threshold − CANDIDATE_SLACK: the
    Gram matrix in row blocks of GRAM_ROWS, upper triangle only (quadratic in n_p)."""
    for r0 in range(0, len(Up), GRAM_ROWS):
        r1 = min(len(Up), r0 + GRAM_ROWS)
        close = Up[r0:r1] @ Up[r0:].T >= threshold - CANDIDATE_SLACK
        close[:, :r1 - r0] &= _above_diagonal(r1 - r0)  # each pair once (j > i); no image is its own near-copy
        i, j = np.nonzero(close)
        yield r0 + i, r0 + j


def _bucket_mates(W: np.ndarray, signs: np.ndarray, most: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(i, j): every pair of rows whose signs agree on the bits of some table (W: tables × bits, 2^j on a table's
    j-th bit; signs: rows × bits), once per table they share; None when there are more than `most`. Each table's
    keys bucket · 2^s + row (one GEMM, exact integers in floating point) are sorted; a run of k equal buckets holds
    k(k − 1)/2 pairs, taken by their distance in the run (the keys whose next s neighbours share their bucket),
    so the work past the sort is the pairs themselves."""
    n = len(signs)
    shift = int(n - 1).bit_length()
    exact = np.float32 if int(W.sum(axis=1).max()).bit_length() + shift <= 24 else np.float64
    keys = (W * 2.0 ** shift).astype(exact) @ signs.T.astype(exact)
    keys += np.arange(n, dtype=exact)
    keys.sort(axis=1)
    keys = keys.astype(np.int32 if exact is np.float32 else np.int64)
    mate = np.zeros(keys.size, dtype=bool)  # mate[k]: sorted keys k and k + 1 share a bucket (never past a table's end)
    np.less(keys[:, 1:] ^ keys[:, :-1], 1 << shift, out=mate.reshape(keys.shape)[:, :-1])
    keys, row = keys.ravel(), (1 << shift) - 1
    at = np.flatnonzero(mate)
    out_i, out_j, total, s = [], [], 0, 1
    while len(at):
        total += len(at)
        if total > most:
            return None
        out_i.append(keys[at] & row)
        out_j.append(keys[at + s] & row)
        at = at[mate[at + s]]  # runs that go on: pairs at distance s + 1
        s += 1
    if not out_i:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_i), np.concatenate(out_j)


def _lsh_candidates(Up: np.ndarray, threshold: float):
    """(i, j) candidate pairs (i < j) of one prompt, found with the design recall above (module note); None when
    the prompt needs the exact Gram pass instead. Bucket mates whose full signatures differ in more than
    LSH_MAX_DIFF of the LSH_BITS signs are dropped before any cosine (a popcount per pair; lsh_recall counts it)."""
    n = len(Up)
    mu = (np.ones(n, Up.dtype) @ Up) / Up.dtype.type(n)  # the mean unit row (BLAS)
    # ‖u − μ‖² = 1 − 2 u·μ + ‖μ‖² on unit rows (one product, no centred copy of the rows)
    dist2 = 1.0 - 2.0 * (Up @ mu).astype(np.float64) + float(mu.astype(np.float64) @ mu)
    k = int(LSH_CORE_SHARE * n)
    order = np.argpartition(dist2, k)
    core, m2 = np.sort(order[:k]), float(dist2[order[k]])  # m²: the nearest row outside the core
    if m2 <= 0:
        return None
    theta = float(np.arccos(np.clip(1.0 - (1.0 - threshold) / m2, -1.0, 1.0)))  # 1 − δ²/(2m²)
    if _lsh_recall_cached(int(np.ceil(theta * 1000))) < LSH_RECALL:
        return None
    R, W = _lsh_planes(Up.shape[1], Up.dtype.name)
    proj = Up @ np.concatenate([R, Up[core].T], axis=1)  # the projections, and every row's cosine with the core
    signs = proj[:, :LSH_BITS] > mu @ R  # the signs of (u − μ)·r
    found = _bucket_mates(W, signs, LSH_PAIR_SHARE * n * (n - 1) / 2)
    if found is None:
        return None
    i, j = found
    words = np.packbits(signs, axis=1).view(np.uint64)
    diff = sum(np.bitwise_count(words[i, w] ^ words[j, w]) for w in range(words.shape[1]))
    i, j = i[diff <= LSH_MAX_DIFF], j[diff <= LSH_MAX_DIFF]
    a, c = np.nonzero(proj[:, LSH_BITS:] >= threshold - CANDIDATE_SLACK)  # the core against every row, exactly
    i, j = np.concatenate([i, a]), np.concatenate([j, core[c]])
    pair = np.unique(np.minimum(i, j).astype(np.int64) * n + np.maximum(i, j))
    pair = pair[pair // n != pair % n]  # no image is its own near-copy
    return pair // n, pair % n


def _candidates(Up: np.ndarray, threshold: float):
    """Candidate near-duplicate pairs (i < j) of one prompt's unit rows: LSH for prompts of at least
    LSH_MIN_ROWS rows (linear), the Gram pass otherwise or where LSH's design recall is not met."""
    if len(Up) >= LSH_MIN_ROWS:
        found = _lsh_candidates(Up, threshold)
        if found is not None:
            yield found
            return
    yield from _gram_candidates(Up, threshold)


def near_duplicate_pairs(blocks: PromptBlocks, labellings: Sequence[tuple[np.ndarray, int]], threshold: float
                         ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Per row of X whether another usable image of its prompt has cosine ≥ `threshold`, and per labelling
    (codes per row of X, G) the P × G × G sums and counts of cosine over those near-duplicate ordered pairs of
    labelled images. Candidates per prompt (`_candidates`): the Gram pass in row blocks for small prompts
    (exact, O(n_p² · d / 2)), random-hyperplane LSH for large ones (linear; recall ≥ LSH_RECALL by design);
    every candidate is decided and summed on its exact float64 cosine (exact_cosines)."""
    n_rows = len(blocks.n_dropped)
    flag = np.zeros(n_rows, dtype=bool)
    P = blocks.n_prompts
    sums = [(np.zeros((P, g, g)), np.zeros((P, g, g))) for _, g in labellings]
    for p in range(P):
        Up = blocks.units[blocks.bounds[p]:blocks.bounds[p + 1]]
        for i, j in _candidates(Up, threshold):
            if not len(i):
                continue
            cos = exact_cosines(Up[i], Up[j])  # … decided and summed on exact cosines
            i, j, cos = i[cos >= threshold], j[cos >= threshold], cos[cos >= threshold]
            if not len(i):
                continue
            rows = blocks.rows[p]
            ri, rj = rows[i], rows[j]
            flag[ri] = flag[rj] = True
            for (codes, _), (A, N) in zip(labellings, sums):
                ci, cj = np.asarray(codes)[ri], np.asarray(codes)[rj]
                ok = (ci >= 0) & (cj >= 0)
                for a, b in ((ci[ok], cj[ok]), (cj[ok], ci[ok])):  # ordered pairs: both orders
                    np.add.at(A[p], (a, b), cos[ok])
                    np.add.at(N[p], (a, b), 1.0)
    return flag, sums


def pair_sums_dedup(blocks: PromptBlocks, codes: np.ndarray, n_groups: int, threshold: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """pair_sums_from_cells with every pair at cosine ≥ `threshold` left out (near-duplicates): all pairs from the
    per-(prompt, group) sums of the unit rows (one pass) minus the near-duplicate pairs (near_duplicate_pairs,
    quadratic in n_p)."""
    rows = np.concatenate(blocks.rows) if blocks.rows else np.zeros(0, np.int64)
    prompt = np.repeat(np.arange(blocks.n_prompts), np.diff(blocks.bounds))
    A, N = pair_sums_from_cells(*cell_sums(blocks.units, np.asarray(codes)[rows], prompt, n_groups,
                                           blocks.n_prompts, normalise=False))
    _, [(Ad, Nd)] = near_duplicate_pairs(blocks, [(codes, n_groups)], threshold)
    return A - Ad, N - Nd


def pairwise_terms(A: np.ndarray, N: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per prompt (P × 4 × G × G): [w·D, w_D, w·C, w_C] of the pairwise gap D_pgh = intra_pg − between_pgh and
    the tightness contrast C_pgh = intra_pg − intra_ph, weights n_pg n_ph / (n_pg + n_ph) where the pair
    means are defined (else 0)."""
    G = A.shape[-1]
    off = ~np.eye(G, dtype=bool)
    Nd = np.diagonal(N, axis1=1, axis2=2)
    intra = _ratio(np.diagonal(A, axis1=1, axis2=2), Nd)
    between = _ratio(A, N)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = _ratio(n[:, :, None] * n[:, None, :], n[:, :, None] + n[:, None, :])
    has_intra = Nd > 0
    okD = has_intra[:, :, None] & (N > 0) & off
    okC = has_intra[:, :, None] & has_intra[:, None, :] & off
    D = intra[:, :, None] - between
    C = intra[:, :, None] - intra[:, None, :]
    wD, wC = np.where(okD, w, 0.0), np.where(okC, w, 0.0)
    return np.stack([wD * np.where(okD, D, 0.0), wD, wC * np.where(okC, C, 0.0), wC], axis=1)


def linearised_t(wx: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate Σ w·x / Σ w, its prompt-cluster SE, degrees of freedom P' − 1) over the first axis (prompts),
    P' the prompts with w > 0; SE NaN below 2 such prompts."""
    sw = w.sum(axis=0)
    est = _ratio(wx.sum(axis=0), sw)
    k = (w > 0).sum(axis=0).astype(float)
    resid = np.where(w > 0, wx - w * np.where(np.isfinite(est), est, 0.0), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.where(k >= 2, np.sqrt(k / np.maximum(k - 1, 1) * (resid ** 2).sum(axis=0)) / np.where(sw > 0, sw, 1),
                      np.nan)
    return est, se, k - 1


def _t_test(est, se, df, level):
    """One-sided p of est > 0 and the two-sided `level` t interval (NaN where undefined)."""
    from scipy import stats as st

    with np.errstate(invalid="ignore", divide="ignore"):
        ok = np.isfinite(est) & np.isfinite(se) & (se > 0) & (df >= 1)
        dfs = np.where(ok, df, 1.0)
        p = np.where(ok, st.t.sf(_ratio(est, np.where(ok, se, 1.0)), dfs), np.nan)
        half = np.where(ok, st.t.ppf(0.5 + level / 2, dfs) * se, np.nan)
    return p, est - half, est + half


def pairwise_gaps(A: np.ndarray, N: np.ndarray, n: np.ndarray, cats: Sequence, level: float = 0.95,
                  prefix: str = "") -> pd.DataFrame:
    """One row per ordered pair (group, other): the pairwise within-prompt gap `pair_gap` (g closer to itself
    than to h) and the tightness contrast `tight_diff` (intra g − intra h), each with its linearised
    prompt-cluster t interval (`_lo`/`_hi`), SE, one-sided p of > 0, and n_prompts; `prefix` names the pair
    sums (e.g. 'dedup_')."""
    tot = pairwise_terms(A, N, n)
    G = len(cats)
    gi, hi = np.nonzero(~np.eye(G, dtype=bool))
    out = pd.DataFrame({"group": np.asarray(cats, dtype=object)[gi], "other": np.asarray(cats, dtype=object)[hi]})
    for name, j in (("pair_gap", 0), ("tight_diff", 2)):
        est, se, df = linearised_t(tot[:, j], tot[:, j + 1])
        p, lo, up = _t_test(est, se, df, level)
        out[f"{prefix}{name}"] = est[gi, hi]
        out[f"{prefix}{name}_lo"], out[f"{prefix}{name}_hi"] = lo[gi, hi], up[gi, hi]
        out[f"{prefix}{name}_se"], out[f"p_{prefix}{name}"] = se[gi, hi], p[gi, hi]
        if j == 0:
            out[f"{prefix}n_prompts_pair"] = (df[gi, hi] + 1).astype(int)
    return out


def localise(pairs: pd.DataFrame, cats: Sequence, alpha: float = 0.05, prefix: str = "") -> pd.DataFrame:
    """Per group, the intersection-union test of "g is more self-similar than every other group": p_localise =
    the largest p of its pairwise gaps and tightness contrasts against every other group (a comparison that
    is undefined counts as p = 1, said in the reason), flagged where it is below `alpha`."""
    p = pairs[[f"p_{prefix}pair_gap", f"p_{prefix}tight_diff"]].max(axis=1, skipna=False)
    undefined = p.isna()
    per = pairs.assign(_p=p.fillna(1.0), _undef=np.where(undefined, pairs["other"].astype(str), ""))
    agg = per.groupby("group", sort=False).agg(_p=("_p", "max"), _undef=("_undef", lambda s: ", ".join(x for x in s if x)))
    agg = agg.reindex(list(cats))
    out = pd.DataFrame({"group": list(cats), f"p_{prefix}localise": agg["_p"].to_numpy(float)})
    out[f"{prefix}flagged"] = out[f"p_{prefix}localise"] < alpha
    out[f"{prefix}localise_reason"] = ["" if not u else f"no pairs to compare with {u}: counts as p = 1"
                                       for u in agg["_undef"].fillna("")]
    return out


def dedup_gap_totals(A: np.ndarray, N: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(P, 4G) per-prompt totals [w·Δ, w·intra, w·inter, w] of the within-prompt gap against the rest of the
    prompt from pair sums (e.g. near-duplicate pairs left out): intra = A_gg / N_gg, inter = Σ_h≠g A_gh /
    Σ_h≠g N_gh, w = n (m − n) / m as for the headline gap."""
    Nd = np.diagonal(N, axis1=1, axis2=2)
    Ad = np.diagonal(A, axis1=1, axis2=2)
    intra = _ratio(Ad, Nd)
    inter = _ratio(A.sum(axis=2) - Ad, N.sum(axis=2) - Nd)
    m = n.sum(axis=1, keepdims=True)
    ok = np.isfinite(intra) & np.isfinite(inter) & (n >= 2) & (m - n >= 1)
    w = np.where(ok, _ratio(n * (m - n), np.broadcast_to(m, n.shape)), 0.0)
    intra, inter = np.where(ok, intra, 0.0), np.where(ok, inter, 0.0)
    return np.concatenate([w * (intra - inter), w * intra, w * inter, w], axis=1)
