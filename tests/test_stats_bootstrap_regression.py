"""Cluster bootstrap and cluster-robust OLS against hand-computed values and scipy/statsmodels."""

import numpy as np
import pytest
from scipy import stats

from biasaudit.stats.bootstrap import cluster_bootstrap, ratio
from biasaudit.stats.regression import ols_cluster


@pytest.mark.parametrize("method", ["percentile", "basic", "BCa"])
def test_mean_of_cluster_values_matches_scipy_bootstrap_of_the_mean(method):
    """Every method agrees with scipy.stats.bootstrap (an independent implementation) within Monte
    Carlo error; basic and BCa used to crash on any scalar statistic (AxisError, issue 17)."""
    values = np.array([0.1, 0.4, 0.35, 0.8, 0.2, 0.55, 0.3, 0.05, 0.6, 0.15, 0.45, 0.9])
    totals = np.column_stack([np.ones_like(values), values])
    iv = cluster_bootstrap(totals, ratio(1, 0), n_boot=20_000, seed=3, method=method, expand=False)[0]
    ref = stats.bootstrap((values,), np.mean, n_resamples=20_000, method=method, rng=np.random.default_rng(3))
    assert iv.estimate == pytest.approx(values.mean())
    assert iv.low == pytest.approx(ref.confidence_interval.low, abs=0.01)
    assert iv.high == pytest.approx(ref.confidence_interval.high, abs=0.01)
    assert iv.se == pytest.approx(ref.standard_error, rel=0.05)


def test_vector_statistic_with_every_method():
    rng = np.random.default_rng(2)
    totals = np.column_stack([np.ones(30), rng.normal(size=30), rng.normal(3, 1, size=30)])
    for method in ("percentile", "basic", "BCa"):
        a, b = cluster_bootstrap(totals, lambda s: np.stack([s[..., 1] / s[..., 0], s[..., 2] / s[..., 0]], -1),
                                 n_boot=500, method=method)
        assert a.low < a.estimate < a.high and b.low < b.estimate < b.high


def test_columns_are_resampled_together():
    """The difference of identical columns is 0 in every resample: a zero-width interval is NaN
    with a reason, not [0, 0] (issue 17)."""
    x = np.arange(10.0)
    out = cluster_bootstrap(np.column_stack([x, x]), lambda s: s[..., 0] - s[..., 1], n_boot=200)[0]
    assert out.estimate == 0 and out.se == 0
    assert np.isnan(out.low) and np.isnan(out.high) and "zero-width" in out.reason


def test_one_cluster_is_nan_with_reason():
    out = cluster_bootstrap(np.array([[1.0, 0.3]]), ratio(1, 0), n_boot=100)[0]
    assert out.estimate == pytest.approx(0.3) and np.isnan(out.low) and out.reason == "one cluster: no interval"


def test_p_adjust_matches_hand_values():
    from biasaudit.stats.resample import p_adjust

    p = np.array([0.01, 0.04, 0.03, np.nan])
    # Holm: sorted 0.01·3, 0.03·2, 0.04·1 → 0.03, 0.06, 0.06 (monotone); BH: 0.03, 0.04, 0.04
    np.testing.assert_allclose(p_adjust(p, "holm"), [0.03, 0.06, 0.06, np.nan])
    np.testing.assert_allclose(p_adjust(p, "bh"), [0.03, 0.04, 0.04, np.nan])


def test_standard_error_close_to_analytic_for_many_clusters():
    rng = np.random.default_rng(0)
    values = rng.normal(5, 2, size=400)
    iv = cluster_bootstrap(np.column_stack([np.ones(400), values]), ratio(1, 0), n_boot=2000, seed=1)[0]
    analytic = values.std(ddof=1) / np.sqrt(400)
    assert iv.se == pytest.approx(analytic, rel=0.1)
    assert iv.low < values.mean() < iv.high


def test_ratio_of_sums_weights_clusters_by_size():
    totals = np.array([[2, 10], [1, 1], [3, 4]], dtype=float)  # (hits, n) per prompt
    iv = cluster_bootstrap(totals, ratio(0, 1), n_boot=100)[0]
    assert iv.estimate == pytest.approx(6 / 15)
    assert 0 <= iv.low <= iv.high <= 1


def test_undefined_resamples_are_excluded_and_counted():
    totals = np.array([[1, 1], [0, 0], [0, 0], [0, 0]], dtype=float)  # denominator 0 unless cluster 0 drawn
    iv = cluster_bootstrap(totals, ratio(0, 1), n_boot=500, seed=0)[0]
    assert iv.estimate == 1.0 and np.isnan(iv.low) and np.isnan(iv.high) and "zero-width" in iv.reason
    # P(cluster 0 never drawn) = (3/4)^4 ≈ 0.32
    assert 100 < iv.n_undefined < 220 and "undefined" in iv.reason


@pytest.mark.parametrize("n", [0, 1])
def test_fewer_than_two_clusters_give_no_interval_with_a_reason(n):
    iv = cluster_bootstrap(np.ones((n, 2)), ratio(0, 1), n_boot=100)[0]
    assert np.isnan(iv.low) and np.isnan(iv.high) and iv.reason


def test_vector_statistic_returns_one_interval_per_output():
    totals = np.random.default_rng(1).random((12, 3))
    out = cluster_bootstrap(totals, lambda s: s[..., 1:] / s[..., :1], n_boot=100)
    assert len(out) == 2 and all(o.low <= o.estimate <= o.high for o in out)


def test_ols_cluster_matches_hand_computed_sandwich():
    # 4 clusters of 3; slope/intercept by the normal equations, CR1 sandwich by hand.
    x = np.repeat([1.0, 2.0, 3.0, 4.0], 3)
    y = np.array([1.0, 1.5, 0.5, 2.2, 1.8, 2.6, 2.9, 3.3, 3.1, 4.4, 3.6, 4.0])
    g = np.repeat(list("abcd"), 3)
    X = np.column_stack([np.ones_like(x), x])
    beta = np.linalg.solve(X.T @ X, X.T @ y)
    u = y - X @ beta
    bread = np.linalg.inv(X.T @ X)
    meat = sum(np.outer(X[g == c].T @ u[g == c], X[g == c].T @ u[g == c]) for c in "abcd")
    n, k, G = 12, 2, 4
    V = bread @ meat @ bread * G / (G - 1) * (n - 1) / (n - k)
    se = np.sqrt(V[1, 1])
    t = stats.t(df=G - 1)
    fit = ols_cluster(y, x, g)
    assert fit.slope == pytest.approx(beta[1]) and fit.intercept == pytest.approx(beta[0])
    assert fit.se == pytest.approx(se)
    assert (fit.ci_low, fit.ci_high) == pytest.approx((beta[1] - t.ppf(0.975) * se, beta[1] + t.ppf(0.975) * se))
    assert fit.p_value == pytest.approx(2 * t.sf(abs(beta[1] / se)))
    assert (fit.n, fit.n_clusters, fit.reason) == (12, 4, "")
    assert fit.r2 == pytest.approx(1 - (u @ u) / ((y - y.mean()) @ (y - y.mean())))


def test_ols_cluster_with_fixed_effects_matches_statsmodels():
    """A slope within categories (one intercept shift per category), 9 clusters: the fit equals statsmodels'
    OLS with cov_type="cluster" and use_t (an independent implementation) to rounding."""
    import statsmodels.api as sm

    rng = np.random.default_rng(5)
    g = np.repeat(np.arange(9), 7)
    f = rng.choice(["p", "q", "r"], size=len(g))
    x = rng.normal(size=9)[g] + rng.normal(size=len(g))
    y = 1.0 + 0.4 * x + (f == "q") * 2.0 + rng.normal(size=9)[g] + rng.normal(size=len(g))
    fit = ols_cluster(y, x, g, fixed=f, level=0.9)
    X = np.column_stack([np.ones_like(x), x, f == "q", f == "r"]).astype(float)
    ref = sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True)
    assert fit.slope == pytest.approx(ref.params[1], rel=1e-12) and fit.intercept == pytest.approx(ref.params[0])
    assert fit.se == pytest.approx(ref.bse[1], rel=1e-10)
    assert (fit.ci_low, fit.ci_high) == pytest.approx(tuple(ref.conf_int(alpha=0.1)[1]), rel=1e-10)
    assert fit.p_value == pytest.approx(ref.pvalues[1], rel=1e-9)
    assert fit.r2 == pytest.approx(ref.rsquared, rel=1e-12)


@pytest.mark.parametrize("y,x,g,why", [
    ([1, 2], [1, 2], ["a", "b"], "too few observations"),
    ([1, 2, 3, 4], [1, 1, 2, 2], ["a", "a", "b", "b"], "too few clusters"),
    ([1, 2, 3, 4], [5, 5, 5, 5], ["a", "b", "c", "d"], "x does not vary"),
])
def test_ols_cluster_degenerate_inputs_give_reasons(y, x, g, why):
    fit = ols_cluster(y, x, g)
    assert np.isnan(fit.slope) and why in fit.reason


def test_ols_cluster_drops_missing_rows():
    fit = ols_cluster([1, 2, np.nan, 4, 5, 7], [1, 2, 3, 4, 5, np.nan], list("aabbcc"))
    assert fit.n == 4


@pytest.mark.slow
def test_p_adjust_matches_statsmodels():
    """Our Holm/BH (statsmodels' multipletests calls gc.collect on every call) equal statsmodels'."""
    from statsmodels.stats.multitest import multipletests

    from biasaudit.stats.resample import p_adjust

    rng = np.random.default_rng(0)
    for _ in range(12):
        p = rng.random(rng.integers(1, 12)) ** 2
        np.testing.assert_allclose(p_adjust(p, "holm"), multipletests(p, method="holm")[1])
        np.testing.assert_allclose(p_adjust(p, "bh"), multipletests(p, method="fdr_bh")[1])


def test_expanded_percentile_levels():
    """Hesterberg's expansion: z_{1−α'} = √(P/(P−1))·t_{0.975, P−1}; wider than plain, → plain as P grows."""
    from biasaudit.stats.resample import expanded_alpha

    for P in (3, 10, 50, 1000):
        z = np.sqrt(P / (P - 1)) * stats.t.ppf(0.975, P - 1)
        assert expanded_alpha(0.95, P) == pytest.approx(1 - stats.norm.cdf(z))
    assert expanded_alpha(0.95, 10) < expanded_alpha(0.95, 50) < expanded_alpha(0.95, 1000) < 0.025
    values = np.random.default_rng(0).normal(size=10)
    totals = np.column_stack([np.ones(10), values])
    wide = cluster_bootstrap(totals, ratio(1, 0), n_boot=4000)[0]
    plain = cluster_bootstrap(totals, ratio(1, 0), n_boot=4000, expand=False)[0]
    assert wide.low < plain.low and wide.high > plain.high


def test_effective_cluster_count_sets_each_components_expansion():
    """n_effective replaces P in a component's expansion: its interval is the bootstrap quantiles at
    expanded_alpha(level, k) (checked against np.quantile directly); below 2 clusters, no interval."""
    from biasaudit.stats.resample import Replicates, expanded_alpha, intervals

    dist = np.random.default_rng(1).normal(size=(5000, 3))
    rep = Replicates(np.zeros(3), dist, None, 50)
    got = intervals(rep, 0.95, "percentile", n_effective=[50, 6, 1])
    for i, k in enumerate((50, 6)):
        a = expanded_alpha(0.95, k)
        assert (got[i].low, got[i].high) == pytest.approx(tuple(np.quantile(dist[:, i], [a, 1 - a])))
    assert got[1].high - got[1].low > got[0].high - got[0].low
    assert np.isnan(got[2].low) and "fewer than 2" in got[2].reason
    assert [iv.low for iv in intervals(rep, 0.95, "percentile")][:1] == [got[0].low]  # default: P for all


def test_cluster_weights_are_multinomial_resamples_of_each_stratum():
    """A replicate's multiplicities are Multinomial(k, 1/k each) per stratum (a with-replacement resample of k
    clusters): every row sums to k, and the moments are the multinomial's, mean 1, variance 1 − 1/k,
    covariance −1/k (here within Monte Carlo error of 40,000 replicates)."""
    from biasaudit.stats.resample import cluster_weights

    w = cluster_weights((7, 3), 40_000, np.random.default_rng(0))
    assert w.shape == (40_000, 10) and np.all(w >= 0) and np.all(w == np.round(w))
    for part, k in ((w[:, :7], 7), (w[:, 7:], 3)):
        assert np.all(part.sum(axis=1) == k)
        np.testing.assert_allclose(part.mean(axis=0), 1.0, atol=0.02)
        np.testing.assert_allclose(part.var(axis=0), 1 - 1 / k, rtol=0.03)
        np.testing.assert_allclose(np.cov(part[:, :2].T)[0, 1], -1 / k, atol=0.02)
    assert abs(np.corrcoef(w[:, 0], w[:, 7])[0, 1]) < 0.02  # strata independent
    assert cluster_weights((0, 2), 5, np.random.default_rng(1)).shape == (5, 2)
