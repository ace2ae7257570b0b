"""The order-symmetric 2AFC estimator, the pair-varying planted position pull and the task × group
interaction, against hand computations and brute force."""

from __future__ import annotations

from itertools import combinations, product

import numpy as np
import pandas as pd
import pytest
from scipy import optimize
from scipy.special import expit

from biasaudit.params.vlm import PlantedReflect, Reflect
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import interaction, two_afc
from biasaudit.vlm.analysis.inputs import Boot

GROUPS4 = ("AM", "AF", "WM", "WF")


def rows(*answers):
    return pd.DataFrame(answers, columns=["unit", "group_a", "group_b", "choice"])


def test_order_pairs_average_the_two_orders_and_drop_one_order_pairs():
    two = rows(("u0", "AM", "WF", "A"), ("u0", "WF", "AM", "A"),  # first image both times: AM wins one of two
               ("u0", "AM", "WM", "A"), ("u0", "WM", "AM", "B"),  # AM both times
               ("u0", "AF", "WF", "A"), ("u0", "AF", "WF", "B"), ("u0", "WF", "AF", "B"),  # AF first twice: ½, then AF
               ("u1", "AM", "WF", "B"))  # one order only
    pairs, one_order = two_afc.order_pairs(two, GROUPS4)
    got = {(r.unit, r.lo, r.hi): r.s for r in pairs.itertuples()}
    assert got == {("u0", "AM", "WF"): 0.5, ("u0", "AM", "WM"): 1.0, ("u0", "AF", "WF"): 0.75}
    assert one_order == 1
    table = two_afc.win_rate_table(two, groups=GROUPS4, estimator="symmetric").set_index(["row", "col"])
    # the cell averages the pairs' s over the photos with both orders: u1's single answer is left out
    assert table.loc[("AM", "WF"), "rate"] == 0.5 and table.loc[("AM", "WF"), "n"] == 2
    assert table.loc[("WF", "AF"), "rate"] == 0.25
    pooled = two_afc.win_rate_table(two, groups=GROUPS4).set_index(["row", "col"])
    assert pooled.loc[("AM", "WF"), "rate"] == pytest.approx(1 / 3)  # u1's answer counts there


def exact_table(beta: dict[str, float], pull: dict[bool, float], photos: int) -> pd.DataFrame:
    """Each ordered pair asked once on each of `photos` photos; round(photos · P(first chosen)) of them 'A'."""
    out = []
    for a, b in product(GROUPS4, repeat=2):
        if a == b:
            continue
        same = a[-1] == b[-1]
        k = int(round(photos * expit(pull[same] + beta[a] - beta[b])))
        out += [(f"u{i:03d}", a, b, "A" if i < k else "B") for i in range(photos)]
    return rows(*out)


def brute_force_symmetric(two: pd.DataFrame, reference: str) -> dict[str, float]:
    """Maximise Σ_pairs [S log σ(β_lo − β_hi) + (T − S) log σ(β_hi − β_lo)] directly, S = the lo-chosen answers
    of both orders, T = the answers (each order once per photo, so the order average weighs both equally)."""
    idx = {g: i for i, g in enumerate(GROUPS4)}
    lo_first = two["group_a"].map(idx) < two["group_b"].map(idx)
    lo = np.where(lo_first, two["group_a"], two["group_b"])
    hi = np.where(lo_first, two["group_b"], two["group_a"])
    lo_won = (two["choice"] == "A") == lo_first
    S = pd.DataFrame({"lo": lo, "hi": hi, "w": lo_won}).groupby(["lo", "hi"])["w"].agg(["sum", "count"])
    others = [g for g in GROUPS4 if g != reference]

    def nll(theta):
        b = dict(zip(others, theta)) | {reference: 0.0}
        eta = np.array([b[lo] - b[hi] for lo, hi in S.index])
        return -float(np.sum(S["sum"] * np.log(expit(eta)) + (S["count"] - S["sum"]) * np.log(expit(-eta))))

    fit = optimize.minimize(nll, np.zeros(len(others)), method="BFGS", options={"gtol": 1e-10})
    return dict(zip(others, fit.x))


def test_symmetric_bradley_terry_under_a_pair_varying_pull_matches_brute_force():
    beta = {"AM": 0.3, "AF": -0.2, "WM": 0.5, "WF": 0.0}
    two = exact_table(beta, {True: 1.5, False: 0.0}, photos=400)
    bt, why = two_afc.bradley_terry_symmetric(two, "WF", 0.95, GROUPS4)
    assert why == "" and int(bt["pairs_one_order"].iloc[0]) == 0
    got = bt.set_index("term")["strength"]
    for g, v in brute_force_symmetric(two, "WF").items():
        assert got[g] == pytest.approx(v, abs=1e-5)


def test_symmetric_bradley_terry_is_null_under_a_pair_varying_pull_where_the_pooled_one_is_not():
    """No group effect, pull 1.5 within gender, −1.5 across: the order average is ½ in every pair (nothing
    for the strengths to fit), while the pooled model's single position term can be neither pull."""
    two = exact_table(dict.fromkeys(GROUPS4, 0.0), {True: 1.5, False: -1.5}, photos=200)
    pairs, _ = two_afc.order_pairs(two, GROUPS4)
    assert np.allclose(pairs.groupby(["lo", "hi"])["s"].mean(), 0.5)
    pooled, _ = two_afc.bradley_terry(two, "WF", 0.95, GROUPS4)
    alpha = pooled.set_index("term").loc["position_first", "strength"]
    assert abs(alpha - 1.5) > 0.5 and abs(alpha + 1.5) > 0.5
    bt, why = two_afc.bradley_terry_symmetric(two, "WF", 0.95, GROUPS4)
    assert bt is None and "not identifiable" in why


def test_the_planted_pull_is_drawn_as_declared():
    pl = PlantedReflect()
    pl = pl.model_copy(update={"two_afc": pl.two_afc.model_copy(update={
        "position_same_gender": 1.5, "position_cross_gender": -0.5, "photo_sd": 0.0, "strengths": {}})})
    n = 40_000
    u = np.random.default_rng(0).random(n)
    for a, b, alpha in (("AM", "WM", 1.5), ("AF", "BF", 1.5), ("AM", "WF", -0.5), ("BF", "LM", -0.5)):
        share = (P.draw_2afc(pl, "income", [a] * n, [b] * n, np.zeros(n), np.zeros(n), u) == "A").mean()
        assert abs(share - expit(alpha)) < 4 * np.sqrt(expit(alpha) * (1 - expit(alpha)) / n)
        assert P.p_first(pl, "income", a, b) == pytest.approx(expit(alpha), abs=1e-12)
    units = pd.DataFrame({"unit": [f"u{i}" for i in range(60)], "occupation": "cook"})
    df = P.simulate_responses(pl, units, np.random.default_rng(1), Reflect(tasks=["2afc_income"]))
    by_type = two_afc.position_by_pair_type(df[df["status"] == "ok"], None).set_index("pair_type")
    for kind, alpha in (("same_gender", 1.5), ("cross_gender", -0.5)):
        r = by_type.loc[kind]
        assert abs(r["share_first"] - expit(alpha)) < 4 * np.sqrt(expit(alpha) * (1 - expit(alpha)) / r["n"])


def values_example() -> dict[str, pd.DataFrame]:
    v = {"t1": {"u0": {"BM": 1.0, "WM": 0.0, "BF": 2.0, "WF": 1.0}, "u1": {"BM": 0.5, "WM": 1.5, "BF": 0.0, "WF": 0.0},
                "u2": {"BM": 3.0, "WM": 1.0}},
         "t2": {"u0": {"BM": 10.0, "WM": 14.0, "BF": 9.0, "WF": 9.0}, "u1": {"BM": 12.0, "WM": 11.0},
                "u2": {"BM": 8.0, "WM": 8.0, "BF": 7.0, "WF": 10.0}}}
    return {t: pd.DataFrame([(u, g, x) for u, gs in d.items() for g, x in gs.items()], columns=["unit", "group", "v"])
            for t, d in v.items()}


def test_interaction_estimates_and_joint_test_against_a_direct_computation():
    values = values_example()
    boot = Boot(n_boot=200, level=0.95, method="percentile", seed=0, n_permutations=999, p_adjust="holm",
                min_clusters=2)
    table = interaction.interaction_table(values, "White", boot)
    black = table[table["race"] == "Black"].set_index(["kind", "task", "task_b"])
    # by hand: per photo, the mean over genders of v(Black) − v(White)
    x1 = np.array([np.mean([1.0, 1.0]), np.mean([-1.0, 0.0]), 2.0])
    x2 = np.array([np.mean([-4.0, 0.0]), 1.0, np.mean([0.0, -3.0])])

    def sd(photos):
        ss = sum(np.sum((np.array(p) - np.mean(p)) ** 2) for p in photos)
        return np.sqrt(ss / sum(len(p) - 1 for p in photos))

    sd1 = sd([[1, 0, 2, 1], [0.5, 1.5, 0, 0], [3, 1]])
    sd2 = sd([[10, 14, 9, 9], [12, 11], [8, 8, 7, 10]])
    th1, th2 = x1.mean() / sd1, x2.mean() / sd2
    assert black.loc[("effect", "t1", ""), "estimate"] == pytest.approx(th1)
    assert black.loc[("effect", "t2", ""), "estimate"] == pytest.approx(th2)
    assert black.loc[("difference", "t1", "t2"), "estimate"] == pytest.approx(th1 - th2)
    assert black.loc[("joint", "all", ""), "estimate"] == pytest.approx(abs(th1 - th2))
    # the sign-flip test by enumeration: |t| of the mean standardised difference, all 2³ sign vectors
    d = x1 / sd1 - x2 / sd2

    def t(v):
        return abs(v.mean()) / (v.std(ddof=1) / np.sqrt(len(v)))

    flips = [t(d * np.array(s)) for s in product((1, -1), repeat=3)]
    assert black.loc[("joint", "all", ""), "p"] == pytest.approx(np.mean(np.array(flips) >= t(d) - 1e-12))
    assert black.loc[("difference", "t1", "t2"), "low"] <= th1 - th2 <= black.loc[("difference", "t1", "t2"), "high"]


def test_interaction_rows_below_min_clusters_have_no_interval_and_say_why():
    boot = Boot(n_boot=200, level=0.95, method="percentile", seed=0, n_permutations=999, p_adjust="holm",
                min_clusters=4)
    table = interaction.interaction_table(values_example(), "White", boot)
    black = table[table["race"] == "Black"]
    assert black[["low", "high", "p"]].isna().all().all()
    assert black["reason"].str.contains("underpowered: 3 source photos < min_clusters 4").all()


def test_max_t_pairs_in_combinations_order():
    """The difference columns follow itertools.combinations, as the table's (task, task_b) labels."""
    sums = np.array([2.0, 4.0, 6.0, 2.0, 4.0, 4.0, 4.0, 1.0, 1.0, 1.0])  # Σx, n, ΣSS, Σdf for 3 tasks
    out = interaction.standardised_effects(sums, 3)
    theta = np.array([2.0, 4.0, 6.0]) / 2 / np.array([2.0, 2.0, 2.0])
    assert np.allclose(out, np.r_[theta, [theta[i] - theta[j] for i, j in combinations(range(3), 2)]])
