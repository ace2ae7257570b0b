"""Method B's complete-case estimands under an answer-dependent (selective) refusal.

Oracles: a large simulated population (simulate_responses, 2,000 source photos per seed for 2AFC, 8,000 for single images) read by the
analysis' own estimators, with a tolerance of 4.5 cluster standard errors per quantity; and, with no
selective refusal, the answer-independent closed forms of `estimands` (a separate derivation)."""

import numpy as np
import pandas as pd
import pytest

from biasaudit.params.vlm import PlantedReflect, Reflect, ReflectAnalysis
from biasaudit.stats.regression import fe_ols_cluster
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import two_afc
from biasaudit.vlm.analysis.gaps import matched_cells
from biasaudit.vlm.analysis.inputs import measure_frames, retained
from biasaudit.vlm.groups import GROUP_CODES

from .fixtures_vlm import config

OCC = ("cook", "doctor", "lawyer", "nurse", "teacher", "ceo")
STRONG = {"two_afc": 0.3, "low_answer": 0.3}
TOL = 4.5  # standard errors; ~150 quantities per seed, so a false alarm is rare, a bias of the estimand is not


def units(G):
    return pd.DataFrame({"unit": [f"u{i:04d}" for i in range(G)], "occupation": [OCC[i % 6] for i in range(G)]})


def ratio(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Σ num / Σ den over photos (rows) and its linearised cluster standard error."""
    with np.errstate(invalid="ignore", divide="ignore"):  # the matrix diagonal: no comparisons
        r = num.sum(axis=0) / den.sum(axis=0)
    se = np.sqrt(((num - r * den) ** 2).sum(axis=0)) / den.sum(axis=0)
    return r, se


def close(estimate, se, planted, what):
    estimate, se, planted = (np.atleast_1d(np.asarray(x, float)) for x in (estimate, se, planted))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(se > 0, np.abs(estimate - planted) / se, np.where(estimate == planted, 0, np.inf))
    assert (z < TOL).all(), (what, float(z.max()), estimate[z >= TOL], planted[z >= TOL])


@pytest.fixture(scope="module", params=[1, 2])
def population(request):
    """2,000 source photos' 2AFC answers: the default refusals and edit losses, plus a strong selective refusal."""
    pl = PlantedReflect(selective_refusal=STRONG)
    u = units(2000)
    df = P.simulate_responses(pl, u, np.random.default_rng(request.param), Reflect(tasks=["2afc_income"]))
    return pl, u, df


@pytest.fixture(scope="module", params=[3, 4])
def single_population(request):
    """8,000 source photos' MCQ salary and salary answers (ten rows per photo and measure: cheap), the
    strongest selective refusal of low answers the schema allows."""
    pl = PlantedReflect(selective_refusal=STRONG | {"low_answer": 0.45})
    u = units(8000)
    df = P.simulate_responses(pl, u, np.random.default_rng(request.param), Reflect(tasks=["mcq_salary", "salary_salary"]))
    return pl, u, df


def test_two_afc_complete_case_estimands_match_a_large_population(population):
    pl, u, df = population
    cc = P.complete_case_estimands(pl, u, ReflectAnalysis(), two_afc_tasks=("income",), measures=())["two_afc"]["income"]
    would = P.estimands(P.would_answer(pl), u, ReflectAnalysis(), two_afc_tasks=("income",), measures=())
    two = retained(df, "2afc", "income")
    G = len(GROUP_CODES)
    moved = 0.0
    for estimator, table, race in (("pooled", "winrate", "race_winrate"),
                                   ("symmetric", "winrate_symmetric", "race_winrate_symmetric")):
        W, N = two_afc.unit_counts(two, estimator)
        rate, se = ratio(W.reshape(len(W), G * G), N.reshape(len(N), G * G))
        planted = cc[table].set_index(["row", "col"])["planted"]
        cells = [(i, j) for i in range(G) for j in range(G) if i != j]
        close([rate[i * G + j] for i, j in cells], [se[i * G + j] for i, j in cells],
              [planted[GROUP_CODES[i], GROUP_CODES[j]] for i, j in cells], table)
        est = two_afc.race_win_rates_within_gender(two, estimator=estimator)
        # per-photo race sums for the SE, as race_win_rates_within_gender sums them
        gender = np.array([g[-1] for g in GROUP_CODES])
        rivals = (gender[:, None] == gender[None, :]) & ~np.eye(G, dtype=bool)
        order = [GROUP_CODES.index(f"{r}{g}") for g in ("M", "F") for r in ("A", "B", "L", "ME", "W")]
        r_rate, r_se = ratio((W * rivals).sum(axis=2)[:, order], (N * rivals).sum(axis=2)[:, order])
        assert np.allclose(r_rate, est["rate"])
        truth = est[["gender", "race"]].merge(cc[race], on=["gender", "race"])["planted"]
        close(r_rate, r_se, truth, race)
        bm = truth[(est["gender"] == "man") & (est["race"] == "Black")].iloc[0]
        moved = max(moved, abs(bm - would["two_afc"]["income"][race].set_index(["gender", "race"]).loc[
            ("man", "Black"), "planted"]) / r_se[est.index[(est["gender"] == "man") & (est["race"] == "Black")][0]])
    assert moved > 10  # the selective refusal moves the estimand far beyond the test's tolerance
    first = (two["choice"] == "A").to_numpy(float)
    unit = pd.factorize(two["unit"])[0]
    same = two["group_a"].str[-1].to_numpy() == two["group_b"].str[-1].to_numpy()
    for kind, mask in (("all", np.ones(len(two), bool)), ("same_gender", same), ("cross_gender", ~same)):
        share, se = ratio(np.bincount(unit, first * mask)[:, None], np.bincount(unit, mask.astype(float))[:, None])
        close(share, se, cc["share_first_by_type"][kind], f"share_first {kind}")
    assert cc["share_first"] == cc["share_first_by_type"]["all"]


def test_single_image_complete_case_estimands_match_a_large_population(single_population):
    pl, u, df = single_population
    analysis = ReflectAnalysis()
    cc = P.complete_case_estimands(pl, u, analysis, two_afc_tasks=(), measures=("mcq_salary", "salary_salary"))
    would = P.estimands(P.would_answer(pl), u, analysis, two_afc_tasks=(), measures=("mcq_salary", "salary_salary"))
    frames, se_black = measure_frames(df, config()), {}
    for measure in ("mcq_salary", "salary_salary"):
        sub, truth = frames[measure], cc["single"][measure]
        dg = truth["delta_g"].set_index(["dimension", "level"])["planted"]
        for (dimension, level), planted in dg.items():
            ref = analysis.race_reference if dimension == "race" else analysis.gender_reference
            cells = matched_cells(sub, dimension, level, ref)
            per = cells.assign(d=cells["level_mean"] - cells["ref_mean"]).groupby("unit")[["d", "ref_mean"]].sum()
            r, se = ratio(per[["d"]].to_numpy(), per[["ref_mean"]].to_numpy())
            close(100 * r, 100 * se, planted, f"{measure} Δg {dimension}:{level}")
            se_black[measure] = se[0] if (dimension, level) == ("race", "Black") else se_black.get(measure)
        race = pd.get_dummies(sub["race"]).drop(columns=analysis.race_reference)
        X = np.column_stack([race.to_numpy(float), (sub["gender"] == "man").to_numpy(float)])
        names = [f"race:{c}" for c in race.columns] + ["gender:man"]
        fit, _ = fe_ols_cluster(sub["y"].to_numpy(float), X, pd.factorize(sub["unit"])[0], names, n_wild=0)
        ols = fit.merge(truth["ols"], on="term")
        assert len(ols) == 5
        close(ols["coef"], ols["se"], ols["planted"], f"{measure} OLS")
        # the selective refusal of low answers raises the Black cells' complete-case Δg beyond the tolerance
        black = ("race", "Black")
        moved = dg[black] - would["single"][measure]["delta_g"].set_index(["dimension", "level"]).loc[black, "planted"]
        assert moved > 4.5 * 100 * se_black[measure]
    single = df[(df["kind"] != "2afc") & df["status"].isin(["ok", "refused"])]
    refused = single.assign(r=single["status"] == "refused").groupby("group")["r"].agg(["sum", "size"])
    rate = refused.loc[list(GROUP_CODES), "sum"] / refused.loc[list(GROUP_CODES), "size"]
    planted = cc["refusal"].set_index("group")["planted"].loc[list(GROUP_CODES)]
    se = np.sqrt(planted * (1 - planted) / refused.loc[list(GROUP_CODES), "size"])  # photos share z: ≈ SE
    close(rate, 2 * se, planted, "refusal rate")


@pytest.mark.parametrize("both_orders", [True, False])
def test_without_selective_refusal_the_complete_case_estimands_are_the_answer_independent_ones(both_orders):
    pl = PlantedReflect(selective_refusal={"two_afc": 0.0, "low_answer": 0.0})  # refusals and losses by group kept
    u, analysis = units(12), ReflectAnalysis()
    old, new = P.estimands(pl, u, analysis, both_orders=both_orders), \
        P.complete_case_estimands(pl, u, analysis, both_orders=both_orders)
    for task, t in old["two_afc"].items():
        n = new["two_afc"][task]
        for key in ("winrate", "race_winrate", "bradley_terry") + (
                ("race_winrate_symmetric", "bradley_terry_symmetric") if both_orders else ()):
            assert np.allclose(t[key]["planted"], n[key]["planted"], rtol=0, atol=1e-12), (task, key)
        if both_orders:  # no answer-dependent refusal: the two orders are retained alike
            assert np.allclose(t["winrate"]["planted"], n["winrate_symmetric"]["planted"], rtol=0, atol=1e-12)
        assert n["share_first"] == pytest.approx(t["share_first"], abs=1e-12)
        assert n["share_first_by_type"] == pytest.approx(t["share_first_by_type"], abs=1e-12)
    for measure, t in old["single"].items():
        n = new["single"][measure]
        for key, cols in (("delta_g", ["planted", "planted_pooled"]), ("ols", ["planted"])):
            scale = np.abs(t[key][cols].to_numpy()).max()  # a salary coefficient of 0 is 0 up to 1e-10 USD
            assert np.allclose(t[key][cols], n[key][cols], rtol=0, atol=1e-12 * scale), (measure, key)
        assert np.allclose(t["means"], n["means"], rtol=1e-12)
    assert np.array_equal(old["refusal"]["planted"], new["refusal"]["planted"])
