"""Classifier-error-corrected group shares and TVD (beyond the paper), computed in one place.

If M[t, c] = P(classifier says c | true group t), estimated from the human-vs-classifier labels of
the reliability sample, then a prompt whose images truly have shares p yields expected classifier
shares q = Mᵀp. Two estimators of p from the observed counts:

- `lsq`: constrained least squares, min ‖Mᵀp − q‖² s.t. p ≥ 0, Σp = 1 (the exact solve M⁻ᵀq where
  it lies in the simplex, NNLS with the sum constraint appended as a heavily weighted row otherwise);
- `em`: EM / iterative Bayesian unfolding, maximum likelihood of the counts under the same model.

Identifiability: a nearly singular M cannot be inverted — least squares would silently return a
corner of the simplex (e.g. white = 1.0). The 2-norm condition number of the estimated M is checked;
above `max_condition` the result is "not identifiable" (NaN with the reason), never a number.

Uncertainty (`classifier_corrected_tvd`): one bootstrap that resamples, independently, the prompts
(clusters of the audited images) and the *annotated images* (all of an image's human labels travel
together, so rater agreement on an image is kept), re-estimating M in every replicate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from biasaudit.stats.resample import Interval, intervals, replicates
from biasaudit.stats.tvd import tvd

MAX_CONDITION = 50.0  # cond(M) above this: noise in the shares is amplified ≥ 50×: not identifiable
METHODS = ("lsq", "em")


def image_confusions(true_by_image: list[list[str]], predicted: list[str], groups: tuple[str, ...]) -> np.ndarray:
    """(n_images, K·K) flattened per-image counts E_i[t, c] of (human label t, classifier label c):
    one per human label of the image. Labels outside `groups` are skipped."""
    index = {g: i for i, g in enumerate(groups)}
    k = len(groups)
    E = np.zeros((len(predicted), k * k))
    for row, (humans, c) in enumerate(zip(true_by_image, predicted)):
        if c not in index:
            continue
        for t in humans:
            if t in index:
                E[row, index[t] * k + index[c]] += 1
    return E


def matrix_from_counts(counts: np.ndarray, k: int, prior: float = 0.5) -> np.ndarray:
    """Row-stochastic M (…×K×K) from (human, classifier) counts (…×K·K), `prior` pseudo-counts per row
    spread uniformly (additive smoothing) so a group absent from the sample stays defined."""
    c = np.asarray(counts, dtype=np.float64).reshape(*np.shape(counts)[:-1], k, k) + prior / k
    return c / c.sum(axis=-1, keepdims=True)


def misclassification_matrix(true: np.ndarray, predicted: np.ndarray, groups: tuple[str, ...],
                             prior: float = 0.5) -> np.ndarray:
    """Row-stochastic M[t, c] = P(pred c | true t) from paired labels (see matrix_from_counts)."""
    E = image_confusions([[t] for t in true], list(predicted), groups)
    return matrix_from_counts(E.sum(axis=0), len(groups), prior)


def condition_number(M: np.ndarray) -> np.ndarray:
    """2-norm condition number (…), inf for a singular matrix."""
    with np.errstate(all="ignore"):
        s = np.linalg.svd(np.asarray(M, dtype=np.float64), compute_uv=False)
        return np.where(s[..., -1] > 0, s[..., 0] / np.where(s[..., -1] > 0, s[..., -1], 1), np.inf)


def identifiability(M: np.ndarray, max_condition: float = MAX_CONDITION) -> tuple[float, bool, str]:
    """(condition number, identifiable, reason)."""
    cond = float(condition_number(M))
    if not np.isfinite(cond) or cond > max_condition:
        return cond, False, (f"not identifiable: condition number of the confusion matrix {cond:.3g} > "
                             f"{max_condition:g} (the classifier's labels do not separate the groups)")
    return cond, True, ""


def lsq_correct(q: np.ndarray, M: np.ndarray, weight: float = 1e3) -> np.ndarray:
    """Constrained least squares for each row of q (…×K): argmin ‖Mᵀp − q‖², p ≥ 0, Σp = 1."""
    q = np.atleast_2d(np.asarray(q, dtype=float))
    k = M.shape[0]
    out = np.full_like(q, np.nan)
    finite = np.isfinite(q).all(axis=1)
    try:
        exact = np.linalg.solve(M.T, q[finite].T).T  # rows of M sum to 1, so Σp = Σq = 1
    except np.linalg.LinAlgError:
        exact = np.full((int(finite.sum()), k), -1.0)
    inside = (exact >= -1e-12).all(axis=1)
    rows = np.flatnonzero(finite)
    out[rows[inside]] = np.clip(exact[inside], 0, None)
    A = np.vstack([M.T, weight * np.ones((1, k))])
    for i in rows[~inside]:
        p, _ = nnls(A, np.concatenate([q[i], [weight]]))
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
    if method not in METHODS:
        raise ValueError(f"correction_method {method!r}: expected one of {METHODS}")
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    if method == "em":
        return em_correct(counts, M)
    n = counts.sum(axis=1, keepdims=True)
    return lsq_correct(np.where(n > 0, counts / np.where(n > 0, n, 1), np.nan), M)


def corrected_per_prompt(counts: np.ndarray, bench: np.ndarray, M: np.ndarray, method: str = "lsq",
                         max_condition: float = MAX_CONDITION) -> tuple[np.ndarray, np.ndarray, str]:
    """(corrected shares P×K, corrected TVD P, reason): NaN with the reason when M is not identifiable."""
    _, ok, reason = identifiability(M, max_condition)
    if not ok:
        return np.full(counts.shape, np.nan), np.full(len(counts), np.nan), reason
    shares = correct(counts, M, method)
    return shares, tvd(shares, bench), ""


def classifier_corrected_tvd(counts: np.ndarray, bench: np.ndarray, E: np.ndarray, groups: tuple[str, ...],
                             method: str = "lsq", n_boot: int = 1000, level: float = 0.95, seed: int = 0,
                             boot_method: str = "percentile", max_condition: float = MAX_CONDITION,
                             prior: float = 0.5) -> tuple[Interval, Interval, dict]:
    """Mean over prompts of the raw and of the classifier-error-corrected TVD, with one joint bootstrap
    over prompts (rows of counts/bench, K columns) and annotated images (rows of E, image_confusions).

    Returns (raw Interval, corrected Interval, info with condition_number, identifiable, reason)."""
    counts = np.asarray(counts, dtype=np.float64)
    bench = np.asarray(bench, dtype=np.float64)
    k, P, I = len(groups), len(counts), len(E)
    n = counts.sum(axis=1)
    raw = tvd(counts / np.where(n > 0, n, 1)[:, None], bench)
    M = matrix_from_counts(E.sum(axis=0), k, prior)
    cond, ok, reason = identifiability(M, max_condition)
    info = {"condition_number": cond, "identifiable": ok, "reason": reason, "n_annotated_images": I}

    def stat(w: np.ndarray) -> np.ndarray:
        wp, wi = w[:, :P], w[:, P:]
        out = np.full((len(w), 2), np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, 0] = (wp @ raw) / wp.sum(axis=1)
        Ms = matrix_from_counts(wi @ E, k, prior)
        for b in range(len(w)):
            if condition_number(Ms[b]) > max_condition:
                continue  # this replicate's M is not identifiable: undefined, excluded and counted
            t = tvd(correct(counts, Ms[b], method), bench)
            out[b, 1] = (wp[b] @ t) / wp[b].sum()
        return out

    rep = replicates(stat, (P, I), n_boot=n_boot, seed=seed, method=boot_method)
    iv_raw, iv_corr = intervals(rep, level, boot_method)
    if not ok:
        iv_corr = Interval(np.nan, np.nan, np.nan, np.nan, P, iv_corr.n_undefined, reason)
    return iv_raw, iv_corr, info
