"""Skin-tone group summaries: diversity = mean pairwise ΔE2000 (vectorised = a plain loop), seeded pair
capping, circular hue mean, bootstrap CIs."""

import itertools

import numpy as np
import pandas as pd
import pytest

from biasaudit.faces.colour import delta_e2000
from biasaudit.stats.skin_summary import circular_mean_deg, mean_pairwise_de2000, skin_summary


def test_mean_pairwise_equals_loop():
    lab = np.random.default_rng(0).uniform([10, -5, 0], [90, 30, 40], size=(25, 3))
    loop = np.mean([float(delta_e2000(lab[i], lab[j])) for i, j in itertools.combinations(range(25), 2)])
    got, pairs = mean_pairwise_de2000(lab)
    assert pairs == 300 and got == pytest.approx(loop, abs=1e-10)
    assert np.isnan(mean_pairwise_de2000(lab[:1])[0]) and mean_pairwise_de2000(lab[:1])[1] == 0


def test_pair_capping_is_seeded_and_close():
    lab = np.random.default_rng(1).uniform([10, -5, 0], [90, 30, 40], size=(400, 3))
    full, _ = mean_pairwise_de2000(lab)
    a = mean_pairwise_de2000(lab, max_pairs=20_000, seed=3)
    assert a == mean_pairwise_de2000(lab, max_pairs=20_000, seed=3) and a[1] == 20_000
    assert a[0] == pytest.approx(full, rel=0.02)


def test_circular_hue_mean():
    """[350, 10] averages to 0 (not 360.0: the range is [0, 360)); opposite hues have no mean (issue 17)."""
    from biasaudit.stats.skin_summary import circular_mean

    m = circular_mean_deg(np.array([350.0, 10.0]))
    assert 0.0 <= m < 360.0 and min(m, 360.0 - m) < 1e-9
    assert circular_mean_deg(np.array([40.0, 60.0])) == pytest.approx(50.0)
    value, reason = circular_mean(np.array([0.0, 180.0]))
    assert np.isnan(value) and "cancel" in reason
    assert np.isnan(circular_mean(np.array([90.0, 270.0]))[0])


def test_skin_summary_groups_and_cis():
    rng = np.random.default_rng(2)
    n = 60
    df = pd.DataFrame({"model": "m", "label": rng.choice(["black", "white"], n), "prompt_id": rng.choice(list("abcdef"), n),
                       "L": rng.uniform(20, 80, n), "a": rng.uniform(5, 20, n), "b": rng.uniform(10, 30, n)})
    df["C"] = np.hypot(df["a"], df["b"])
    df["h"] = np.degrees(np.arctan2(df["b"], df["a"]))
    df.loc[0, "L"] = np.nan
    out = skin_summary(df, by=["model", "label"], n_boot=100, seed=0).set_index("label")
    ok = df[df["L"].notna()]
    for g, sub in ok.groupby("label"):
        assert out.loc[g, "n"] == len(sub) and out.loc[g, "L_mean"] == pytest.approx(sub["L"].mean())
        assert out.loc[g, "L_mean_lo"] <= out.loc[g, "L_mean"] <= out.loc[g, "L_mean_hi"]
        assert out.loc[g, "diversity_de2000"] == pytest.approx(mean_pairwise_de2000(sub[["L", "a", "b"]].to_numpy())[0])


def test_vectorised_replicates_equal_the_explicit_resampled_multiset():
    """Each bootstrap replicate (multiplicities m) gives exactly what expanding the multiset and averaging
    ΔE2000 over its pairs of positions holding *different* images gives: a copy is never paired with its
    own image (issue 17: copies counted at distance 0 shifted diversity down by about D/(n−1))."""
    from biasaudit.faces.colour import delta_e2000
    from biasaudit.stats.skin_summary import replicate_stats

    rng = np.random.default_rng(3)
    n = 9
    lab = np.column_stack([rng.uniform(20, 80, n), rng.uniform(-5, 25, n), rng.uniform(0, 35, n)])
    C = np.hypot(lab[:, 1], lab[:, 2])
    m = rng.integers(0, 4, size=(6, n)).astype(float)
    m[:, 0] += 1  # every replicate has at least two positions
    m[0] = 0
    m[0, 2] = 2  # one image twice: no pair of different images, diversity undefined
    i, j = np.triu_indices(n, k=1)
    got = replicate_stats(m, lab[:, 0], C, i, j, delta_e2000(lab[i], lab[j]))
    assert np.isnan(got[0, 2])
    for b in range(1, len(m)):
        idx = np.repeat(np.arange(n), m[b].astype(int))
        a, c = np.triu_indices(len(idx), k=1)
        distinct = idx[a] != idx[c]
        expected_div = delta_e2000(lab[idx[a][distinct]], lab[idx[c][distinct]]).mean()
        np.testing.assert_allclose(got[b], [lab[idx, 0].mean(), C[idx].mean(), expected_div], rtol=1e-12, atol=1e-12)


def test_diversity_interval_is_not_shifted_down():
    """With copies excluded the bootstrap distribution of diversity centres on the estimate instead of
    ≈ D/(n−1) below it (issue 17). 12 prompts × 1 image each: the old shift would be ≈ 9% of D."""
    rng = np.random.default_rng(5)
    n = 12
    df = pd.DataFrame({"model": "m", "label": "x", "prompt_id": [f"p{i}" for i in range(n)],
                       "L": rng.uniform(30, 70, n), "a": rng.uniform(5, 20, n), "b": rng.uniform(10, 30, n)})
    df["C"], df["h"] = np.hypot(df["a"], df["b"]), np.degrees(np.arctan2(df["b"], df["a"]))
    out = skin_summary(df, n_boot=2000, seed=1).iloc[0]
    mid = (out["diversity_de2000_lo"] + out["diversity_de2000_hi"]) / 2
    assert abs(mid - out["diversity_de2000"]) < 0.04 * out["diversity_de2000"]


def test_single_image_group_has_no_interval():
    df = pd.DataFrame({"model": "m", "label": ["x"], "prompt_id": ["p"], "L": [50.0], "a": [10.0], "b": [20.0],
                       "C": [22.4], "h": [63.4]})
    out = skin_summary(df, n_boot=50).iloc[0]
    assert np.isnan(out["diversity_de2000"]) and np.isnan(out["diversity_de2000_lo"])
    assert out["diversity_de2000_reason"]
