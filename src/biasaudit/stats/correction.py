"""Classifier-error-corrected group shares (beyond the paper).

If M[t, c] = P(classifier says c | true group t) — estimated from the human-vs-classifier confusion
matrix of the reliability sample — then a prompt whose images truly have shares p yields expected
classifier shares q = Mᵀp. Two estimators of p from the observed q (or counts):

- `lsq_correct`: constrained least squares, min ‖Mᵀp − q‖² subject to p ≥ 0, Σp = 1 (NNLS with the
  sum constraint appended as a heavily weighted row), the usual "matrix-inversion" estimator kept on
  the simplex;
- `em_correct`: the EM / iterative Bayesian unfolding estimator, maximum likelihood of the counts
  under the same model (Saerens et al. 2002-style), always on the simplex.

`corrected_tvd` reports TVD to a benchmark raw and corrected, with bootstrap CIs that carry both
sources of uncertainty: the images of the prompt (multinomial resampling) and the confusion matrix
(resampling the annotated items).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from biasaudit.stats.tvd import tvd


def misclassification_matrix(true: np.ndarray, predicted: np.ndarray, groups: tuple[str, ...],
                             prior: float = 0.5) -> np.ndarray:
    """Row-stochastic M[t, c] = P(pred c | true t) from paired labels, with `prior` pseudo-counts
    per row spread uniformly (additive smoothing) so a group absent from the sample stays defined."""
    k = len(groups)
    index = {g: i for i, g in enumerate(groups)}
    counts = np.full((k, k), prior / k)
    for t, c in zip(true, predicted):
        if t in index and c in index:
            counts[index[t], index[c]] += 1
    return counts / counts.sum(axis=1, keepdims=True)


def lsq_correct(q: np.ndarray, M: np.ndarray, weight: float = 1e3) -> np.ndarray:
    """Constrained least squares for each row of q (…×K): argmin ‖Mᵀp − q‖², p ≥ 0, Σp = 1."""
    q = np.atleast_2d(np.asarray(q, dtype=float))
    k = M.shape[0]
    A = np.vstack([M.T, weight * np.ones((1, k))])
    out = np.empty_like(q)
    for i, row in enumerate(q):
        if not np.isfinite(row).all():
            out[i] = np.nan
            continue
        p, _ = nnls(A, np.concatenate([row, [weight]]))
        out[i] = p / p.sum() if p.sum() > 0 else np.full(k, 1 / k)
    return out


def em_correct(counts: np.ndarray, M: np.ndarray, n_iter: int = 500, tol: float = 1e-10) -> np.ndarray:
    """EM for p given classifier counts (…×K) and M; vectorised over rows. Starts from uniform."""
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    k = M.shape[0]
    p = np.full(counts.shape, 1.0 / k)
    n = counts.sum(axis=1, keepdims=True)
    for _ in range(n_iter):
        joint = p[:, :, None] * M[None, :, :]              # P(true t, pred c)  (rows × t × c)
        post = joint / np.clip(joint.sum(axis=1, keepdims=True), 1e-300, None)  # P(t | c)
        new = (post * counts[:, None, :]).sum(axis=2) / np.where(n > 0, n, 1)
        if np.abs(new - p).max() < tol:
            p = new
            break
        p = new
    p[n[:, 0] == 0] = np.nan
    return p


def correct(counts: np.ndarray, M: np.ndarray, method: str = "lsq") -> np.ndarray:
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    if method == "em":
        return em_correct(counts, M)
    n = counts.sum(axis=1, keepdims=True)
    return lsq_correct(np.where(n > 0, counts / np.where(n > 0, n, 1), np.nan), M)


def corrected_tvd(counts: pd.DataFrame, benchmark: pd.DataFrame, true: np.ndarray, predicted: np.ndarray,
                  groups: tuple[str, ...], method: str = "lsq", n_boot: int = 200, ci: float = 0.95,
                  seed: int = 0) -> pd.DataFrame:
    """Per prompt (the rows of `counts`, classifier label counts over `groups`; `benchmark` has the
    same index and group columns): raw shares TVD and corrected TVD with percentile bootstrap CIs.

    Each bootstrap replicate resamples the annotated pairs (true, predicted) → M*, and each prompt's
    images (multinomial with its observed shares) → counts*, then corrects counts* with M*.
    """
    rng = np.random.default_rng(seed)
    C = counts[list(groups)].to_numpy(float)
    B = benchmark.loc[counts.index, list(groups)].to_numpy(float)
    n = C.sum(axis=1)
    raw = C / np.where(n > 0, n, 1)[:, None]
    M = misclassification_matrix(true, predicted, groups)
    corr = correct(C, M, method)
    tvd_raw, tvd_corr = tvd(raw, B), tvd(corr, B)
    boot_raw = np.full((n_boot, len(C)), np.nan)
    boot_corr = np.full((n_boot, len(C)), np.nan)
    true, predicted = np.asarray(true), np.asarray(predicted)
    for b in range(n_boot):
        pick = rng.integers(0, len(true), len(true)) if len(true) else np.array([], int)
        Mb = misclassification_matrix(true[pick], predicted[pick], groups)
        Cb = np.stack([rng.multinomial(int(m), r) if m > 0 else np.zeros(len(groups)) for m, r in zip(n, raw)])
        nb = Cb.sum(axis=1)
        boot_raw[b] = tvd(Cb / np.where(nb > 0, nb, 1)[:, None], B)
        boot_corr[b] = tvd(correct(Cb, Mb, method), B)
    alpha = (1 - ci) / 2
    q = lambda a, f: np.nanquantile(a, f, axis=0) if n_boot else np.full(len(C), np.nan)  # noqa: E731
    out = pd.DataFrame({"n": n.astype(int), "tvd_raw": tvd_raw, "tvd_raw_lo": q(boot_raw, alpha),
                        "tvd_raw_hi": q(boot_raw, 1 - alpha), "tvd_corrected": tvd_corr,
                        "tvd_corrected_lo": q(boot_corr, alpha), "tvd_corrected_hi": q(boot_corr, 1 - alpha)},
                       index=counts.index)
    for j, g in enumerate(groups):
        out[f"raw_{g}"] = raw[:, j]
        out[f"corrected_{g}"] = corr[:, j]
    out["method"] = method
    return out
