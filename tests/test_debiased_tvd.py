"""TVD corrected for classifier error and finite n (stats.correction.debiased_tvd): its bias bound,
its honest interval's coverage, the empirical-Bayes point estimate and the consensus reference, each
against the definition or a brute-force simulation with known truth."""

import numpy as np
import pytest

from biasaudit import GROUPS
from biasaudit.stats.correction import (
    corrected_deviation,
    debiased_tvd,
    eb_abs_deviation,
    folded_normal_mean,
    image_confusions,
    reference_labels,
)
from biasaudit.stats.tvd import tvd

# the paper's error pattern: Hispanic faces often called White or Asian
M = np.array([[0.95, 0.01, 0.01, 0.02, 0.01], [0.02, 0.94, 0.01, 0.02, 0.01], [0.01, 0.01, 0.95, 0.02, 0.01],
              [0.20, 0.02, 0.10, 0.65, 0.03], [0.10, 0.05, 0.10, 0.10, 0.65]])
BENCH = np.array([[0.6, 0.15, 0.1, 0.1, 0.05], [0.3, 0.4, 0.1, 0.15, 0.05], [0.85, 0.05, 0.04, 0.04, 0.02],
                  [0.2, 0.1, 0.5, 0.15, 0.05], [0.5, 0.05, 0.05, 0.35, 0.05]])


def planted(bench, black=0.5):
    p = bench.copy()
    p[:, 1] *= black
    p[:, 0] += bench[:, 1] - p[:, 1]
    return p


def test_folded_normal_mean_is_E_abs():
    rng = np.random.default_rng(0)
    for mu, sd in ((0.0, 1.0), (0.7, 0.3), (-2.0, 0.5)):
        x = rng.normal(mu, sd, 400_000)
        assert folded_normal_mean(mu, sd) == pytest.approx(np.abs(x).mean(), abs=4e-3)
    assert folded_normal_mean(-0.4, 0.0) == pytest.approx(0.4)


def test_eb_shrinks_noise_to_zero_and_keeps_large_deviations():
    rng = np.random.default_rng(1)
    sd = np.full((40, 5), 0.1)
    noise = eb_abs_deviation(rng.normal(0, 0.1, (40, 5)), sd)
    assert noise.mean() < 0.3 * 0.1 * np.sqrt(2 / np.pi)  # plug-in |d| would average 0.08
    big = np.tile([0.8, -0.6, 0.5, -0.7, 0.9], (40, 1)) + rng.normal(0, 0.01, (40, 5))
    np.testing.assert_allclose(eb_abs_deviation(big, np.full((40, 5), 0.01)), np.abs(big), atol=1e-3)


def test_plug_in_bias_lies_inside_the_bound():
    """0 ≤ E[T] − θ ≤ B (Jensen, triangle inequality, Cauchy–Schwarz), checked by brute force: the mean
    linear plug-in over many draws against the truth, and B from the true classified shares."""
    rng = np.random.default_rng(2)
    p, n = planted(BENCH), 12
    W = np.linalg.inv(M.T)
    pi = p @ M
    draws = np.stack([rng.multinomial(n, row, size=40_000) for row in pi], axis=1) / n
    mean_T = tvd(draws @ W.T, BENCH[None]).mean()
    truth = tvd(p, BENCH).mean()
    cov = pi[:, :, None] * np.eye(5)[None] - pi[:, :, None] * pi[:, None, :]
    sd = np.sqrt(np.einsum("gc,jcd,gd->jg", W, cov, W) / n)
    bound = 0.5 * sd.sum(axis=1).mean()
    assert 0 < mean_T - truth <= bound


def test_honest_interval_covers_the_true_tvd_at_small_n():
    """Known M, 5 prompts × 12 images, for a biased model and for one drawing exactly from the benchmark:
    the interval covers the mean TVD over these prompts in ≥ 95% of 300 simulated audits (it is
    conservative by construction), and the point estimate is closer to the truth than the raw TVD."""
    rng = np.random.default_rng(3)
    for p in (planted(BENCH), BENCH.copy()):
        truth = tvd(p, BENCH).mean()
        covered, closer = [], []
        for rep in range(300):
            counts = np.stack([rng.multinomial(12, row @ M) for row in p])
            iv, info = debiased_tvd(counts, BENCH, None, GROUPS, n_boot=200, seed=rep, M=M)
            assert iv.low <= iv.high and info["bias_bound"] > 0
            covered.append(iv.low <= truth <= iv.high)
            closer.append(abs(iv.estimate - truth) < abs(tvd(counts / 12, BENCH).mean() - truth))
        assert np.mean(covered) >= 0.95
        assert np.mean(closer) >= 0.8


def test_corrected_deviation_is_unbiased_given_M():
    rng = np.random.default_rng(4)
    p = planted(BENCH)
    est = [np.array([d.estimate for d in corrected_deviation(np.stack([rng.multinomial(12, r @ M) for r in p]),
                                                              BENCH, None, GROUPS, n_boot=50, seed=i, M=M)])
           for i in range(400)]
    np.testing.assert_allclose(np.mean(est, axis=0), (p - BENCH).mean(axis=0), atol=0.012)


def test_unidentifiable_confusion_gives_nan_with_reason():
    E = image_confusions([[g] for g in GROUPS for _ in range(30)], ["white"] * 150, GROUPS)
    iv, info = debiased_tvd(np.array([[6, 3, 1, 1, 1.0]]), BENCH[:1], E, GROUPS, n_boot=50)
    assert np.isnan(iv.estimate) and "not identifiable" in iv.reason and not info["identifiable"]


def test_consensus_reference_drops_disagreements_only():
    humans = [["white", "white"], ["white", "hispanic"], ["black"], [], ["asian", "asian", "asian"]]
    assert reference_labels(humans, "consensus") == [["white"], [], ["black"], [], ["asian"]]
    assert reference_labels(humans, "every_label") == humans
    with pytest.raises(ValueError, match="confusion_reference"):
        reference_labels(humans, "majority")


def test_corrected_deviation_interval_covers_at_its_level():
    """The per-race deviation interval (within-prompt redraws, known M) over 400 simulated audits of
    5 prompts × 30 images: coverage of the true mean deviation within Monte-Carlo error of 95%."""
    rng = np.random.default_rng(5)
    p = planted(BENCH)
    truth = (p - BENCH).mean(axis=0)
    hits = []
    for rep in range(400):
        counts = np.stack([rng.multinomial(30, r @ M) for r in p])
        ivs = corrected_deviation(counts, BENCH, None, GROUPS, n_boot=300, seed=rep, M=M)
        hits.append([iv.low <= t <= iv.high for iv, t in zip(ivs, truth)])
    rate = np.mean(hits, axis=0)
    assert (rate >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / 400)).all(), rate


def test_no_labelled_prompt_gives_nan_with_reason():
    iv, _ = debiased_tvd(np.zeros((2, 5)), BENCH[:2], None, GROUPS, n_boot=20, M=M)
    assert np.isnan(iv.estimate) and iv.reason == "no prompt with a label"
    assert all(np.isnan(d.estimate) for d in corrected_deviation(np.zeros((1, 5)), BENCH[:1], None, GROUPS, M=M))
