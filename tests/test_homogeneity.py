"""The O(N·d) homogeneity gap equals a brute-force pairwise computation (float64, 1e-9)."""

import numpy as np
import pandas as pd
import pytest

from biasaudit.stats import homogeneity as H


def brute(X, labels, cats):
    X = X / np.linalg.norm(X, axis=1, keepdims=True)
    K = X @ X.T
    labels = np.asarray(labels, dtype=object)
    out = []
    for g in cats:
        m = labels == g
        other = (labels != g) & np.array([v is not None for v in labels])
        n = m.sum()
        intra = (K[np.ix_(m, m)].sum() - np.trace(K[np.ix_(m, m)])) / (n * (n - 1)) if n >= 2 else np.nan
        inter = K[np.ix_(m, other)].mean() if n >= 1 and other.sum() >= 1 else np.nan
        out.append((n, intra, inter, intra - inter))
    return np.array(out, dtype=float)


@pytest.mark.parametrize("sizes", [[1, 5], [2, 2, 2], [1, 1, 1], [7], [3, 0, 4], [50, 1, 13, 2], [200, 37]])
@pytest.mark.parametrize("d", [3, 16])
def test_equals_brute_force(sizes, d):
    rng = np.random.default_rng(sum(sizes) * d)
    labels = [f"g{k}" for k, s in enumerate(sizes) for _ in range(s)]
    X = rng.normal(size=(len(labels), d)) + rng.normal(size=d)  # correlated rows: non-trivial gaps
    cats = [f"g{k}" for k in range(len(sizes))]
    got = H.homogeneity_gap(X, labels, categories=cats, small_group=30)
    ref = brute(X, labels, cats)
    np.testing.assert_array_equal(got["n"], ref[:, 0])
    for j, col in enumerate(["intra", "inter", "gap"], start=1):
        np.testing.assert_allclose(got[col].to_numpy(), ref[:, j], atol=1e-9, rtol=0, equal_nan=True)


def test_reasons_and_flags():
    X = np.random.default_rng(1).normal(size=(6, 4))
    got = H.homogeneity_gap(X, ["a"] * 5 + ["b"], categories=["a", "b", "c"], small_group=3).set_index("group")
    assert got.loc["b", "reason"].startswith("fewer than 2") and np.isnan(got.loc["b", "intra"])
    assert got.loc["c", "reason"] == "empty group" and got.loc["c", "n"] == 0
    assert bool(got.loc["b", "small"]) and not bool(got.loc["a", "small"])
    single = H.homogeneity_gap(X, ["a"] * 6, small_group=30).set_index("group")
    assert single.loc["a", "reason"].startswith("single group") and np.isnan(single.loc["a", "inter"])
    assert np.isfinite(single.loc["a", "intra"])


def test_invariant_to_row_order_and_scale():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 32)) + 0.5
    labels = rng.choice(["a", "b", "c", "d"], size=300)
    base = H.homogeneity_gap(X, labels, small_group=30)
    perm = rng.permutation(300)
    scaled = X * rng.uniform(0.1, 100, size=(300, 1))
    for Xv, lv in [(X[perm], labels[perm]), (scaled, labels), (X.astype(np.float32), labels)]:
        other = H.homogeneity_gap(Xv, lv, small_group=30)
        tol = 1e-6 if Xv.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(other[["intra", "inter", "gap"]], base[["intra", "inter", "gap"]], atol=tol)


def test_missing_labels_are_left_out():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20, 5))
    labels = np.array(["a"] * 8 + ["b"] * 8 + [None] * 4, dtype=object)
    got = H.homogeneity_gap(X, labels, small_group=30)
    ref = H.homogeneity_gap(X[:16], labels[:16], small_group=30)
    assert list(got["group"]) == ["a", "b"]
    np.testing.assert_allclose(got[["intra", "inter"]], ref[["intra", "inter"]], atol=1e-12)


def test_bootstrap_one_cluster_is_nan_with_reason():
    """A single cluster says nothing about between-prompt variation: NaN with a reason (issue 17)."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 8)) + 1
    labels = rng.choice(["a", "b"], size=40)
    ci = H.bootstrap_gap(X, labels, ["p0"] * 40, n_boot=20, seed=0).set_index("group")
    assert ci["gap_lo"].isna().all() and ci["gap_hi"].isna().all()
    assert (ci["ci_reason"] == "one cluster: no interval").all()


def test_bootstrap_replicate_equals_brute_force_on_resampled_rows():
    """A bootstrap replicate computed from cluster sums equals the gap on the duplicated rows."""
    rng = np.random.default_rng(5)
    X = H.l2_normalise(rng.normal(size=(30, 6)) + 1)
    labels = rng.choice(["a", "b", "c"], size=30)
    clusters = rng.choice(["p0", "p1", "p2", "p3", "p4"], size=30)
    gcodes, cats = H._codes(labels)
    ccodes, clist = H._codes(clusters)
    S, n, q = H.group_sums(X, ccodes * 3 + gcodes, 15)
    w = np.array([2.0, 0, 1, 0, 2])
    Sb = (w @ S.reshape(5, -1)).reshape(3, -1)
    got = H.gap_from_sums(Sb, w @ n.reshape(5, 3), w @ q.reshape(5, 3))
    rows = np.concatenate([np.repeat(np.flatnonzero(ccodes == p), int(w[p])) for p in range(5)])
    ref = H.homogeneity_gap(X[rows], labels[rows], categories=cats, small_group=30)
    np.testing.assert_allclose(got[2], ref["gap"], atol=1e-12)


def test_bootstrap_ci_covers_estimate_and_is_seeded():
    rng = np.random.default_rng(6)
    X = rng.normal(size=(400, 16))
    labels = rng.choice(["a", "b"], size=400)
    X[labels == "a"] += 0.8
    clusters = rng.integers(0, 20, size=400).astype(str)
    est = H.homogeneity_gap(X, labels, small_group=30).set_index("group")
    a = H.bootstrap_gap(X, labels, clusters, n_boot=300, seed=1).set_index("group")
    b = H.bootstrap_gap(X, labels, clusters, n_boot=300, seed=1).set_index("group")
    pd.testing.assert_frame_equal(a, b)
    assert ((a["gap_lo"] <= est["gap"]) & (est["gap"] <= a["gap_hi"])).all()


def test_permutation_pvalue_detects_signal_and_not_noise():
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 16))
    labels = np.array(["a"] * 60 + ["b"] * 240)
    noise = H.permutation_pvalue(X, labels, n_perm=199, seed=0).set_index("group")
    X2 = X.copy()
    X2[:60] += 1.0  # group a tightly clustered
    sig = H.permutation_pvalue(X2, labels, n_perm=199, seed=0).set_index("group")
    assert sig.loc["a", "p_perm"] == pytest.approx(1 / 200)
    assert noise.loc["a", "p_perm"] > 0.01


def test_gap_table_within_model():
    rng = np.random.default_rng(8)
    meta = pd.DataFrame({"model": ["m1"] * 30 + ["m2"] * 20, "race": rng.choice(["white", "black", ""], 50),
                         "prompt_id": rng.choice(["p1", "p2", "p3"], 50)})
    X = rng.normal(size=(50, 8))
    t = H.homogeneity_table(X, meta, by="race", within="model", n_boot=50, n_perm=49, small_group=30)
    assert set(t["model"]) == {"m1", "m2"} and set(t["group"]) <= {"white", "black"}
    m1 = meta["model"] == "m1"
    ref = H.homogeneity_gap(X[m1.to_numpy()], meta.loc[m1, "race"].replace("", None).to_numpy(), small_group=30)
    np.testing.assert_allclose(t[t.model == "m1"].sort_values("group")["gap"], ref.sort_values("group")["gap"])
    assert {"gap_lo", "gap_hi", "p_perm", "small"} <= set(t.columns)


def test_zero_and_non_finite_rows_are_dropped_and_counted():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(150, 6)) + 0.3  # 150 rows: several of the kernel's 64-row blocks
    labels = rng.choice(["a", "b"], size=150).astype(object)
    bad = [5, 70, 71]
    X[5] = 0
    X[70, 2], X[71, 0] = np.nan, np.inf
    got = H.homogeneity_gap(X, labels, categories=["a", "b"], small_group=30).set_index("group")
    keep = np.setdiff1d(np.arange(150), bad)
    ref = brute(X[keep], labels[keep], ["a", "b"])
    np.testing.assert_allclose(got[["n", "intra", "inter", "gap"]].to_numpy(), ref, atol=1e-9)
    k = {g: sum(labels[i] == g for i in bad) for g in ("a", "b")}
    assert got["n_dropped"].to_dict() == k
    for g in ("a", "b"):
        assert (f"{k[g]} zero or non-finite embedding rows dropped" in got.loc[g, "reason"]) == (k[g] > 0)
    scale = H.row_scales(X)
    np.testing.assert_allclose(scale[keep], 1 / np.linalg.norm(X[keep], axis=1), rtol=1e-12)
    assert (scale[bad] == 0).all()
