"""The corrected TVD point estimate (stats.correction.eb_tvd), the rule that decides which point the
report reads, the random distortion grid it is judged on, and NaN-with-a-reason for a non-finite
confusion matrix. Truths come from the simulation's definition (the true shares are known), never
from the estimator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from biasaudit import GROUPS
from biasaudit.stats.correction import (
    MIN_PROMPTS_POINT,
    _share_sd,
    above_floor_p,
    classifier_corrected_tvd,
    condition_number,
    corrected_deviation,
    corrected_per_prompt,
    debiased_tvd,
    eb_pooled_deviation,
    image_confusions,
    mse_weight,
    point_rule,
    tvd_lower_bound,
)
from biasaudit.stats.tvd import tvd
from biasaudit.t2i.analysis.calibration import band_count

from .conftest import calibration_module as _calibration

M = np.array([[0.95, 0.01, 0.01, 0.02, 0.01], [0.02, 0.94, 0.01, 0.02, 0.01], [0.01, 0.01, 0.95, 0.02, 0.01],
              [0.20, 0.02, 0.10, 0.65, 0.03], [0.10, 0.05, 0.10, 0.10, 0.65]])
BENCH = np.array([[0.6, 0.15, 0.1, 0.1, 0.05], [0.3, 0.4, 0.1, 0.15, 0.05]])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_confusion_gives_nan_with_a_reason(bad):
    Mbad = M.copy()
    Mbad[3, 0] = bad
    counts = np.array([[60, 15, 10, 10, 5], [30, 40, 10, 15, 5.0]])
    iv, info = debiased_tvd(counts, BENCH, None, GROUPS, n_boot=20, M=Mbad)
    assert np.isnan(iv.estimate) and "non-finite" in iv.reason and not info["identifiable"]
    assert all(np.isnan(d.estimate) and "non-finite" in d.reason
               for d in corrected_deviation(counts, BENCH, None, GROUPS, n_boot=20, M=Mbad))
    shares, t, why = corrected_per_prompt(counts, BENCH, Mbad)
    assert np.isnan(shares).all() and np.isnan(t).all() and "non-finite" in why
    # an estimated M with a non-finite count (E is the reliability sample's per-image counts)
    E = image_confusions([[g] for g in GROUPS for _ in range(20)], [g for g in GROUPS for _ in range(20)], GROUPS)
    E[0, 0] = bad
    raw, corr, cinfo = classifier_corrected_tvd(counts, BENCH, E, GROUPS, n_boot=30)
    assert np.isnan(corr.estimate) and "non-finite" in corr.reason and np.isfinite(raw.estimate)
    iv, info = debiased_tvd(counts, BENCH, E, GROUPS, n_boot=20)  # the same estimated M in the corrected TVD
    assert np.isnan(iv.estimate) and "non-finite" in iv.reason and not info["identifiable"]
    assert all(np.isnan(d.estimate) and "non-finite" in d.reason
               for d in corrected_deviation(counts, BENCH, E, GROUPS, n_boot=20))
    # batched: only the broken matrix is NaN
    cond = condition_number(np.stack([M, Mbad, np.eye(5)]))
    assert np.isfinite(cond[0]) and np.isnan(cond[1]) and cond[2] == pytest.approx(1.0)


def test_pooled_prior_estimate_is_the_posterior_mean_under_the_true_prior():
    """Many prompts: the moment estimates of the prior converge, so the estimate is the posterior mean
    μ + τ²/(τ² + sd²)(d − μ) computed with the true μ and τ² of the simulation (the definition)."""
    rng = np.random.default_rng(0)
    P, mu, tau, sd = 20_000, np.array([-0.2, 0.05, 0.1, 0.0, 0.05]), np.array([0.05, 0.02, 0.0, 0.03, 0.01]), 0.04
    delta = mu + tau * rng.normal(size=(P, 5))
    d = delta + sd * rng.normal(size=(P, 5))
    lam = tau ** 2 / (tau ** 2 + sd ** 2)
    gap = np.abs(eb_pooled_deviation(d, np.full((P, 5), sd)) - (mu + lam * (d - mu)))
    assert gap.mean() < 5e-4 and gap.max() < 5e-3  # the moment estimates' own sampling error
    # a deviation every prompt shares is kept, not shrunk toward 0
    assert eb_pooled_deviation(d, np.full((P, 5), sd))[:, 0].mean() == pytest.approx(-0.2, abs=2e-3)
    # one prompt: nothing to pool, the estimate is d
    np.testing.assert_array_equal(eb_pooled_deviation(d[:1], np.full((1, 5), sd)), d[:1])


def test_point_rule_reads_raw_below_the_declared_number_of_prompts():
    value, why = point_rule(MIN_PROMPTS_POINT, 0.1, 0.2, 0.75, 0.03, 0.02)
    assert value == 0.1 and why.startswith("MSE-weighted: 0.75 × corrected + 0.25 × raw") and "0.030" in why
    value, why = point_rule(MIN_PROMPTS_POINT - 1, 0.1, 0.2)
    assert value == 0.2 and why.startswith("raw:") and str(MIN_PROMPTS_POINT) in why
    assert point_rule(50, float("nan"), 0.2)[0] == 0.2


def test_mse_weight_on_a_hand_example_and_against_a_grid_search():
    R, Cc, theta = np.array([0.30, 0.34, 0.26]), np.array([0.21, 0.19, 0.20]), 0.20
    w, mse_r, mse_c = mse_weight(R, Cc, theta)
    # by hand: mean((R−θ)(R−C)) = 0.0336/3, mean((R−C)²) = 0.0342/3
    assert w == pytest.approx(0.0336 / 0.0342) and mse_r == pytest.approx(0.0332 / 3)
    assert mse_c == pytest.approx(0.0002 / 3)
    # the weight minimises the draws' MSE of the mix: a grid search over [0, 1] agrees
    rng = np.random.default_rng(3)
    for _ in range(5):
        R, Cc = 0.2 + 0.05 * rng.normal(size=50) + rng.uniform(-0.05, 0.05), 0.2 + 0.08 * rng.normal(size=50)
        grid = np.linspace(0, 1, 100_001)
        best = grid[np.argmin([np.mean(((1 - g) * R + g * Cc - 0.2) ** 2) for g in grid[::100]]) * 100]
        assert mse_weight(R, Cc, 0.2)[0] == pytest.approx(best, abs=2e-3)
    # a corrected estimate that only scatters around a raw one that is right: all weight on raw
    assert mse_weight(np.full(4, 0.2), np.array([0.1, 0.3, 0.15, 0.25]), 0.2)[0] == 0.0


def test_share_sd_stack_matches_the_multinomial_covariance():
    rng = np.random.default_rng(0)
    pi, W = rng.dirichlet(np.ones(5), size=(3, 4)), np.linalg.inv(M.T)
    n = np.array([12.0, 1.0, 30.0, 5.0])
    got = _share_sd(pi, n, np.stack([W] * 3))
    for b in range(3):
        for j in range(4):
            cov = (np.diag(pi[b, j]) - np.outer(pi[b, j], pi[b, j])) / (n[j] - 1) if n[j] > 1 else None
            want = np.sqrt(np.diag(W @ cov @ W.T)) if cov is not None else (W.max(1) - W.min(1)) / 2
            np.testing.assert_allclose(got[b, j], want, atol=1e-12)


def test_lower_bound_against_a_brute_force_over_sign_vectors():
    """Three groups: the bound recomputed with loops over the 8 sign vectors and the draws."""
    import itertools

    rng = np.random.default_rng(1)
    D = np.array([0.12, -0.07, -0.05])
    draws = D + 0.03 * rng.normal(size=(400, 3))
    signs = [np.array(s) for s in itertools.product([-1.0, 1.0], repeat=3)]
    se = [np.std([0.5 * s @ x for x in draws], ddof=1) for s in signs]
    centre = draws.mean(axis=0)
    t = [max((0.5 * s @ x - 0.5 * s @ centre) / e for s, e in zip(signs, se)) for x in draws]
    c = np.quantile(t, 0.95)
    want = max(0.0, max(0.5 * s @ D - c * e for s, e in zip(signs, se)))
    assert tvd_lower_bound(D, draws, 0.95) == pytest.approx(want)
    assert 0 < want < 0.5 * np.abs(D).sum()


def test_lower_bound_covers_and_the_floor_test_holds_its_level_on_tiny_counts():
    """3 prompts × 8 images, M known. Model = benchmark: the null-floor test rejects at most
    0.05 + 3 MC SE and the bound stays ≤ the true TVD (0); a model far from it: the bound stays below the
    true mean TVD in ≥ 95% − 3 SE of audits and the test rejects most of the time."""
    rng = np.random.default_rng(2)
    bench = np.array([[0.6, 0.15, 0.1, 0.1, 0.05], [0.3, 0.4, 0.1, 0.15, 0.05], [0.5, 0.2, 0.1, 0.1, 0.1]])
    far = np.tile([0.1, 0.1, 0.6, 0.1, 0.1], (3, 1))
    reps, se = 200, 3 * np.sqrt(0.05 * 0.95 / 200)
    for p, null in ((bench, True), (far, False)):
        truth = float(tvd(p, bench).mean())
        below, reject = [], []
        for rep in range(reps):
            counts = np.stack([rng.multinomial(8, r @ M) for r in p]).astype(float)
            _, info = debiased_tvd(counts, bench, None, GROUPS, n_boot=199, seed=rep, M=M)
            below.append(info["lower_bound"] <= truth + 1e-12)
            reject.append(info["above_floor_p"] <= 0.05)
        assert np.mean(below) >= 0.95 - se, (null, np.mean(below))
        if null:
            assert np.mean(reject) <= 0.05 + se, np.mean(reject)
        else:
            assert np.mean(reject) >= 0.8, np.mean(reject)


def test_above_floor_p_counts_null_draws_at_or_above():
    assert above_floor_p(0.5, np.array([0.1, 0.6, 0.5, 0.2])) == pytest.approx(3 / 5)
    assert np.isnan(above_floor_p(0.5, np.array([])))


def test_the_committed_grid_is_the_seeded_draw():
    cal = _calibration()
    grid = cal.load_grid()
    assert grid == cal.draw_grid() and len(grid) >= 8
    for point in grid:
        Mg = np.asarray(point["confusion"])
        assert Mg.shape == (5, 5) and np.allclose(Mg.sum(axis=1), 1, atol=1e-5) and (Mg > 0).all()
        assert np.sum(point["scale"]) == pytest.approx(5, abs=1e-5)


def _audits(cal, P, n, points, reps, declared=False, seed=0):
    rng = np.random.default_rng(seed)
    err, raw_err = [], []
    for rep in range(reps):
        counts, q, E, Mg, truth = cal.distortion_audit(rng, P, n, points[rep % len(points)], declared)
        raw = float(tvd(counts / n, q).mean())
        _, info = debiased_tvd(counts, q, E, GROUPS, n_boot=20, seed=rep, M=Mg if declared else None)
        point = point_rule(P, info["mse_weighted"], raw, info["weight"])[0]  # what the report reads
        err.append(abs(point - truth))
        raw_err.append(abs(raw - truth))
    err, raw_err = np.array(err), np.array(raw_err)
    return float(np.mean(err < raw_err)), float(err.mean()), float(raw_err.mean())


@pytest.mark.slow
@pytest.mark.parametrize("P, n", [(50, 100), (15, 12)])
def test_corrected_point_beats_raw_on_the_random_grid(P, n):
    """Paper scale and the demo's all-prompts row (both ≥ MIN_PROMPTS_POINT prompts): closer to the
    true mean TVD than the raw TVD in ≥ 60% of 144 simulated audits over the grid, with a lower MAE."""
    cal = _calibration()
    closer, mae, raw_mae = _audits(cal, P, n, cal.load_grid(), 144)
    assert closer >= 0.60 and mae < raw_mae, (closer, mae, raw_mae)


@pytest.mark.slow
def test_the_failing_case_with_m_declared():
    """Asian ×2, White ×0.6, 25% Hispanic→White at 50 × 100 with the confusion matrix known: the
    estimator itself beats raw (with M estimated from 300 images the error of M̂ dominates: measured in
    benchmarks/results/tvd_grid.csv and the calibration table)."""
    cal = _calibration()
    closer, mae, raw_mae = _audits(cal, 50, 100, [cal.failing_case()], 100, declared=True)
    assert closer >= 0.70 and mae < raw_mae, (closer, mae, raw_mae)


def test_band_count_counts_in_band_labelled_and_measured_rows():
    table = pd.DataFrame({"kind": ["coverage", "coverage", "rejection", "coverage", "share", "power"],
                          "flag": ["ok", "n < 50, skewed: under-covers", "ok", "n < 50, skewed: under-covers",
                                   "measured: beats raw", "measured (power)"]})
    text = band_count(table)
    assert text.startswith("2 of 4 coverage and rejection rows within their band")
    assert "2 outside it, each labelled: 2 × 'n < 50, skewed: under-covers'" in text
    assert text.endswith("2 measured rows (power, share closer than raw) have no band")
