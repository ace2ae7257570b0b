"""Benchmark rows against values computed by hand from the agency tables."""

import numpy as np
import pytest

from biasaudit import GROUPS
from biasaudit.t2i import benchmarks as bm


@pytest.fixture(scope="module")
def bls():
    return bm.load_bls()


def row(df, instance):
    match = df[df["instance"] == instance]
    assert len(match) == 1, instance
    return match.iloc[0]


def test_occupation_hispanic_inside_white(bls):
    occ, counts = bm.occupation_benchmark(*bls, assumption="white")
    ceo = row(occ, "Chief executives")
    # BLS: W 85.3, B 5.6, A 7.0, H 8.4 → white = 85.3 − 8.4, other = 100 − 85.3 − 5.6 − 7.0
    assert [ceo[g] for g in GROUPS] == pytest.approx([0.769, 0.056, 0.070, 0.084, 0.021], abs=1e-9)
    assert ceo["size"] == 1802
    assert ceo["median_weekly_earnings_usd"] == 2908
    graders = row(occ, "Graders and sorters, agricultural products")
    assert [graders[g] for g in GROUPS] == pytest.approx([0.036, 0.157, 0.005, 0.66, 0.142], abs=1e-9)
    assert counts["suppressed_dropped"] == 199
    assert counts["kept"] == 367


def test_occupation_proportional_assumption(bls):
    occ, _ = bm.occupation_benchmark(*bls, assumption="proportional")
    ceo = row(occ, "Chief executives")
    keep = 1 - 0.084
    assert [ceo[g] for g in GROUPS] == pytest.approx(
        [0.853 * keep, 0.056 * keep, 0.070 * keep, 0.084, 0.021 * keep], abs=1e-9)


def test_clamped_rows_are_recorded_and_renormalised(bls):
    occ, counts = bm.occupation_benchmark(*bls, assumption="white")
    eng = row(occ, "Materials engineers")
    # W + B + A exceeds 100 here, so 'other' would be negative: clamp at 0 and renormalise.
    assert eng["clamped"] and eng["other"] == 0.0
    assert counts["clamped"] == int(occ["clamped"].sum()) > 0
    assert not occ.loc[~occ["clamped"], "other"].eq(0).all()


def test_suppressed_rows_are_dropped(bls):
    occ, _ = bm.occupation_benchmark(*bls)
    assert "Legislators" not in set(occ["instance"])  # BLS shows '-' (base under 50,000)


def test_county_shares():
    p2 = bm.load_p2()
    geo = bm.geography_benchmark(p2, "county")
    autauga = row(geo, "Autauga County, Alabama")
    total = 58805
    expected = [41582 / total, 11352 / total, (873 + 22) / total, 2117 / total, (184 + 185 + 2490) / total]
    assert [autauga[g] for g in GROUPS] == pytest.approx(expected, abs=1e-12)
    assert autauga["size"] == total
    assert len(geo) == 3143  # 50 states + DC, Puerto Rico excluded by default


def test_states_are_sums_of_counties():
    states = bm.geography_benchmark(bm.load_p2(), "state")
    assert len(states) == 51
    assert states["size"].sum() == 331_449_281  # published 2020 resident population (states + DC)
    dc = row(states, "District of Columbia")
    assert dc["black"] == pytest.approx(282066 / 689545)


def test_surname_shares_2020():
    sur = bm.surname_benchmark(bm.load_census_surnames(2020))
    smith = row(sur, "Smith")
    raw = np.array([67.99, 22.62, 0.68, 3.50, 0.83 + 4.37])
    assert [smith[g] for g in GROUPS] == pytest.approx(raw / raw.sum(), abs=1e-9)
    assert smith["size"] == 2369644


def test_surname_2010_is_selectable():
    sur = bm.surname_benchmark(bm.load_census_surnames(2010))
    assert row(sur, "Smith")["white"] == pytest.approx(70.90 / 99.99, abs=1e-6)


@pytest.mark.parametrize("table", ["occupation", "geography", "surname"])
def test_shares_sum_to_one(table, bls):
    if table == "occupation":
        df = bm.occupation_benchmark(*bls)[0]
    elif table == "geography":
        df = bm.geography_benchmark(bm.load_p2())
    else:
        df = bm.surname_benchmark(bm.load_census_surnames())
    sums = df[list(GROUPS)].sum(axis=1)
    assert np.allclose(sums, 1.0, atol=1e-12)
    assert (df[list(GROUPS)] >= 0).all().all()


def test_sensitivity_summary(bls):
    long = bm.assumption_sensitivity(*bls, ["white", "proportional", "other"])
    summary = bm.sensitivity_summary(long, "white").set_index("assumption")
    assert summary.loc["white", "max_tvd_vs_baseline"] == 0
    # Moving all Hispanic workers from White to the residual moves exactly H out of white (before clamping):
    assert summary.loc["other", "mean_tvd_vs_baseline"] > summary.loc["proportional", "mean_tvd_vs_baseline"] > 0


def test_exclusive_shares_sum_to_100():
    for assumption in ("white", "proportional", "other"):
        parts = bm.exclusive_race_shares([70.0], [10.0], [5.0], [20.0], assumption)
        assert sum(v[0] for v in parts.values()) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="unknown Hispanic assumption"):
        bm.exclusive_race_shares([1], [1], [1], [1], "nope")
