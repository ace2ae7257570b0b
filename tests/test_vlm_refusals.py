"""Issue #38: refusals by group, worst-case bounds, intervals below min_clusters, the primary family.

Oracles: counts and bounds by hand or by brute force over every way to answer the refused questions,
statsmodels' multipletests for Holm, and the planted VLM's would-have-answered values."""

from itertools import product

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from biasaudit.params.vlm import PlantedReflect, ReflectAnalysis
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import endpoints, gaps, refusals, significance, two_afc
from biasaudit.vlm.analysis.inference import underpowered_intervals

from .fixtures_vlm import WITH_INCOME, answers, boot, config, with_task_values

OCC = ("cook", "doctor", "lawyer", "nurse", "teacher", "ceo")


def units(G):
    return pd.DataFrame({"unit": [f"u{i:02d}" for i in range(G)], "occupation": [OCC[i % 6] for i in range(G)]})


def cmp(a, b, choice, unit, status="ok", task="income"):
    return {"kind": "2afc", "task": task, "unit": unit, "occupation": "doctor", "group_a": a, "group_b": b,
            "choice": choice, "status": status, "order": 0}


def one(group, race, gender, unit, status="ok", choice=None, kind="mcq", task="salary", usd=np.nan):
    return {"kind": kind, "task": task, "unit": unit, "occupation": "doctor", "group": group, "race": race,
            "gender": gender, "choice": choice, "value_usd": usd, "status": status}


def test_retention_by_group_counts_by_hand():
    df = pd.DataFrame([cmp("BM", "WM", "A", "u1"), cmp("BM", "WM", None, "u1", "refused"),
                       cmp("AM", "BM", None, "u2", "failed"), one("BF", "Black", "woman", "u1", "refused"),
                       one("BF", "Black", "woman", "u2", choice="C")])
    t = refusals.retention_by_group(df).set_index(["group", "kind", "task"])
    bm = t.loc[("BM", "2afc", "income")]
    assert (bm["asked"], bm["retained"], bm["refused"], bm["failed"]) == (3, 1, 1, 1)
    assert bm["refused_share"] == pytest.approx(1 / 2)  # refused / (asked − failed)
    assert t.loc[("WM", "2afc", "income"), "asked"] == 2 and t.loc[("AM", "2afc", "income"), "failed"] == 1
    bf = t.loc[("BF", "mcq", "salary")]
    assert (bf["asked"], bf["retained"], bf["refused"], bf["retained_share"]) == (2, 1, 1, 0.5)


def test_refusal_gap_test_rejects_a_gap_and_not_equal_rates():
    rng = np.random.default_rng(0)
    n = np.full((20, 10), 30.0)
    equal = rng.binomial(30, 0.1, size=(20, 10)).astype(float)
    gap = equal.copy()
    gap[:, 2] = rng.binomial(30, 0.4, size=20)
    assert refusals.refusal_gap_test(gap, n, 199, 1)[1] == pytest.approx(1 / 200)
    assert refusals.refusal_gap_test(equal, n, 199, 1)[1] > 0.05
    assert np.isnan(refusals.refusal_gap_test(np.zeros((3, 10)), n[:3], 99, 1)[1])


def _race_winrate(df):
    """Black men's race win rate within men over the comparisons of df (brute force over rows)."""
    black = df[(df["group_a"] == "BM") | (df["group_b"] == "BM")]
    won = np.where(black["choice"] == "A", black["group_a"], black["group_b"]) == "BM"
    return won.mean()


def test_race_win_rate_bounds_equal_a_brute_force_over_the_refused_answers():
    rows = [cmp("BM", "WM", "A", "u1"), cmp("WM", "BM", "A", "u1"), cmp("BM", "AM", None, "u1", "refused"),
            cmp("LM", "BM", "B", "u2"), cmp("BM", "MEM", None, "u2", "refused"), cmp("BM", "WM", "B", "u2"),
            cmp("AM", "BM", None, "u2", "failed")]
    df = pd.DataFrame(rows)
    refused = df.index[df["status"] == "refused"]
    values = []
    for filled in product("AB", repeat=len(refused)):
        full = df.copy()
        full.loc[refused, "choice"] = filled
        values.append(_race_winrate(full[full["status"] != "failed"]))
    t = refusals.race_win_rate_bounds(df, boot(n_boot=200)).set_index(["gender", "race"]).loc[("man", "Black")]
    assert (t["lower"], t["upper"]) == pytest.approx((min(values), max(values)))
    assert t["complete_case"] == pytest.approx(2 / 4) and t["n_refused"] == 2


def test_delta_g_bounds_equal_a_brute_force_over_the_refused_answers():
    scale = {"A": 1.0, "B": 2.0, "C": 4.0}
    rows = [one("BM", "Black", "man", "u1", choice="B"), one("WM", "White", "man", "u1", "refused"),
            one("BF", "Black", "woman", "u1", "refused"), one("WF", "White", "woman", "u1", choice="C"),
            one("BM", "Black", "man", "u2", "refused"), one("WM", "White", "man", "u2", choice="A"),
            one("BF", "Black", "woman", "u2", "failed"), one("WF", "White", "woman", "u2", choice="B")]
    df = pd.DataFrame(rows)
    refused = df.index[df["status"] == "refused"]
    values = []
    for filled in product("ABC", repeat=len(refused)):
        full = df[df["status"] != "failed"].copy()
        full.loc[refused, "choice"] = filled
        full["y"] = full["choice"].map(scale)
        black = full[full["race"] == "Black"].set_index(["unit", "gender"])["y"]
        white = full[full["race"] == "White"].set_index(["unit", "gender"])["y"]
        both = black.index.intersection(white.index)  # the matched (photo, gender) cells
        values.append(100 * (black[both] - white[both]).sum() / white[both].sum())
    cfg = config(with_task_values("mcq_salary", scale), n_boot=200, min_clusters=2)
    t = refusals.delta_g_bounds(df, cfg).set_index(["measure", "dimension", "level"]).loc[("mcq_salary", "race", "Black")]
    assert (t["lower"], t["upper"]) == pytest.approx((min(values), max(values)))
    assert (t["n_refused_level"], t["n_refused_reference"]) == (2, 1)


def test_every_interval_is_blanked_below_min_clusters_on_a_6_photo_table():
    pl = PlantedReflect()
    df = P.simulate_responses(pl, units(6), np.random.default_rng(3), WITH_INCOME)
    cfg = config(n_boot=200, n_permutations=99, wild_bootstrap=0, min_clusters=12)
    data = answers(df)
    e = two_afc.estimates(data, cfg)["income"]
    tables = [e["winrate"].dropna(subset=["rate"]), e["race_winrate"], gaps.estimates(data, cfg)["delta_g"],
              significance.estimates(data, cfg)["ols"].rename(columns={"ci_low": "low", "ci_high": "high"}),
              e["bradley_terry"].rename(columns={"ci_low": "low", "ci_high": "high"}),
              refusals.estimates(data, cfg)["race_winrate_bounds"], refusals.estimates(data, cfg)["delta_g_bounds"]]
    for t in tables:
        assert t[["low", "high"]].isna().all().all()
        assert t["reason"].str.contains(r"underpowered: \d source photos < min_clusters 12; the interval would "
                                        "under-cover").all()
    assert np.isnan(e["position_bias"]["share_first_low"])
    assert "underpowered" in e["position_bias"]["share_first_reason"]


def test_underpowered_intervals_keeps_rows_with_enough_photos():
    t = pd.DataFrame({"low": [0.1, 0.2], "high": [0.3, 0.4], "reason": ["", "x"]})
    out = underpowered_intervals(t, pd.Series([12, 5], index=[7, 8]), 12)  # another index: positions count
    assert out.loc[0, "low"] == 0.1 and np.isnan(out.loc[1, "low"])
    assert out.loc[1, "reason"] == "underpowered: 5 source photos < min_clusters 12; the interval would under-cover; x"


def test_holm_over_the_primary_family_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.001, 0.04, 0.012, 0.30, 0.02])
    out = endpoints.holm(pd.DataFrame({"p": p}), 0.05)
    reject, p_holm, _, _ = multipletests(p, alpha=0.05, method="holm")
    assert out["p_holm"].to_numpy() == pytest.approx(p_holm)
    assert list(out["reject"]) == list(reject)


@pytest.mark.parametrize("bad", ["delta_g:salary:race:Black", "delta_g:mcq_salary:race:man",
                                 "race_winrate:income:Black:man", "winrate:income:man:Black"])
def test_a_bad_primary_endpoint_is_refused_naming_the_key(bad):
    with pytest.raises(ValidationError, match="reflect_analysis.primary_endpoints"):
        ReflectAnalysis(primary_endpoints=[bad])


def test_primary_endpoints_table_on_planted_answers():
    pl = PlantedReflect(refusal={}, edit_loss={})
    df = P.simulate_responses(pl, units(12), np.random.default_rng(4), WITH_INCOME)
    cfg = config(n_boot=200, n_permutations=199, wild_bootstrap=0)
    t = endpoints.primary_endpoints(answers(df), cfg)
    assert list(t["endpoint"]) == ReflectAnalysis().primary_endpoints and (t["family"] == "primary").all()
    bm = t.set_index("endpoint").loc["race_winrate:income:man:Black"]
    # the headline (symmetric) race win rate, from its definition: per (photo, BM vs a man of another race)
    # retained in both orders, the mean over the two orders of BM's win share; averaged over those pairs
    ok = df[(df["kind"] == "2afc") & (df["status"] == "ok")]
    rivals = ["AM", "LM", "MEM", "WM"]
    ok = ok[((ok["group_a"] == "BM") & ok["group_b"].isin(rivals)) | ((ok["group_b"] == "BM") & ok["group_a"].isin(rivals))]
    ok = ok.assign(rival=ok["group_a"].where(ok["group_b"] == "BM", ok["group_b"]), bm_first=ok["group_a"] == "BM",
                   bm_won=(ok["choice"] == "A") == (ok["group_a"] == "BM"))
    per_order = ok.groupby(["unit", "rival", "bm_first"])["bm_won"].mean().unstack("bm_first").dropna()
    assert bm["estimate"] == pytest.approx(per_order.mean(axis=1).mean())


def test_planted_selective_refusal_is_bounded_and_biases_the_complete_case():
    """Strong selective refusal of Black faces' favourable 2AFC picks and low answers: the would-have-answered
    values (the planted VLM without refusals) lie in the bounds' CIs, while the complete-case race win
    rate of Black men falls below its would-have-answered value."""
    pl = PlantedReflect(refusal={}, edit_loss={}, selective_refusal={"two_afc": 0.45, "low_answer": 0.45})
    df = P.simulate_responses(pl, units(24), np.random.default_rng(5), WITH_INCOME)
    cfg = config(n_boot=400, n_permutations=199, wild_bootstrap=0)
    e = refusals.estimates(answers(df), cfg)
    truth = P.estimands(P.would_answer(pl), units(24), cfg.reflect_analysis, two_afc_tasks=("income",))
    rw = e["race_winrate_bounds"].merge(truth["two_afc"]["income"]["race_winrate"], on=["gender", "race"])
    assert ((rw["low"] <= rw["planted"]) & (rw["planted"] <= rw["high"])).mean() >= 0.9
    bm = rw.set_index(["gender", "race"]).loc[("man", "Black")]
    assert bm["complete_case"] < bm["planted"] - 0.05 and bm["n_refused"] > 0
    dg = pd.concat([e["delta_g_bounds"][e["delta_g_bounds"]["measure"] == m].merge(t["delta_g"], on=["dimension", "level"])
                    for m, t in truth["single"].items()])
    assert ((dg["low"] <= dg["planted"]) & (dg["planted"] <= dg["high"])).mean() >= 0.85  # 95 % CIs, 15 rows
    gaps_found = e["refusal_gaps"].set_index(["kind", "task"])
    assert gaps_found.loc[("2afc", "income"), "p"] < 0.05 and gaps_found.loc[("2afc", "income"), "highest_group"] in (
        "BM", "BF")


def test_backend_and_simulation_share_the_selective_refusal_draw():
    """The extra refusal applies exactly to a listed group's chosen image / low answer."""
    pl = PlantedReflect(selective_refusal={"groups": ["BM"], "two_afc": 0.2, "low_answer": 0.3})
    assert P.selective_2afc(pl, ["BM", "WM"], ["WM", "BM"], ["A", "A"]).tolist() == [0.2, 0.0]
    low = P.low_letter(pl, "salary")  # base 0.10, 0.20, 0.25, …: the median letter is C (index 2)
    assert low == 2
    assert P.selective_single(pl, "mcq", "salary", ["BM", "BM", "WM"], ["cook"] * 3, [1, 2, 0]).tolist() == [0.3, 0, 0]
    assert P.selective_single(pl, "salary", "salary", ["BM", "BM"], ["cook", "cook"], [37000, 39000]).tolist() == [0.3, 0]
    assert not P.selective(P.would_answer(pl)) and P.would_answer(pl).refusal == {}


def test_a_task_whose_every_answer_failed_gets_a_row_not_a_crash():
    """The tiny stand-in's case: one task with no answered question (every call failed)."""
    rows = [{"kind": "mcq", "task": "salary", "unit": f"u{u}", "group": g, "status": "failed"}
            for u in range(3) for g in ("WM", "BM")]
    t = refusals.refusal_gaps(pd.DataFrame(rows).assign(group_a=None, group_b=None), boot(min_clusters=2))
    assert len(t) == 1 and np.isnan(t["p"].iloc[0]) and t["reason"].iloc[0]
