"""Issue 17 regression tests: exact TVD floor and bias correction by brute-force enumeration, copy-pair
exclusion by explicit multisets, identifiability of the classifier-error correction, design-respecting
permutation tests, degenerate inputs as NaN + reason."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from biasaudit.stats import homogeneity as H
from biasaudit.stats.correction import (
    classifier_corrected_tvd,
    corrected_per_prompt,
    identifiability,
    image_confusions,
    matrix_from_counts,
)
from biasaudit.stats.tvd import bias_corrected_tvd, expected_tvd, null_floor, tvd


def _multinomial_outcomes(n: int, p: np.ndarray):
    """Every count vector of Multinomial(n, p) with its probability (brute force)."""
    k = len(p)
    for cut in itertools.combinations(range(n + k - 1), k - 1):  # stars and bars
        bounds = (-1, *cut, n + k - 1)
        x = np.array([bounds[i + 1] - bounds[i] - 1 for i in range(k)])
        prob = math.factorial(n) / np.prod([math.factorial(v) for v in x]) * np.prod(p ** x)
        yield x, prob


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_expected_tvd_equals_enumeration(n):
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.3, 0.3, 0.2, 0.1, 0.1])
    brute = sum(prob * tvd(x / n, q) for x, prob in _multinomial_outcomes(n, p))
    assert expected_tvd(n, p, q)[0] == pytest.approx(brute, abs=1e-12)
    floor = sum(prob * tvd(x / n, q) for x, prob in _multinomial_outcomes(n, q))
    assert null_floor(n, q)[0] == pytest.approx(floor, abs=1e-12)


def test_null_floor_at_two_images_uniform_benchmark():
    # two images, five equally likely groups: same group (p 1/5) → TVD 0.8; different → 0.6
    assert null_floor(2, np.full(5, 0.2))[0] == pytest.approx(0.2 * 0.8 + 0.8 * 0.6)


def test_bias_correction_is_twice_minus_the_bootstrap_mean():
    counts = np.array([[3, 1, 0, 0, 1]])
    q = np.array([0.6, 0.1, 0.1, 0.1, 0.1])
    p_hat = counts[0] / 5
    boot_mean = sum(prob * tvd(x / 5, q) for x, prob in _multinomial_outcomes(5, p_hat))
    assert bias_corrected_tvd(counts, q)[0] == pytest.approx(2 * tvd(p_hat, q) - boot_mean, abs=1e-12)


def test_tvd_summary_reports_floor_corrected_and_paired():
    from biasaudit.t2i.analysis.inputs import Boot
    from biasaudit.t2i.analysis.representation import tvd_paired, tvd_summary

    rng = np.random.default_rng(0)
    rows = []
    groups = ("white", "black", "asian", "hispanic", "other")
    for model, skew in (("a", 0.0), ("b", 0.5)):
        for k in range(12):
            q = rng.dirichlet(np.ones(5))
            p = (1 - skew) * q + skew * np.eye(5)[0]
            c = rng.multinomial(50, p)
            rows.append({"model": model, "category": "surname", "prompt_id": f"p{k}", "n": 50, "n_unknown": 0,
                         **{f"n_{g}": c[i] for i, g in enumerate(groups)},
                         **{f"share_{g}": c[i] / 50 for i, g in enumerate(groups)},
                         **{f"bench_{g}": q[i] for i, g in enumerate(groups)}})
    pp = pd.DataFrame(rows)
    q = pp[[f"bench_{g}" for g in groups]].to_numpy()
    pp["tvd"] = tvd(pp[[f"share_{g}" for g in groups]].to_numpy(), q)
    pp["null_floor"] = null_floor(pp["n"].to_numpy(), q)
    pp["tvd_bias_corrected"] = bias_corrected_tvd(pp[[f"n_{g}" for g in groups]].to_numpy(), q)
    boot = Boot(n_boot=300, level=0.95, method="percentile", seed=0, p_adjust="holm", permutation_design="within")
    s = tvd_summary(pp, boot, groups).set_index(["model", "category"])
    assert s.loc[("a", "surname"), "null_floor"] == pytest.approx(pp[pp.model == "a"]["null_floor"].mean())
    assert s.loc[("a", "surname"), "tvd_bias_corrected"] < s.loc[("a", "surname"), "mean_tvd"]
    assert s.loc[("b", "all"), "tvd_bias_corrected_low"] < s.loc[("b", "all"), "tvd_bias_corrected_high"]
    paired = tvd_paired(pp, boot)
    row = paired[paired["category"] == "all"].iloc[0]
    assert row["diff"] == pytest.approx(pp[pp.model == "a"]["tvd"].mean() - pp[pp.model == "b"]["tvd"].mean())
    assert row["high"] < 0 and row["p_value"] < 0.05 and row["p_adjusted"] >= row["p_value"]


# ---- homogeneity ---------------------------------------------------------------------------------

def test_bootstrap_replicate_excludes_copy_pairs_exactly():
    """For any cluster weights, the replicate's intra/inter equal an explicit expansion of the resampled
    prompts (draws) in which no pair joins two draws of one prompt: never an image with its own copy."""
    rng = np.random.default_rng(3)
    n, d, P = 24, 5, 6
    X = H.l2_normalise(rng.normal(size=(n, d)) + 0.5)
    labels = rng.choice(["a", "b"], size=n)
    prompts = rng.integers(0, P, size=n)
    gc, cats = H._codes(labels)
    cells = H.cell_products(X, gc, prompts, len(cats), P)
    stat = H.gap_weight_statistic(cells)
    for w in (np.array([2, 0, 1, 1, 0, 2.0]), np.array([0, 0, 3, 0, 0, 3.0]), np.ones(6)):
        got = stat(w[None, :])[0]
        draws = [(c, k) for c in range(P) for k in range(int(w[c]))]
        idx = np.concatenate([np.flatnonzero(prompts == c) for c, _ in draws])
        draw = np.concatenate([np.full((prompts == c).sum(), t) for t, (c, _) in enumerate(draws)])
        clus = prompts[idx]
        K = X[idx] @ X[idx].T
        allowed = ((draw[:, None] == draw[None, :]) & (idx[:, None] != idx[None, :])) | (clus[:, None] != clus[None, :])
        for g, name in enumerate(cats):
            m = labels[idx] == name
            intra = K[np.outer(m, m) & allowed].mean()
            inter = K[np.outer(m, ~m) & allowed].mean()
            np.testing.assert_allclose(got[[g, len(cats) + g]], [intra, inter], atol=1e-12)


def test_group_of_one_has_no_interval():
    """A group of 1 used to get intra CI [1, 1] while its estimate was NaN (issue 17)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 4))
    labels = np.array(["a"] * 29 + ["b"])
    prompts = np.arange(30) % 6
    est = H.homogeneity_gap(X, labels, small_group=30).set_index("group")
    ci = H.bootstrap_gap(X, labels, prompts, n_boot=100).set_index("group")
    assert np.isnan(est.loc["b", "intra"]) and np.isnan(ci.loc["b", "intra_lo"]) and np.isnan(ci.loc["b", "gap_hi"])


def test_zero_and_nan_rows_are_dropped_and_counted():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 4))
    X[3] = 0.0
    X[7, 2] = np.nan
    labels = np.array(["a", "b"] * 10)
    out = H.homogeneity_gap(X, labels, small_group=30).set_index("group")
    clean = np.ones(20, bool)
    clean[[3, 7]] = False
    ref = H.homogeneity_gap(X[clean], labels[clean], small_group=30).set_index("group")
    assert out.loc["a", "n"] == 10 and out.loc["b", "n"] == 8  # rows 3 and 7 are both "b"
    assert out.loc["b", "n_dropped"] == 2
    np.testing.assert_allclose(out["gap"], ref["gap"], atol=1e-12)
    assert out["n_dropped"].sum() == 2 and "dropped" in " ".join(out["reason"])


def test_within_prompt_permutation_cannot_reject_when_prompts_fix_the_labels():
    """Every prompt has one label: permuting within prompts changes nothing, p = 1; across prompts the
    prompt effect looks like a label effect and the test rejects."""
    rng = np.random.default_rng(2)
    P, m, d = 10, 12, 6
    centres = rng.normal(size=(P, d)) * 2
    prompts = np.repeat(np.arange(P), m)
    X = centres[prompts] + rng.normal(size=(P * m, d))
    labels = np.where(prompts < 5, "a", "b")
    within = H.permutation_pvalue(X, labels, n_perm=99, clusters=prompts, design="within")
    across = H.permutation_pvalue(X, labels, n_perm=99, design="across")
    assert (within["p_perm"] == 1.0).all()
    assert (across["p_perm"] <= 0.02).all()


def test_permutation_statistic_matches_float64_gap():
    """The float32 GEMM statistic of the identity permutation equals the float64 estimate (p-values
    compare like with like)."""
    rng = np.random.default_rng(4)
    X = (rng.normal(size=(500, 32)) + 0.2).astype(np.float32)
    labels = rng.choice(["a", "b", "c"], size=500)
    out = H.permutation_pvalue(X, labels, n_perm=19, design="across")
    assert out["p_perm"].between(0.05, 1).all() and (out["design"] == "across").all()


def test_homogeneity_table_adds_adjusted_p():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 6))
    meta = pd.DataFrame({"model": "m", "race": rng.choice(["a", "b", "c"], 120), "prompt_id": np.arange(120) % 12})
    t = H.homogeneity_table(X, meta, by="race", n_boot=50, n_perm=49, small_group=30)
    assert {"p_value", "p_adjusted", "p_adjust_method"} <= set(t.columns)
    assert (t["p_adjusted"] >= t["p_value"] - 1e-12).all() and (t["p_adjust_method"] == "holm").all()


# ---- classifier-error correction -------------------------------------------------------------------

GROUPS5 = ("white", "black", "asian", "hispanic", "other")


def test_singular_confusion_is_not_identifiable():
    """A classifier that says 'white' for everyone gives a singular M: least squares used to return
    the corner white = 1.0; now NaN with the reason (issue 17)."""
    humans = [[g] for g in GROUPS5 for _ in range(40)]
    E = image_confusions(humans, ["white"] * len(humans), GROUPS5)
    M = matrix_from_counts(E.sum(axis=0), 5)
    cond, ok, reason = identifiability(M)
    assert not ok and "not identifiable" in reason
    shares, t, why = corrected_per_prompt(np.array([[10, 0, 0, 0, 0.0]]), np.full((1, 5), 0.2), M)
    assert np.isnan(shares).all() and np.isnan(t).all() and why


def test_corrected_tvd_recovers_planted_shares_and_resamples_images():
    rng = np.random.default_rng(6)
    M_true = np.full((5, 5), 0.05) + np.eye(5) * 0.75
    true = rng.choice(5, size=600)
    clf = np.array([rng.choice(5, p=M_true[t]) for t in true])
    humans = [[GROUPS5[t], GROUPS5[t]] for t in true]  # two raters who agree with the truth
    E = image_confusions(humans, [GROUPS5[c] for c in clf], GROUPS5)
    assert E.shape == (600, 25) and (E.sum(axis=1) == 2).all()  # both labels of an image in one row
    p = np.array([0.6, 0.1, 0.1, 0.1, 0.1])
    bench = np.tile([0.2, 0.2, 0.2, 0.2, 0.2], (8, 1))
    counts = np.round(np.tile(M_true.T @ p, (8, 1)) * 1000)
    raw, corr, info = classifier_corrected_tvd(counts, bench, E, GROUPS5, n_boot=200)
    assert info["identifiable"] and info["condition_number"] < 5
    assert corr.estimate == pytest.approx(tvd(p, bench[0]), abs=0.03) and raw.estimate < corr.estimate


def test_fleiss_rejects_unknown_labels():
    from biasaudit.t2i.reliability import fleiss

    with pytest.raises(ValueError, match="not among the categories"):
        fleiss(np.array([["a", "b"], ["a", "z"]]), ["a", "b"])
