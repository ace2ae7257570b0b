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

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from biasaudit.stats.resample import Interval, cluster_weights, intervals, replicates
from biasaudit.stats.tvd import tvd

MAX_CONDITION = 50.0  # cond(M) above this: noise in the shares is amplified ≥ 50×: not identifiable
METHODS = ("lsq", "em")


REFERENCES = ("consensus", "every_label")


def reference_labels(humans: list[list[str]], rule: str = "consensus") -> list[list[str]]:
    """Per annotated image, the human labels M is estimated against. `every_label`: each rater's label
    (an image with two raters counts twice). `consensus`: the label where every rater of the image
    agrees, else none (the image is left out), so a rater's mistake does not enter M as a classifier
    error — with raters 95% right and mostly White images, every_label puts White faces into the
    Hispanic row of M often enough to over-correct Hispanic shares (benchmarks/calibration.py). The
    images left out may be the harder ones, so M can look better on them than it is: the reliability
    tables report how many there are and the raters' agreement."""
    if rule not in REFERENCES:
        raise ValueError(f"confusion_reference {rule!r}: expected one of {REFERENCES}")
    if rule == "every_label":
        return [list(h) for h in humans]
    return [[h[0]] if h and len(set(h)) == 1 else [] for h in humans]


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
    """Row-stochastic M (…×K×K) from (human, classifier) counts (…×K·K), with `prior` pseudo-counts on
    each row's diagonal, so a group absent from the sample stays defined as "classified correctly" (no
    correction for it). Spreading them uniformly instead would move the M of a group seen on a few
    images away from the identity and so over-correct its share even for a perfect classifier."""
    c = np.asarray(counts, dtype=np.float64).reshape(*np.shape(counts)[:-1], k, k) + prior * np.eye(k)
    return c / c.sum(axis=-1, keepdims=True)


def misclassification_matrix(true: np.ndarray, predicted: np.ndarray, groups: tuple[str, ...],
                             prior: float = 0.5) -> np.ndarray:
    """Row-stochastic M[t, c] = P(pred c | true t) from paired labels (see matrix_from_counts)."""
    E = image_confusions([[t] for t in true], list(predicted), groups)
    return matrix_from_counts(E.sum(axis=0), len(groups), prior)


def condition_number(M: np.ndarray) -> np.ndarray:
    """2-norm condition number (…), inf for a singular matrix, NaN for one with a non-finite entry (an
    SVD of NaN raises instead of answering)."""
    M = np.asarray(M, dtype=np.float64)
    finite = np.isfinite(M).all(axis=(-2, -1))
    with np.errstate(all="ignore"):
        s = np.linalg.svd(np.where(finite[..., None, None], M, np.eye(M.shape[-1])), compute_uv=False)
        cond = np.where(s[..., -1] > 0, s[..., 0] / np.where(s[..., -1] > 0, s[..., -1], 1), np.inf)
    return np.where(finite, cond, np.nan)


def identifiable(cond: np.ndarray, max_condition: float = MAX_CONDITION) -> np.ndarray:
    """cond(M) ≤ max_condition; False for a NaN condition number (a non-finite M)."""
    return np.asarray(cond) <= max_condition


def identifiability(M: np.ndarray, max_condition: float = MAX_CONDITION) -> tuple[float, bool, str]:
    """(condition number, identifiable, reason)."""
    cond = float(condition_number(M))
    if np.isnan(cond):
        bad = int((~np.isfinite(np.asarray(M, dtype=np.float64))).sum())
        return cond, False, (f"not identifiable: the confusion matrix has {bad} non-finite entr"
                             f"{'y' if bad == 1 else 'ies'} (NaN or inf)")
    if not identifiable(cond, max_condition):
        return cond, False, (f"not identifiable: condition number of the confusion matrix {cond:.3g} > "
                             f"{max_condition:g} (the classifier's labels do not separate the groups)")
    return cond, True, ""


MAX_SUPPORT_GROUPS = 10  # up to this many groups lsq_correct solves every support at once (2^K − 1 small solves)
ACTIVE_SET_STEPS = 4  # support updates tried before a row falls back to every support
ROWS_PER_BATCH = 50_000  # replicate × prompt rows solved at once (about 10 MB of gathered K×K matrices)


def _nnls_simplex(M: np.ndarray, q: np.ndarray, weight: float, start: np.ndarray) -> np.ndarray:
    """argmin ‖Mᵀp − q‖² + weight²(Σp − 1)², p ≥ 0 (the NNLS of Mᵀ with the sum row appended), for a
    stack (M: B×K×K, q: B×R×K → B×R×K), starting from the support of `start` (B×R×K: the exact
    solve's positive entries).

    On a support S, with H = M_S M_Sᵀ, u = H⁻¹M_S q and v = H⁻¹1, the least-squares solution is
    x = u + v (1 − 1ᵀu) w² / (1 + w² 1ᵀv) (Sherman–Morrison: the large weight never enters a matrix
    that is inverted), and x is the optimum iff x ≥ 0 and the gradient M(Mᵀx − q) + w²(Σx − 1)·1 is
    ≥ 0 off S (KKT; the problem is strictly convex for a full-rank M). Rows whose starting support
    fails the check take every support's solution and keep the feasible one with the smallest
    objective (the optimum's own support is among them, and every feasible point is ≥ the optimum):
    the point scipy's active-set NNLS converges to. Before that, a failing row moves its support a few
    times (negative entries out, negative gradients in). Raises LinAlgError for a singular M."""
    B, R, k = q.shape
    w2 = weight * weight
    masks = np.array([[(s >> j) & 1 for j in range(k)] for s in range(1, 2 ** k)], dtype=bool)  # n_S × K
    MMt = M @ np.transpose(M, (0, 2, 1))
    Hpad = np.zeros((B, len(masks), k, k))  # per replicate and support: H_S⁻¹ padded with zeros to K×K
    for i, m in enumerate(masks):
        S = np.flatnonzero(m)
        Hpad[:, i, S[:, None], S[None, :]] = np.linalg.inv(MMt[:, S[:, None], S[None, :]])
    vpad = Hpad.sum(axis=-1)
    a = vpad.sum(axis=-1)
    bidx = np.repeat(np.arange(B), R)
    qf = q.reshape(-1, k)
    c = np.einsum("bkj,brj->brk", M, q).reshape(-1, k)  # M q per row
    Mf = M[bidx]

    def solve(rows: np.ndarray, sid: np.ndarray):
        b = bidx[rows]
        u = np.einsum("nij,nj->ni", Hpad[b, sid], c[rows])
        lam = (1 - u.sum(axis=-1)) / (1 + w2 * a[b, sid])  # Σx − 1 = −lam, computed without cancellation
        x = u + vpad[b, sid] * (w2 * lam)[:, None]
        resid = np.einsum("nkj,nk->nj", Mf[rows], x) - qf[rows]  # Mᵀx − q
        grad = np.einsum("njk,nk->nj", Mf[rows], resid) - (w2 * lam)[:, None]
        return x, grad, (resid ** 2).sum(axis=-1) + w2 * lam ** 2

    code = 1 << np.arange(k)
    pos = start.reshape(-1, k) > 0
    sid = np.where(pos.any(axis=1), (pos * code).sum(axis=1) - 1, 2 ** k - 2)  # no positive entry: all groups
    out = np.zeros((B * R, k))
    bad = np.arange(B * R)
    for _ in range(ACTIVE_SET_STEPS):  # drop negative entries, add groups whose gradient is negative
        x, grad, _ = solve(bad, sid)
        on = masks[sid]
        ok = np.where(on, x >= 0, grad >= -1e-12).all(axis=1)
        out[bad[ok]] = x[ok]
        nxt = np.where(on, x > 0, grad < -1e-12)[~ok]
        bad = bad[~ok]
        sid = np.where(nxt.any(axis=1), (nxt * code).sum(axis=1) - 1, 2 ** k - 2)
        if not len(bad):
            break
    if len(bad):
        best = np.full(len(bad), np.inf)
        for i in range(len(masks)):
            xi, _, obj = solve(bad, np.full(len(bad), i))
            take = (xi >= 0).all(axis=1) & (obj < best)
            best = np.where(take, obj, best)
            out[bad[take]] = xi[take]
    return out.reshape(B, R, k)


def lsq_correct(q: np.ndarray, M: np.ndarray, weight: float = 1e3) -> np.ndarray:
    """Constrained least squares for each row of q (…×K): argmin ‖Mᵀp − q‖², p ≥ 0, Σp = 1.

    M is one K×K matrix, or a stack B×K×K with q of shape B×R×K (row r of replicate b against M[b]):
    the stack is solved at once (a bootstrap re-estimating M in every replicate loops over nothing).
    Rows whose exact solve lies in the simplex take it; the others take NNLS of Mᵀ with the sum
    constraint appended as a row of weight `weight`, renormalised."""
    M = np.asarray(M, dtype=np.float64)
    stacked = M.ndim == 3
    q = np.asarray(q, dtype=float)
    q = q if stacked else np.atleast_2d(q)
    Ms = M if stacked else M[None]
    Q = q if stacked else q[None]
    k = Ms.shape[-1]
    out = np.full(Q.shape, np.nan)
    finite = np.isfinite(Q).all(axis=-1)
    rhs = np.transpose(np.where(finite[..., None], Q, 0.0), (0, 2, 1))
    try:  # rows of M sum to 1, so Σp = Σq = 1
        exact = np.transpose(np.linalg.solve(np.transpose(Ms, (0, 2, 1)), rhs), (0, 2, 1))
    except np.linalg.LinAlgError:  # a singular M in the stack: solve the others one by one
        exact = np.full(Q.shape, -1.0)
        for b in range(len(Ms)):
            try:
                exact[b] = np.linalg.solve(Ms[b].T, rhs[b]).T
            except np.linalg.LinAlgError:
                pass
    inside = finite & (exact >= -1e-12).all(axis=-1)
    out[inside] = np.clip(exact[inside], 0, None)
    outside = finite & ~inside
    if outside.any():
        step = max(1, ROWS_PER_BATCH // max(1, Q.shape[1]))
        A = np.concatenate([np.transpose(Ms, (0, 2, 1)), weight * np.ones((len(Ms), 1, k))], axis=1)
        rhs = np.concatenate([np.where(finite[..., None], Q, 0.0), np.full(Q.shape[:-1] + (1,), weight)], axis=-1)
        p = None
        if k <= MAX_SUPPORT_GROUPS and (condition_number(Ms) < 1e8).all():  # else scipy's NNLS copes better
            try:
                Qf = np.where(finite[..., None], Q, 0.0)
                p = np.concatenate([_nnls_simplex(Ms[i:i + step], Qf[i:i + step], weight, exact[i:i + step])
                                    for i in range(0, len(Ms), step)])
            except np.linalg.LinAlgError:  # a rank-deficient M: scipy's NNLS, row by row
                p = None
        if p is None:
            p = np.zeros(Q.shape)
            for b, r in zip(*np.nonzero(outside)):
                p[b, r] = nnls(A[b], rhs[b, r])[0]
        tot = p.sum(axis=-1, keepdims=True)
        p = np.where(tot > 0, p / np.where(tot > 0, tot, 1), 1 / k)
        out[outside] = p[outside]
    return out if stacked else out[0]


def em_correct(counts: np.ndarray, M: np.ndarray, n_iter: int = 500, tol: float = 1e-10) -> np.ndarray:
    """EM for p given classifier counts (…×K) and M; vectorised over rows. Starts from uniform.

    M may be a stack B×K×K with counts B×R×K: each replicate b iterates until its own rows converge
    (the same iterations as solving it alone)."""
    M = np.asarray(M, dtype=np.float64)
    stacked = M.ndim == 3
    counts = np.asarray(counts, dtype=float)
    C = counts if stacked else np.atleast_2d(counts)[None]
    Ms = M if stacked else M[None]
    k = Ms.shape[-1]
    p = np.full(C.shape, 1.0 / k)
    n = C.sum(axis=-1, keepdims=True)
    active = np.arange(len(Ms))
    for _ in range(n_iter):
        if not len(active):
            break
        pa, Ma = p[active], Ms[active]
        joint = pa[..., :, None] * Ma[:, None, :, :]        # P(true t, pred c)  (b × rows × t × c)
        post = joint / np.clip(joint.sum(axis=-2, keepdims=True), 1e-300, None)  # P(t | c)
        new = (post * C[active][..., None, :]).sum(axis=-1) / np.where(n[active] > 0, n[active], 1)
        p[active] = new
        active = active[np.abs(new - pa).reshape(len(active), -1).max(axis=1) >= tol]
    p[n[..., 0] == 0] = np.nan
    return p if stacked else p[0]


def correct(counts: np.ndarray, M: np.ndarray, method: str = "lsq") -> np.ndarray:
    """Corrected shares of each row of counts (P×K) under M; M may be a stack B×K×K (→ B×P×K)."""
    if method not in METHODS:
        raise ValueError(f"correction_method {method!r}: expected one of {METHODS}")
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    if np.ndim(M) == 3:
        if method == "em":
            return em_correct(np.broadcast_to(counts, (len(M), *counts.shape)), M)
        n = counts.sum(axis=1, keepdims=True)
        q = np.where(n > 0, counts / np.where(n > 0, n, 1), np.nan)
        return lsq_correct(np.broadcast_to(q, (len(M), *q.shape)), M)
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
        ok = identifiable(condition_number(Ms), max_condition)  # else: undefined, excluded and counted
        t = tvd(correct(counts, Ms[ok], method), bench[None])  # every usable replicate's M at once
        out[ok, 1] = np.einsum("bp,bp->b", wp[ok], t) / wp[ok].sum(axis=1)
        return out

    rep = replicates(stat, (P, I), n_boot=n_boot, seed=seed, method=boot_method)
    iv_raw, iv_corr = intervals(rep, level, boot_method)
    if not ok:
        iv_corr = Interval(np.nan, np.nan, np.nan, np.nan, P, iv_corr.n_undefined, reason)
    return iv_raw, iv_corr, info


# ---------------------------------------------------------------- classifier error and finite n together

def _share_sd(pi: np.ndarray, n: np.ndarray, W: np.ndarray) -> np.ndarray:
    """(…, P, K) standard deviations of the linearly corrected shares W·π̂ of each prompt: the unbiased
    multinomial variance Σ_c W_gc² π_c − (Σ_c W_gc π_c)², over n − 1; n = 1 takes Popoviciu's bound, the
    largest variance a share can have ((max − min of W's row)² / 4n), since one image says nothing about
    it. pi (…, P, K) and W (…, K, K) may carry a leading stack of bootstrap replicates."""
    first = np.einsum("...jc,...gc->...jg", pi, W)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (np.einsum("...jc,...gc->...jg", pi, W ** 2) - first ** 2) / (n - 1)[:, None]
    worst = (W.max(axis=-1) - W.min(axis=-1)) ** 2 / 4
    var = np.where((n > 1)[:, None], var, worst[..., None, :] / np.maximum(n, 1)[:, None])
    return np.sqrt(np.clip(var, 0, None))


def folded_normal_mean(mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """E|X| for X ~ N(mu, sd²) (sd = 0 gives |mu|)."""
    from scipy.stats import norm

    mu, sd = np.broadcast_arrays(np.asarray(mu, dtype=float), np.asarray(sd, dtype=float))
    safe = np.where(sd > 0, sd, 1.0)
    with np.errstate(over="ignore", under="ignore"):
        out = safe * np.sqrt(2 / np.pi) * np.exp(-mu ** 2 / (2 * safe ** 2)) + mu * (1 - 2 * norm.cdf(-mu / safe))
    return np.where(sd > 0, out, np.abs(mu))


def eb_abs_deviation(d: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Empirical-Bayes estimate of |δ| per cell of d (P×K): d = δ + noise with known sd, and, per group
    (column), δ ~ N(0, τ²) with τ² = mean over prompts of (d² − sd²), floored at 0 (the method of
    moments). The posterior of δ is N(λd, λ sd²) with λ = τ²/(τ² + sd²), and the estimate is its E|δ|.
    Noise alone (τ² = 0) gives 0, a deviation far above the noise gives ≈ |d|: the plug-in |d|, whose
    bias is E|noise| at δ = 0, is shrunk exactly where the noise dominates."""
    tau2 = np.clip((d ** 2 - sd ** 2).mean(axis=0), 0, None)[None, :]
    den = tau2 + sd ** 2
    lam = np.where(den > 0, tau2 / np.where(den > 0, den, 1.0), 0.0)
    return folded_normal_mean(lam * d, np.sqrt(lam) * sd)


def eb_pooled_deviation(d: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Empirical-Bayes estimate of δ per cell of d (P×K, or a stack …×P×K): d = δ + noise with known sd,
    and, per group (column), δ ~ N(μ, τ²) across prompts with μ = the pooled mean deviation of the group
    and τ² = the between-prompt variance of d less the mean noise variance, floored at 0 (the method of
    moments). The estimate is the posterior mean μ + λ(d − μ), λ = τ²/(τ² + sd²): a prompt's deviation is
    shrunk toward its group's common deviation, not toward 0, so a deviation every prompt shares (a model
    that doubles Asian shares everywhere) is kept, while noise around it is removed. One prompt (P = 1)
    has no between-prompt variance: λ = 0 and the estimate is d itself."""
    d, sd = np.asarray(d, dtype=np.float64), np.asarray(sd, dtype=np.float64)
    mu = d.mean(axis=-2, keepdims=True)
    spread = d.var(axis=-2, ddof=1, keepdims=True) if d.shape[-2] > 1 else np.zeros_like(mu)
    tau2 = np.clip(spread - (sd ** 2).mean(axis=-2, keepdims=True), 0, None)
    den = tau2 + sd ** 2
    lam = np.where(den > 0, tau2 / np.where(den > 0, den, 1.0), 0.0)
    return mu + lam * (d - mu)


def eb_tvd(d: np.ndarray, sd: np.ndarray) -> float | np.ndarray:
    """The corrected point estimate of the mean TVD: mean over prompts of ½ Σ_g |E[δ_g | d]|
    (eb_pooled_deviation); one value per replicate for a stack …×P×K. Chosen by simulation
    (benchmarks/tvd_grid.py) over the zero-centred prior (eb_abs_deviation), the linear plug-in and the
    bootstrap bias correction: on a grid of 12 random distortions and confusion matrices (M estimated
    from 300 annotated images) it is closer to the true TVD than the raw TVD in 73% of 600 replications
    at 50 prompts × 100 images (MAE 0.017 vs raw 0.029) and 75% at 15 × 12 (MAE 0.040 vs 0.065), where
    the zero-centred prior gets 73% and 68% (benchmarks/results/tvd_grid.csv)."""
    out = 0.5 * np.abs(eb_pooled_deviation(d, sd)).sum(axis=-1).mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def mse_weight(raw: np.ndarray, corrected: np.ndarray, truth: float) -> tuple[float, float, float]:
    """(w, MSE of raw, MSE of corrected) over bootstrap draws of the two estimates in a world whose true
    TVD is `truth`: w ∈ [0, 1] minimises the draws' mean of ((1 − w)·raw + w·corrected − truth)², i.e.
    w = mean((R − θ)(R − C)) / mean((R − C)²), clipped. Each MSE is bias² (the draws' mean less the
    truth) plus variance, so an uncertain M (a corrected estimate that scatters) moves w toward raw, and a
    raw TVD far from the truth moves it toward the correction. Draws that agree everywhere give w = 1."""
    R, Cc = np.asarray(raw, dtype=np.float64), np.asarray(corrected, dtype=np.float64)
    gap = R - Cc
    den = float(np.mean(gap ** 2))
    w = float(np.clip(np.mean((R - truth) * gap) / den, 0.0, 1.0)) if den > 0 else 1.0
    return w, float(np.mean((R - truth) ** 2)), float(np.mean((Cc - truth) ** 2))


def sign_vectors(k: int) -> np.ndarray:
    """(2^k, k) every vector of ±1: ½Σ|x| = max over them of ½ sᵀx (the sign of each x_g attains it)."""
    return 1.0 - 2.0 * ((np.arange(2 ** k)[:, None] >> np.arange(k)[None, :]) & 1)


MAX_BOUND_GROUPS = 12  # the lower bound takes a max over 2^K sign vectors: 4096 at 12 groups


def tvd_lower_bound(deviation: np.ndarray, draws: np.ndarray, level: float = 0.95) -> float:
    """One-sided lower confidence bound at `level` for ½Σ_g |δ̄_g|, the TVD of the mean deviation, from
    its estimate D̄ (K) and bootstrap draws of it (B×K). ½Σ|δ̄| = max_s ½ sᵀδ̄ over sign vectors s, each a
    linear statistic with standard error se_s (from the draws); with c the `level` quantile of
    max_s (½ sᵀ(D̄* − mean D̄*))/se_s over the draws (simultaneous over s), every ½ sᵀδ̄ ≥ ½ sᵀD̄ − c·se_s at
    once, so ½Σ|δ̄| ≥ L = max(0, max_s ½ sᵀD̄ − c·se_s). The mean TVD over prompts is ≥ ½Σ|δ̄| (the
    triangle inequality), so L bounds it too; deviations that cancel across prompts make it weak (the
    null-floor test, tvd_above_floor_p, still sees them). NaN with fewer than 2 draws."""
    D, X = np.asarray(deviation, dtype=np.float64), np.asarray(draws, dtype=np.float64)
    if len(X) < 2 or len(D) > MAX_BOUND_GROUPS:
        return float("nan")
    S = 0.5 * sign_vectors(len(D))
    point, boot = S @ D, X @ S.T
    se = boot.std(axis=0, ddof=1)
    varies = se > 1e-12
    if not varies.any():
        bound = point.max()
    else:
        c = float(np.quantile(((boot - boot.mean(axis=0))[:, varies] / se[varies]).max(axis=1), level))
        bound = (point - c * np.where(varies, se, 0.0)).max()
    return float(bound) if bound > 1e-12 else 0.0  # ½Σδ̄ = 0 up to round-off is no evidence


def above_floor_p(statistic: float, null_draws: np.ndarray) -> float:
    """Bootstrap p-value of "the TVD is above what sampling and classifier error alone give":
    (1 + #{null draws ≥ statistic}) / (1 + #draws)."""
    null = np.asarray(null_draws, dtype=np.float64)
    return float((1 + np.sum(null >= statistic)) / (1 + len(null))) if len(null) else float("nan")


# Below this many prompts the corrected point estimate is not read: the prior's centre and spread
# cannot be estimated from so few. On the random grid at 12 images per prompt it is closer to the truth
# than raw in 0.46 ± 0.014 of replications at 3 prompts, 0.597 ± 0.010 at 5 (the demo's per-category
# rows; no candidate is shown to reach 0.60 there) and 0.67 ± 0.014 at 8, 0.745 at 15
# (benchmarks/results/tvd_grid.csv). The report then reads the raw TVD, beside the honest interval
# (which holds at every scale).
MIN_PROMPTS_POINT = 10


def point_rule(n_prompts: int, weighted: float, raw: float, weight: float = float("nan"),
               rmse_raw: float = float("nan"), rmse_corrected: float = float("nan")) -> tuple[float, str]:
    """(the TVD point estimate the report reads, where it comes from): with at least MIN_PROMPTS_POINT
    prompts the MSE-weighted estimate (1 − w)·raw + w·corrected (debiased_tvd: w from the bootstrap MSEs,
    which carry the uncertainty of M), else the raw TVD. A declared rule on the design and the estimated
    MSEs, never a choice made by comparing the estimates with each other."""
    if not np.isfinite(weighted):
        return raw, "raw: no corrected estimate"
    if n_prompts < MIN_PROMPTS_POINT:
        return raw, (f"raw: {n_prompts} < {MIN_PROMPTS_POINT} prompts, too few for the corrected point estimate "
                     "to beat the raw TVD (the honest interval still holds)")
    how = (f"bootstrap RMSE raw {rmse_raw:.3f}, corrected {rmse_corrected:.3f}"
           if np.isfinite(rmse_raw) and np.isfinite(rmse_corrected) else "")
    return weighted, f"MSE-weighted: {weight:.2f} × corrected + {1 - weight:.2f} × raw" + (f" ({how})" if how else "")


@dataclass(frozen=True)
class ConfusionDraws:
    """Bootstrap replicates of the confusion matrix, drawn once and shared by every bootstrap that
    re-estimates M (debiased_tvd's four, corrected_deviation, the pooled TVD, classifier_corrected_tvd):
    M* from a resample of the annotated images E (`confusion_draws`), or M itself in every replicate
    when M is declared. Each bootstrap still draws its own classified counts; sharing M* leaves every
    interval's own distribution unchanged (its M* and counts stay independent of each other), it only
    stops paying for the same resample, its SVDs and its inverses once per bootstrap."""

    Ms: np.ndarray  # B×K×K, M* (the identity where not usable)
    Ws: np.ndarray  # B×K×K, W* = M*⁻ᵀ
    usable: np.ndarray  # B, M* identifiable


def confusion_draws(E: np.ndarray | None, k: int, n_boot: int, seed: int | np.random.Generator = 0,
                    max_condition: float = MAX_CONDITION, prior: float = 0.5,
                    M: np.ndarray | None = None) -> ConfusionDraws:
    """`n_boot` replicates of M: from resamples of the annotated images E (image_confusions), or, without E,
    the declared M in every replicate. Replicates whose M* is not identifiable are marked unusable."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    E = None if E is None else np.asarray(E, dtype=np.float64)
    if E is not None and E.size and E.sum() > 0:
        wi = cluster_weights(len(E), n_boot, rng)
        Ms = matrix_from_counts(wi @ E, k, prior)
        usable = identifiable(condition_number(Ms), max_condition)
        Ms = np.where(usable[:, None, None], Ms, np.eye(k))
        return ConfusionDraws(Ms, np.linalg.inv(np.transpose(Ms, (0, 2, 1))), usable)
    if M is None:
        raise ValueError("needs the annotated images E or a confusion matrix M")
    M = np.asarray(M, dtype=np.float64)
    W = np.linalg.inv(M.T)
    return ConfusionDraws(np.broadcast_to(M, (n_boot, k, k)), np.broadcast_to(W, (n_boot, k, k)),
                          np.ones(n_boot, dtype=bool))


def _redraw(shares: np.ndarray, n: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Classified shares B×P×K ~ Multinomial(n, shares)/n (the M* replicates beside them: ConfusionDraws)."""
    return np.stack([rng.multinomial(int(m), p, size=n_boot) for m, p in zip(n, shares)], axis=1) / n[None, :, None]


def linear_draws(counts: np.ndarray, bench: np.ndarray, E: np.ndarray | None, k: int, n_boot: int, seed: int,
                 max_condition: float = MAX_CONDITION, prior: float = 0.5, M: np.ndarray | None = None,
                 m_draws: ConfusionDraws | None = None):
    """Shared by debiased_tvd and corrected_deviation (pass it to both as `linear`: one bootstrap for the
    two): (bench, π̂ P×K, n, W = M⁻ᵀ, bootstrap corrected shares B×P×K, usable B, info) over the prompts
    with a label. A replicate redraws each prompt's classified counts ~ Multinomial(n, π̂) and, with
    annotated images E, takes a re-estimate of M from a resample of them (`m_draws`, drawn here when not
    given); replicates whose M is not identifiable are unusable. W is None (info's reason says why) when
    M is not identifiable or no prompt has a label."""
    counts = np.asarray(counts, dtype=np.float64)
    bench = np.asarray(bench, dtype=np.float64)
    keep = counts.sum(axis=1) > 0
    counts, bench = counts[keep], bench[keep]
    # a non-finite count is data with a defect (NaN with its reason below), not "no annotated images"
    have_E = E is not None and np.asarray(E).size and not np.asarray(E, dtype=np.float64).sum() <= 0
    if not have_E and M is None:
        raise ValueError("needs the annotated images E or a confusion matrix M")
    E = np.asarray(E, dtype=np.float64) if have_E else np.zeros((0, k * k))
    M = matrix_from_counts(E.sum(axis=0), k, prior) if have_E else np.asarray(M, dtype=np.float64)
    cond, ok, reason = identifiability(M, max_condition)
    info = {"condition_number": cond, "identifiable": ok, "reason": reason, "M_source":
            f"estimated from {len(E)} annotated images" if have_E else "declared (taken as known)"}
    n = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pi = counts / n[:, None]
    if not ok or not len(counts):
        return bench, pi, n, None, None, None, {**info, "reason": reason or "no prompt with a label"}
    W = np.linalg.inv(M.T)
    rng = np.random.default_rng(seed)
    if m_draws is None:
        m_draws = confusion_draws(E if have_E else None, k, n_boot, rng, max_condition, prior, M)
    draws = _redraw(pi, n, len(m_draws.usable), rng)
    return bench, pi, n, W, np.einsum("bjc,bgc->bjg", draws, m_draws.Ws), m_draws.usable, {**info, "m_draws": m_draws, "rng": rng}


def _excluded(n_boot: int, usable: np.ndarray) -> str:
    bad = int(n_boot - usable.sum())
    return f"{bad} of {n_boot} resamples with an unidentifiable M excluded" if bad else ""


def debiased_tvd(counts: np.ndarray, bench: np.ndarray, E: np.ndarray | None, groups: tuple[str, ...],
                 n_boot: int = 1000, level: float = 0.95, seed: int = 0, max_condition: float = MAX_CONDITION,
                 prior: float = 0.5, M: np.ndarray | None = None, m_draws: ConfusionDraws | None = None,
                 linear: tuple | None = None) -> tuple[Interval, dict]:
    """Mean over prompts of TVD(p, q), corrected for classifier error *and* finite n, with an honest
    (bias-aware) interval for the prompts' true shares p.

    The classifier's shares π̂ of a prompt are inverted linearly, p̃ = M⁻ᵀπ̂, without clipping to the
    simplex, so E[p̃] = p (clipping, as `lsq` does, biases the shares of rare groups upward). Then, per
    prompt and group, 0 ≤ E|p̃_g − q_g| − |p_g − q_g| ≤ E|p̃_g − p_g| ≤ sd(p̃_g) (Jensen, the triangle
    inequality, Cauchy–Schwarz), so the plug-in T = mean ½Σ|p̃ − q| overstates the truth θ by between 0
    and B = mean ½Σ sd(p̃_g). The interval is [T − B − c_hi, T + c_lo] with c from the bootstrap of T
    (`linear_draws`): it covers θ at ≥ `level` whatever p is, because the bias is bounded, not
    estimated (benchmarks/calibration.py). The point estimate is empirical Bayes (`eb_tvd`: each
    prompt's p̃ − q shrunk toward its group's pooled deviation by how much of its spread the noise
    explains). With fewer than MIN_PROMPTS_POINT prompts the report reads the raw TVD instead
    (`point_rule`). One row of pooled counts gives the pooled TVD (there the estimate is the linear
    plug-in: one prompt has no spread to shrink).

    `E` is image_confusions of the reliability sample; without it, `M` is taken as known (a SIMULATED
    classifier's declared confusion). Returns (Interval, info: plug_in, bias_bound, condition_number,
    identifiable, reason, M_source). `m_draws`: the M* replicates to share (confusion_draws); `linear`:
    linear_draws' result to share with corrected_deviation."""
    bench, pi, n, W, draws, usable, info = linear or linear_draws(counts, bench, E, len(groups), n_boot, seed,
                                                                  max_condition, prior, M, m_draws)
    info = dict(info)
    md, rng = info.pop("m_draws", None), info.pop("rng", None)
    nan = float("nan")
    info = {**info, "plug_in": nan, "bias_bound": nan, "raw": nan, "mse_weighted": nan, "weight": nan,
            "rmse_raw": nan, "rmse_corrected": nan, "lower_bound": nan, "above_floor_p": nan}
    if W is None:
        return Interval(np.nan, np.nan, np.nan, np.nan, len(n), 0, info["reason"]), info
    sd = _share_sd(pi, n, W)
    deviation = pi @ W.T - bench
    plug_in = float(0.5 * np.abs(deviation).sum(axis=1).mean())
    bound = float(0.5 * sd.sum(axis=1).mean())
    point = eb_tvd(deviation, sd)
    T = tvd(draws, bench[None]).mean(axis=1)[usable]
    note = _excluded(n_boot, usable)
    raw = float(tvd(pi, bench).mean())
    info = {**info, "plug_in": plug_in, "bias_bound": bound, "reason": note, "raw": raw}
    if len(T) < 2:
        why = "; ".join(r for r in ("no usable resample", note) if r)
        return Interval(np.nan, np.nan, np.nan, np.nan, len(n), n_boot - len(T), why), {**info, "reason": why}
    alpha = (1 - level) / 2
    centre = T.mean()
    q_lo, q_hi = np.quantile(T, [alpha, 1 - alpha])
    low = max(0.0, plug_in - bound - (q_hi - centre))
    high = plug_in + (centre - q_lo)
    M_hat = np.linalg.inv(W).T
    # the bound's draws start from add-one shares: a group a prompt never showed still varies (from π̂ its
    # draws would be 0 every time, and with few images the bound would then exclude a true TVD of 0)
    smooth = _redraw(_simplex(pi * n[:, None] + 1), n, len(md.usable), rng)
    info["lower_bound"] = tvd_lower_bound(deviation.mean(axis=0),
                                          np.einsum("bjc,bgc->bg", smooth[md.usable], md.Ws[md.usable]) / len(n), level)
    info |= _mse_weighting(pi, n, bench, deviation, sd, M_hat, md, rng, raw, point)
    info["above_floor_p"] = _floor_test(pi, n, bench, M_hat, md, rng)
    return Interval(point, float(low), float(high), float(T.std(ddof=1)), len(n), n_boot - len(T), note), \
        {**info, "bootstrap_bias_corrected": float(2 * plug_in - centre)}


def _mse_weighting(pi, n, bench, deviation, sd, M, md, rng, raw, point) -> dict:
    """The MSE-weighted point estimate (mse_weight) from a parametric bootstrap in the world the
    corrected estimate describes: true shares q + the EB deviations (eb_pooled_deviation), clipped to
    the simplex, classified through M̂, with M re-estimated from resampled annotated images in every
    replicate (so the error of M̂ enters both MSEs)."""
    world = np.clip(bench + eb_pooled_deviation(deviation, sd), 0, None)
    world /= world.sum(axis=1, keepdims=True)
    truth = float(tvd(world, bench).mean())
    draws, Ws = _redraw(_simplex(world @ M), n, len(md.usable), rng)[md.usable], md.Ws[md.usable]
    if len(draws) < 2:
        return {}
    raw_draws = tvd(draws, bench[None]).mean(axis=1)
    corr_draws = eb_tvd(np.einsum("bjc,bgc->bjg", draws, Ws) - bench[None], _share_sd(draws, n, Ws))
    w, mse_raw, mse_corr = mse_weight(raw_draws, corr_draws, truth)
    return {"weight": w, "mse_weighted": (1 - w) * raw + w * point, "rmse_raw": float(np.sqrt(mse_raw)),
            "rmse_corrected": float(np.sqrt(mse_corr))}


def _simplex(x: np.ndarray) -> np.ndarray:
    """Rows clipped at 0 and renormalised: round-off in a product of stochastic matrices must not make
    a multinomial's probabilities negative or sum above 1."""
    x = np.clip(x, 0, None)
    return x / x.sum(axis=-1, keepdims=True)


def _floor_test(pi, n, bench, M, md, rng) -> float:
    """above_floor_p of S = mean over prompts of ½Σ|π̂ − M̂ᵀq| (the classified shares against the
    benchmark seen through the classifier) under the null p = q for every prompt: classified counts
    ~ Multinomial(n, M̂ᵀq), M re-estimated from resampled annotated images."""
    observed = float(tvd(pi, bench @ M).mean())
    draws = _redraw(_simplex(bench @ M), n, len(md.usable), rng)[md.usable]
    return above_floor_p(observed, tvd(draws, np.einsum("jt,btc->bjc", bench, md.Ms[md.usable])).mean(axis=1))


def corrected_deviation(counts: np.ndarray, bench: np.ndarray, E: np.ndarray | None, groups: tuple[str, ...],
                        n_boot: int = 1000, level: float = 0.95, seed: int = 0,
                        max_condition: float = MAX_CONDITION, prior: float = 0.5,
                        M: np.ndarray | None = None, m_draws: ConfusionDraws | None = None,
                        linear: tuple | None = None) -> list[Interval]:
    """Per group, the mean over prompts of p̃_g − q_g (classifier-corrected share minus benchmark) with
    a percentile interval from the same bootstrap as debiased_tvd. Linear in the counts, so unbiased
    for the true mean deviation given M: no finite-n correction is needed. `linear`: linear_draws' result
    shared with debiased_tvd (the same bootstrap)."""
    bench, pi, n, W, draws, usable, info = linear or linear_draws(counts, bench, E, len(groups), n_boot, seed,
                                                                  max_condition, prior, M, m_draws)
    if W is None:
        return [Interval(np.nan, np.nan, np.nan, np.nan, len(n), 0, info["reason"]) for _ in groups]
    point = (pi @ W.T - bench).mean(axis=0)
    dist = (draws - bench[None]).mean(axis=1)[usable]
    alpha = (1 - level) / 2
    note = _excluded(n_boot, usable)
    out = []
    for g in range(len(groups)):
        lo, hi = np.quantile(dist[:, g], [alpha, 1 - alpha]) if len(dist) > 1 else (np.nan, np.nan)
        out.append(Interval(float(point[g]), float(lo), float(hi), float(dist[:, g].std(ddof=1)) if len(dist) > 1
                            else np.nan, len(n), n_boot - len(dist), note))
    return out
