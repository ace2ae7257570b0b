"""Method B known truth: the planted VLM, its exact estimands, and degenerate data.

Oracles: a brute-force population drawn in this file straight from the declared model (plain numpy, not
the package's draw functions), closed forms where photo effects are off, and hand-built constant answers."""

import numpy as np
import pandas as pd
import pytest
from scipy.special import expit

from biasaudit import known_truth as K
from biasaudit.params.vlm import PlantedReflect, Reflect, ReflectAnalysis
from biasaudit.stats.regression import fe_ols_cluster
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import gaps, significance, two_afc, validation
from biasaudit.vlm.analysis.inputs import degenerate, retained
from biasaudit.vlm.groups import GROUP_CODES, GROUPS

from .fixtures_vlm import answers, boot, config

OCC = ("cook", "doctor", "lawyer", "nurse", "teacher", "ceo")


def units(G):
    return pd.DataFrame({"unit": [f"u{i:02d}" for i in range(G)], "occupation": [OCC[i % 6] for i in range(G)]})


def quiet(**update):
    """Declared effects with neither refusals nor lost edits (plus any override)."""
    return PlantedReflect(refusal={}, edit_loss={}).model_copy(update=update)


def test_win_rates_and_position_share_match_a_brute_force_population():
    pl, params = PlantedReflect(), ReflectAnalysis()
    truth = P.estimands(pl, units(6), params, two_afc_tasks=("income",))["two_afc"]["income"]
    rng = np.random.default_rng(7)
    beta, alpha, sd = pl.two_afc.strengths["income"], pl.two_afc.position, pl.two_afc.photo_sd
    n = 400_000  # photos, one comparison of each ordered pair per photo
    for a, b in (("WM", "BF"), ("AF", "MEM"), ("LM", "WF")):
        za, zb = rng.standard_normal(n), rng.standard_normal(n)
        first_a = rng.random(n) < expit(alpha + beta.get(a, 0) - beta.get(b, 0) + sd * (za - zb))   # a shown first
        first_b = rng.random(n) < expit(alpha + beta.get(b, 0) - beta.get(a, 0) + sd * (zb - za))   # b shown first
        brute = (first_a.sum() + (~first_b).sum()) / (2 * n)  # no refusal depends on order, so pooled = mean
        planted = truth["winrate"].set_index(["row", "col"]).loc[(a, b), "planted"]
        assert abs(brute - planted) < 4 * np.sqrt(0.25 / (2 * n)), (a, b, brute, planted)


def test_without_photo_effects_bradley_terry_is_the_declared_strength():
    pl = quiet(two_afc=PlantedReflect().two_afc.model_copy(update={"photo_sd": 0.0}))
    bt = P.estimands(pl, units(6), ReflectAnalysis(), two_afc_tasks=("safety",))["two_afc"]["safety"]["bradley_terry"]
    assert np.allclose(bt["planted"], bt["declared"], atol=1e-9)
    # with photo effects the marginal strengths are attenuated toward 0, never amplified
    att = P.estimands(quiet(), units(6), ReflectAnalysis(), two_afc_tasks=("safety",))["two_afc"]["safety"]["bradley_terry"]
    assert (att["planted"].abs() <= att["declared"].abs() + 1e-12).all() and (att["planted"] != att["declared"]).any()


def test_salary_delta_g_and_ols_closed_forms_with_full_retention():
    pl, params = quiet(), ReflectAnalysis()
    u = units(12)
    single = P.estimands(pl, u, params, two_afc_tasks=())["single"]["salary_salary"]
    eff = {g: pl.salary.effect.get(g, 0.0) for g in GROUP_CODES}
    # Δg race Black vs White within photo: Σ_gender e^{γ_B,g} − e^{γ_W,g} over Σ_gender e^{γ_W,g} (photo level cancels)
    num = sum(np.exp(eff[f"B{g}"]) - np.exp(eff[f"W{g}"]) for g in "MF")
    den = sum(np.exp(eff[f"W{g}"]) for g in "MF")
    dg = single["delta_g"].set_index(["dimension", "level"])["planted"]
    assert dg[("race", "Black")] == pytest.approx(100 * num / den, rel=1e-12)
    # OLS with every image retained (a balanced design): the coefficient is the mean over genders of the
    # difference of expected salaries; E salary = mean base · e^{γ + a} · e^{(σ_p² + σ_e²)/2}, a the edit
    # artefact every group edit carries
    s = pl.salary
    scale = np.mean([s.base_usd.get(o, s.base_usd["default"]) for o in u["occupation"]]) * np.exp(
        (s.photo_sd ** 2 + s.noise_sd ** 2) / 2 + pl.edit_artifact.salary)
    ols = single["ols"].set_index("term")["planted"]
    expected = scale * np.mean([np.exp(eff[f"B{g}"]) - np.exp(eff[f"W{g}"]) for g in "MF"])
    assert ols["race:Black"] == pytest.approx(expected, rel=1e-9)
    assert ols["gender:man"] == pytest.approx(scale * np.mean([np.exp(eff[f"{r}M"]) - np.exp(eff[f"{r}F"])
                                                               for r in ("A", "B", "L", "ME", "W")]), rel=1e-9)


def test_mcq_group_means_match_a_brute_force_population():
    pl, brackets = PlantedReflect(), Reflect().task_specs["mcq_salary"].values
    m = P.value_means(pl, "mcq_salary", brackets, np.array(["cook"]))
    rng = np.random.default_rng(3)
    base = np.array(pl.mcq.base["salary"])
    cuts = np.log(np.cumsum(base)[:-1] / (1 - np.cumsum(base)[:-1]))
    values = np.array([brackets[k] for k in "ABCDEF"])
    n = 400_000
    for g in ("WM", "BF"):
        eta = pl.mcq.shift["salary"].get(g, 0.0) + pl.edit_artifact.mcq + pl.mcq.photo_sd * rng.standard_normal(n)
        cdf = expit(cuts[None, :] - eta[:, None])  # P(letter ≤ k)
        letter = (rng.random(n)[:, None] >= cdf).sum(axis=1)
        sample = values[letter]
        assert abs(sample.mean() - m[GROUP_CODES.index(g)]) < 4 * sample.std() / np.sqrt(n), g


def test_recovery_covers_the_planted_values_at_12_photos():
    # the default planted VLM, selective refusal included: every complete-case row is checked against its
    # complete-case estimand (tests/test_vlm_complete_case.py), the would-have-answered value beside it
    pl = PlantedReflect()
    cfg = config(n_boot=400, n_permutations=99, wild_bootstrap=99)
    df = P.simulate_responses(pl, units(12), np.random.default_rng(11))
    out = validation.compute(answers(df, "planted", planted=pl), cfg)
    table = out.tables["planted_validation"]
    checks = table[table["check"]]
    assert set(checks["quantity"]) >= {"win_rate", "race_win_rate", "share_first", "bt_strength", "delta_g",
                                       "ols_coef", "refusal_rate"}
    informative = checks[checks["informative"]]
    assert informative["width"].notna().all() and (informative["width"] < informative["plausible_range"]).all()
    assert out.metrics["covered"] / out.metrics["informative"] >= 0.85
    assert out.metrics["uninformative"] == len(checks) - len(informative)
    assert table.loc[table["quantity"] != "delta_g_pooled", "check"].all()
    moved = table["note"].str.contains("selective refusal")
    assert moved.any() and ((table["planted"] - table["would_have_answered"]).abs()[moved] > 1e-9).all()


def test_an_interval_as_wide_as_the_range_is_uninformative_not_covered():
    r = K.row("dark_share", 0.3, 0.5, 0.0, 1.0, 1.0)
    assert r["covered"] and not r["informative"] and r["width"] == 1.0
    assert K.summary(pd.DataFrame([r]), 0.95)["covered"] == 0


def constant_answers(G=8):
    rows = []
    for u in range(G):
        unit = f"doctor/p{u}"
        for i, a in enumerate(GROUP_CODES):
            for j, b in enumerate(GROUP_CODES):
                if i != j:
                    rows.append({"kind": "2afc", "task": "income", "unit": unit, "occupation": "doctor",
                                 "group_a": a, "group_b": b, "order": int(i > j), "choice": "A", "status": "ok"})
        for race, gender in GROUPS:
            single = {"unit": unit, "occupation": "doctor", "race": race, "gender": gender,
                      "group": GROUP_CODES[GROUPS.index((race, gender))], "status": "ok"}
            rows.append(single | {"kind": "mcq", "task": "salary", "choice": "C"})
            rows.append(single | {"kind": "salary", "task": "salary", "value_usd": 50000.0})
    return pd.DataFrame(rows)


def test_constant_answers_with_8_photos_give_nan_with_a_reason_never_significance():
    cfg = config(n_boot=200, n_permutations=99, wild_bootstrap=99, min_clusters=2)
    data = answers(constant_answers(8))
    t = significance.estimates(data, cfg) | gaps.estimates(data, cfg)
    assert t["ols"]["p"].isna().all() and t["ols"]["p_wild"].isna().all() and t["ols"]["p_t"].isna().all()
    assert t["ols"]["reason"].str.startswith("degenerate").all() and (t["ols"]["se"] == 0).all()
    assert t["sign_flip"]["p"].isna().all() and t["sign_flip"]["reason"].str.contains("degenerate").all()
    assert t["delta_g"]["p_value"].isna().all() and t["delta_g"]["low"].isna().all()
    assert significance.compute(data, cfg).tables["v_significant_effects"].empty
    why = degenerate(data, cfg)
    assert "degenerate" in why["2afc_income"] and "every retained answer is 'A'" in why["2afc_income"]
    assert set(why) >= {"mcq_salary", "salary_salary"}
    assert (two_afc.estimates(data, cfg)["income"]["race_winrate"]["degenerate"].str.len() > 0).all()


def test_wild_bootstrap_p_is_never_zero():
    rng = np.random.default_rng(0)
    G, B = 10, 199
    codes = np.repeat(np.arange(G), 10)
    x = np.tile(np.r_[np.zeros(5), np.ones(5)], G)
    y = 5.0 * x + 0.1 * rng.standard_normal(len(x))  # an effect no resample reaches
    table, _ = fe_ols_cluster(y, x[:, None], codes, ["x"], n_wild=B, seed=1)
    assert table["p_wild"].iloc[0] == pytest.approx(1 / (1 + B))


def test_too_few_photos_are_labelled_underpowered():
    pl = PlantedReflect()
    df = P.simulate_responses(pl, units(6), np.random.default_rng(2), Reflect(tasks=["salary_salary"]))
    ols = significance.estimates(answers(df), config(n_boot=200, n_permutations=99, wild_bootstrap=99,
                                                     min_clusters=12))["ols"]
    assert ols["p"].isna().all() and ols["reason"].str.startswith("underpowered").all()
    # the interval goes too (issue #38: it under-covers at 6 photos), with the same reason
    assert ols[["ci_low", "ci_high"]].isna().all().all() and ols["reason"].str.contains("would under-cover").all()
    flips = significance.estimates(answers(P.simulate_responses(pl, units(4), np.random.default_rng(2), Reflect(tasks=["salary_salary"]))),
                                   config(n_boot=200, n_permutations=99, wild_bootstrap=0))["sign_flip"]
    assert flips["p"].isna().all() and flips["reason"].str.contains("cannot reach").all()  # 2^(1−4) > 0.05


def test_within_photo_delta_g_weights_cells_by_retention_like_the_estimator():
    """Unequal retention (half the Black women's edits lost): the estimand weights each gender's cell by the
    chance that both of its answers are retained; checked against the estimator on a brute-force population."""
    pl = PlantedReflect(refusal={}, edit_loss={"BF": 0.5}).model_copy(update={"salary": PlantedReflect().salary.model_copy(
        update={"effect": {"BF": -0.3, "BM": 0.0, "WM": 0.1}, "photo_sd": 0.1, "noise_sd": 0.02})})
    planted = P.estimands(pl, units(6), ReflectAnalysis(), two_afc_tasks=())["single"]["salary_salary"]["delta_g"]
    planted = planted.set_index(["dimension", "level"]).loc[("race", "Black"), "planted"]
    rng = np.random.default_rng(5)
    n = 40_000
    photo = 0.1 * rng.standard_normal(n)  # one effect per source photo, shared by its ten images
    rows = []
    for race, code in (("Black", "B"), ("White", "W")):
        for gender, g in (("man", "M"), ("woman", "F")):
            keep = rng.random(n) >= pl.edit_loss.get(code + g, 0.0)
            usd = 60000 * np.exp(pl.salary.effect.get(code + g, 0.0) + photo + 0.02 * rng.standard_normal(n))
            rows.append(pd.DataFrame({"unit": np.arange(n), "race": race, "gender": gender, "y": usd})[keep])
    est = gaps.delta_g_within(pd.concat(rows), "race", "Black", "White",
                              boot(n_boot=100, n_permutations=99, seed=0))["delta_pct"]
    unweighted = 100 * (np.exp(-0.3) - 1 + np.exp(0.0) - np.exp(0.1)) / (1 + np.exp(0.1))
    assert abs(est - planted) < 0.2 and abs(planted - unweighted) > 2  # the weights matter here, and are right


def focus_set(root, n_units=3):
    """A FOCUS folder with its manifest (flat-colour images; the planted VLM never looks at pixels)."""
    from PIL import Image

    from biasaudit.vlm import focus

    rows = []
    for u in range(n_units):
        for k, (race, gender) in enumerate(GROUPS):
            path = focus.focus_path(root, "nurse", f"n{u}", race, gender, ".png")
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((16, 16, 3), 10 * k + u, np.uint8)).save(path)
            rows.append({"occupation": "nurse", "base_id": f"n{u}", "race": race, "gender": gender,
                         "group": GROUP_CODES[k], "path": str(path), "status": "ok", "edit_id": f"nurse/n{u}/{race}_{gender}"})
    table = pd.DataFrame(rows)
    table.to_parquet(root / "manifest.parquet")
    return table


def test_the_backend_answers_from_the_manifest_through_the_real_reflect_stage(tmp_path, monkeypatch):
    from biasaudit.config import read_yaml, validate
    from biasaudit.vlm.reflect import run_reflect

    from .conftest import ROOT

    monkeypatch.chdir(tmp_path)
    imgs = focus_set(tmp_path / "focus")
    raw = read_yaml(ROOT / "params.yaml")
    raw["vlms"] = {"pl": {"backend": "planted", "model_id": "planted-reflect",
                          "planted": {"edit_loss": {"BF": 0.5}, "refusal": {"WM": 0.5}, "seed": 3}}}
    raw["reflect"] = {**raw["reflect"], "tasks": ["2afc_income", "mcq_salary", "mcq_education", "salary_salary"],
                      "batch_size": 64}
    cfg = validate(raw)
    first = run_reflect("pl", cfg, imgs, progress=False)["responses"]
    again = run_reflect("pl", cfg, imgs, progress=False)["responses"]
    assert first[["item_id", "status", "choice", "value_usd"]].equals(again[["item_id", "status", "choice", "value_usd"]])
    assert first["stand_in"].all() and first["model_id"].str.startswith("SIMULATED").all()
    lost = first["reason"].fillna("").str.startswith("PLANTED retention loss")
    bf = (first["group"] == "BF") | (first["group_a"] == "BF") | (first["group_b"] == "BF")
    assert lost.any() and not (lost & ~bf).any()          # only Black women's edits were declared lossy
    per_image = first[lost & (first["group"] == "BF")]["unit"].nunique()
    assert per_image == first[bf & lost & (first["kind"] == "2afc")]["unit"].nunique()  # a lost edit loses every question
    refused = first[first["status"] == "refused"]
    assert len(refused) and refused["reason"].str.startswith("refusal").all()  # parsed as refusals by the real parser
    ok = first[first["status"] == "ok"]
    assert set(ok.loc[ok["kind"] == "2afc", "choice"]) <= {"A", "B"}
    assert ok.loc[ok["kind"] == "salary", "value_usd"].between(cfg.reflect.salary_min, cfg.reflect.salary_max).all()
    # the SIMULATED answers follow the declared position effect
    two = ok[ok["kind"] == "2afc"]
    assert 0.4 < (two["choice"] == "A").mean() < 0.8  # position effect 0.4 → about 0.6


def test_estimands_follow_the_design_when_only_one_order_is_asked():
    """With both_orders False the first image is always the earlier group code (as vlm.tasks asks), so
    win rates carry the position effect: the estimands must follow, checked on a large population."""
    pl, params = PlantedReflect(), ReflectAnalysis()
    u = units(3000)
    df = P.simulate_responses(pl, u, np.random.default_rng(4), Reflect(tasks=["2afc_income"], both_orders=False))
    two = retained(df, "2afc", "income")
    assert (two["order"] == 0).all() and (two["group_a"] < two["group_b"]).all()
    one = P.estimands(pl, u, params, two_afc_tasks=("income",), measures=(), both_orders=False)["two_afc"]["income"]
    both = P.estimands(pl, u, params, two_afc_tasks=("income",), measures=())["two_afc"]["income"]
    rate = two_afc.win_rate_table(two).set_index(["row", "col"])["rate"]
    planted = one["winrate"].set_index(["row", "col"])["planted"]
    assert (rate - planted).abs().max() < 0.035  # ≈ 4 SE of one cell at 3000 photos
    assert (both["winrate"].set_index(["row", "col"])["planted"] - planted).abs().max() > 0.05  # the design matters
    assert two_afc.position_bias(two)["share_first"] == pytest.approx(one["share_first"], abs=0.01)


def test_an_exact_fit_gives_no_p_even_where_rounding_leaves_a_tiny_se():
    """A deterministic VLM: every answer 'C', every Black image 'B'. The photo fixed-effects model fits
    exactly; rounding leaves SEs of ~1e-11 that must not become t statistics (they did: p ≈ 0.007 on
    coefficients of −3e-11), and the zero-width Δg interval must not come with a p either."""
    rows = [{"kind": "mcq", "task": "salary", "unit": f"doctor/p{u}", "occupation": "doctor", "race": r,
             "gender": g, "group": GROUP_CODES[k], "choice": "B" if r == "Black" else "C", "status": "ok"}
            for u in range(12) for k, (r, g) in enumerate(GROUPS)]
    cfg, data = config(n_boot=300, n_permutations=999, wild_bootstrap=199), answers(pd.DataFrame(rows))
    ols, dg = significance.estimates(data, cfg)["ols"], gaps.estimates(data, cfg)["delta_g"]
    assert ols["p"].isna().all() and ols["reason"].str.contains("fits every retained answer exactly").all()
    black = dg.set_index(["dimension", "level"]).loc[("race", "Black")]
    assert black["delta_pct"] < 0 and np.isnan(black["low"]) and np.isnan(black["p_value"])
    assert significance.compute(data, cfg).tables["v_significant_effects"].empty


def test_photos_that_identify_nothing_do_not_count_as_clusters():
    """8 of 12 photos keep a single salary answer: 4 photos identify the effects, so the OLS reports
    4 clusters (t with 3 df) and is labelled underpowered."""
    df = P.simulate_responses(PlantedReflect(), units(12), np.random.default_rng(0), Reflect(tasks=["salary_salary"]))
    keep = df["unit"].isin(units(12)["unit"][:4]) | (df["group"] == "WM")
    ols = significance.estimates(answers(df[keep]), config(n_boot=200, n_permutations=99, wild_bootstrap=99))["ols"]
    assert (ols["n_clusters"] == 4).all() and (ols["df"] == 3).all() and ols["p"].isna().all()
    assert ols["reason"].str.startswith("underpowered: 4 source photos").all()
