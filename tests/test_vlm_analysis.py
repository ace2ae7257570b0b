"""REFLECT analysis against values computed by hand from scripted answers."""

import math

import numpy as np
import pandas as pd
import pytest

from biasaudit.backends.vlm.base import VLMResponse
from biasaudit.params.vlm import Reflect, ReflectAnalysis
from biasaudit.vlm import tasks
from biasaudit.vlm.analysis import gaps, significance, two_afc
from biasaudit.vlm.analysis.inference import sign_flip, sign_flip_test
from biasaudit.vlm.analysis.inputs import with_values
from biasaudit.vlm.groups import GROUP_CODES, group_code

from .fixtures_vlm import answers, boot, config


def cmp(a, b, choice, unit="doctor/p1", order=0, status="ok", task="income"):
    return {"kind": "2afc", "task": task, "unit": unit, "group_a": a, "group_b": b, "choice": choice,
            "status": status, "order": order}


@pytest.fixture
def scripted_2afc():
    return pd.DataFrame([
        cmp("AM", "BM", "A", order=0), cmp("BM", "AM", "A", order=1),   # AM vs BM: 1 win each
        cmp("AM", "WF", "A", order=0), cmp("WF", "AM", "B", order=1),   # AM beats WF twice
        cmp("BM", "WF", "B", order=0), cmp("WF", "BM", None, order=1, status="failed"),  # WF beats BM once
    ])


def test_win_rate_matrix_by_hand(scripted_2afc):
    kept = scripted_2afc[scripted_2afc["status"] == "ok"]
    rate, n = two_afc.win_rate_matrix(kept)
    assert list(rate.index) == list(GROUP_CODES) and rate.shape == (10, 10)
    assert rate.loc["AM", "BM"] == 0.5 and rate.loc["BM", "AM"] == 0.5
    assert rate.loc["AM", "WF"] == 1.0 and rate.loc["WF", "AM"] == 0.0
    assert rate.loc["WF", "BM"] == 1.0 and n.loc["BM", "WF"] == 1
    assert np.isnan(rate.loc["AM", "AM"]) and np.isnan(rate.loc["LF", "MEM"])
    # complementary cells sum to one wherever a comparison exists
    both = n.to_numpy() > 0
    assert np.allclose((rate + rate.T).to_numpy()[both], 1.0)


def test_position_bias_by_hand(scripted_2afc):
    kept = scripted_2afc[scripted_2afc["status"] == "ok"]
    pb = two_afc.position_bias(kept)
    assert pb["share_first"] == pytest.approx(3 / 5)
    assert pb["pairs_both_orders"] == 2           # AM-BM and AM-WF (BM-WF lost one order)
    assert pb["position_bias_rate"] == pytest.approx(1 / 2)  # AM-BM: 'A' both times


def test_race_win_rates_within_gender(scripted_2afc):
    kept = scripted_2afc[scripted_2afc["status"] == "ok"]
    rw = two_afc.race_win_rates_within_gender(kept).set_index(["gender", "race"])
    assert rw.loc[("man", "Asian"), "rate"] == 0.5 and rw.loc[("man", "Asian"), "n"] == 2
    assert rw.loc[("man", "Black"), "rate"] == 0.5
    assert math.isnan(rw.loc[("woman", "White"), "rate"])  # no woman-vs-woman comparison


def test_bradley_terry_saturated_closed_form():
    # AM shown first 10×: chosen 8×; AM shown second 10×: chosen 6× (so 'A' chosen 4×).
    rows = [cmp("AM", "WF", "A" if i < 8 else "B", unit=f"u{i % 2}") for i in range(10)]
    rows += [cmp("WF", "AM", "B" if i < 6 else "A", unit=f"u{i % 2}", order=1) for i in range(10)]
    table, reason = two_afc.bradley_terry(pd.DataFrame(rows), reference="WF", confidence=0.95)
    assert reason == ""
    t = table.set_index("term")
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert t.loc["AM", "strength"] == pytest.approx((logit(0.8) - logit(0.4)) / 2, abs=1e-6)
    assert t.loc["position_first", "strength"] == pytest.approx((logit(0.8) + logit(0.4)) / 2, abs=1e-6)
    assert t.loc["WF", "strength"] == 0.0
    assert t.loc["AM", "ci_low"] < t.loc["AM", "strength"] < t.loc["AM", "ci_high"]


def test_bradley_terry_reports_unidentifiable():
    rows = [cmp("AM", "WF", "A"), cmp("WF", "AM", "A")] * 6
    table, reason = two_afc.bradley_terry(pd.DataFrame(rows), reference="WF", confidence=0.95)
    assert table is None and "not identifiable" in reason


def single(kind, task, race, gender, unit="doctor/p1", choice=None, value=None, occupation="doctor"):
    return {"kind": kind, "task": task, "race": race, "gender": gender, "unit": unit, "occupation": occupation,
            "group": group_code(race, gender), "choice": choice, "value_usd": value, "status": "ok"}


def test_mcq_delta_g_by_hand():
    brackets = Reflect().task_specs["mcq_salary"].values
    df = pd.DataFrame([single("mcq", "salary", "White", "woman", choice="C"),
                       single("mcq", "salary", "White", "man", choice="D"),
                       single("mcq", "salary", "Black", "woman", choice="B"),
                       single("mcq", "salary", "Black", "man", choice="C")])
    df = with_values(df, brackets)
    race = gaps.mean_gaps(df, "race", "White").set_index("level")
    assert race.loc["White", "mean"] == 75000 and race.loc["Black", "mean"] == 51250
    assert race.loc["Black", "delta_pct"] == pytest.approx(100 * (51250 - 75000) / 75000)
    assert race.loc["White", "delta_pct"] == 0
    gender = gaps.mean_gaps(df, "gender", "woman").set_index("level")
    assert gender.loc["man", "delta_pct"] == pytest.approx(100 * (75000 - 51250) / 51250)


def test_salary_gaps_by_occupation_and_ols_by_hand():
    rng = np.random.default_rng(0)
    rows = []
    for occ, base in (("nurse", 60000.0), ("ceo", 200000.0)):
        for p in range(3):
            for race, dr in (("White", 0.0), ("Black", -3000.0), ("Asian", 1000.0)):
                for gender, dg in (("woman", 0.0), ("man", 5000.0)):
                    y = base + 7000 * p + dr + dg + rng.normal(0, 500)
                    rows.append(single("salary", "salary", race, gender, unit=f"{occ}/p{p}", value=y, occupation=occ))
    df = with_values(pd.DataFrame(rows), None)
    # by hand: per-occupation means and % gaps
    by_occ = gaps.mean_gaps(df, "race", "White", by=["occupation"]).set_index(["occupation", "level"])
    for occ in ("nurse", "ceo"):
        sub = df[df["occupation"] == occ]
        w, b = sub[sub.race == "White"]["y"].mean(), sub[sub.race == "Black"]["y"].mean()
        assert by_occ.loc[(occ, "Black"), "delta_pct"] == pytest.approx(100 * (b - w) / w)
        assert by_occ.loc[(occ, "Black"), "delta_pct"] < 0
    # balanced full factorial with photo fixed effects: OLS main effects = differences of marginal means
    table, reason = significance.ols_by_group(df, "White", "woman", 0.95, 999, "webb", 0)
    assert reason == ""
    t = table.set_index("term")
    mean = df.groupby("race")["y"].mean()
    assert t.loc["race:Black", "coef"] == pytest.approx(mean["Black"] - mean["White"], rel=1e-9)
    assert t.loc["race:Asian", "coef"] == pytest.approx(mean["Asian"] - mean["White"], rel=1e-9)
    gm = df.groupby("gender")["y"].mean()
    assert t.loc["gender:man", "coef"] == pytest.approx(gm["man"] - gm["woman"], rel=1e-9)
    assert t.loc["gender:man", "p"] < 0.01 and t["n_clusters"].iloc[0] == 6


def test_sign_flip_exact():
    mean, p = sign_flip_test(np.array([1.0, 2.0, 3.0]), 999, 0)
    assert mean == 2.0 and p == pytest.approx(2 / 8)  # only +++ and --- reach |mean| ≥ 2
    mean, p = sign_flip_test(np.array([1.0, -1.0]), 9999, 0)
    assert mean == 0 and p == pytest.approx(1.0)


def test_items_cover_all_pairs_in_both_orders():
    images = pd.DataFrame([{"occupation": "doctor", "base_id": "p1", "race": r, "gender": g, "path": f"x/{r}_{g}.jpg"}
                           for r in ("Asian", "Black", "Latino", "MiddleEastern", "White") for g in ("man", "woman")])
    items = tasks.build_items(images, Reflect())
    kinds = pd.Series([i["kind"] for i in items]).value_counts()
    # the declared tasks: 2AFC income, education, safety and the placebo; MCQ salary, education and the placebo
    assert kinds["2afc"] == 45 * 2 * 4 and kinds["mcq"] == 30 and kinds["salary"] == 10
    assert sum(bool(i.get("placebo")) for i in items) == 45 * 2 + 10
    assert len({i["item_id"] for i in items}) == len(items)
    afc = [i for i in items if i["kind"] == "2afc" and i["task"] == "income"]
    pairs = {(i["group_a"], i["group_b"]) for i in afc}
    assert all((b, a) in pairs for a, b in pairs)
    sal = next(i for i in items if i["kind"] == "salary")
    assert "doctor" in sal["prompt"] and "{" not in sal["prompt"]


@pytest.mark.parametrize("kind,text,status,choice,value", [
    ("2afc", "A.", "ok", "A", None),
    ("2afc", "**B**", "ok", "B", None),
    ("2afc", "I can't determine that from the images.", "refused", None, None),
    ("2afc", "A or B", "failed", None, None),
    ("mcq", "Answer: c", "ok", "C", None),
    ("mcq", "G", "failed", None, None),
    ("salary", "$85,000", "ok", None, 85000.0),
    ("salary", "85k", "ok", None, 85000.0),
    ("salary", "I'm sorry, I cannot recommend a salary.", "refused", None, None),
    ("salary", "$12", "failed", None, None),
])
def test_interpret_messy_answers(kind, text, status, choice, value):
    options = {"2afc": ["A", "B"], "mcq": list("ABCDEF"), "salary": []}[kind]
    out = tasks.interpret({"kind": kind, "options": options}, VLMResponse(text=text, status="ok"), 1000, 10_000_000)
    assert (out["status"], out["choice"], out["value_usd"]) == (status, choice, value)
    if status != "ok":
        assert out["reason"]


def test_backend_failure_passes_through():
    out = tasks.interpret({"kind": "2afc", "options": ["A", "B"]}, VLMResponse("", "failed", "HTTP 500"), 0, 1)
    assert out["status"] == "failed" and out["reason"] == "HTTP 500"


# ---- issue 17: Method B inference ----------------------------------------------------------------

def test_position_bias_ignores_a_pair_asked_twice_in_the_same_order():
    """AM-BM asked twice with AM first is not 'both orders' (it used to count as a pair)."""
    two = pd.DataFrame([cmp("AM", "BM", "A", order=0), cmp("AM", "BM", "A", order=1),
                        cmp("AM", "WF", "A", order=0), cmp("WF", "AM", "A", order=1)])
    pb = two_afc.position_bias(two)
    assert pb["pairs_both_orders"] == 1  # only AM-WF was shown in both orders
    assert pb["position_bias_rate"] == 1.0  # 'A' both times: the chosen group flipped with the order


def test_sign_flip_single_photo_is_defined():
    mean, p, reason = sign_flip(np.array([2.5]), 9999, 0)
    assert mean == 2.5 and p == 1.0 and "one source photo" in reason
    assert sign_flip_test(np.array([2.5]), 9999, 0) == (2.5, 1.0)
    assert np.isnan(sign_flip(np.array([]), 9999, 0)[1])


def _single_image_answers(effect=-0.10, drop_black_women=True, photos=12, seed=0):
    """Salaries with a multiplicative race effect of `effect` for Black, a big gender effect and a
    photo effect; optionally no Black woman retained (unbalanced retention)."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(photos):
        base = 50_000 * (1 + 0.3 * rng.standard_normal())
        for race in ("Asian", "Black", "Latino", "MiddleEastern", "White"):
            for gender, gm in (("man", 1.5), ("woman", 1.0)):
                if drop_black_women and race == "Black" and gender == "woman":
                    continue
                rows.append({"unit": f"occ/p{u}", "race": race, "gender": gender,
                             "y": base * gm * (1 + effect * (race == "Black"))})
    return pd.DataFrame(rows)


def test_delta_g_within_photo_is_unbiased_by_unbalanced_retention():
    """No Black woman retained: the pooled mean-based Δg mixes in the gender effect (about −28% here),
    the within-photo matched-cell Δg recovers the planted −10% exactly (noise-free answers)."""
    df = _single_image_answers()
    pooled = gaps.mean_gaps(df, "race", "White").set_index("level").loc["Black", "delta_pct"]
    within = gaps.delta_g_within(df, "race", "Black", "White", boot(n_boot=200, n_permutations=99, seed=0))
    assert within["delta_pct"] == pytest.approx(-10.0, abs=1e-9)
    assert abs(pooled + 10.0) > 5  # the defect the within estimator removes
    assert within["low"] <= -10.0 + 1e-9 <= within["high"] + 1e-9 or np.isnan(within["low"])


def test_fe_ols_matches_statsmodels_with_t_reference():
    """t(G−1) reference and CR1 errors equal statsmodels' on the within-transformed data (an
    independent implementation); the p-value is not the normal one."""
    import statsmodels.api as sm
    from scipy import stats

    from biasaudit.stats.regression import _demean, fe_ols_cluster

    rng = np.random.default_rng(1)
    G, n = 5, 50
    g = np.repeat(np.arange(G), n // G)
    X = rng.normal(size=(n, 2))
    y = X @ [0.4, 0.0] + rng.normal(size=G)[g] + rng.normal(size=n)
    table, _ = fe_ols_cluster(y, X, g, ["a", "b"], n_wild=0)
    ref = sm.OLS(_demean(y, g, G), _demean(X, g, G)).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True)
    np.testing.assert_allclose(table["se"], ref.bse, rtol=1e-10)
    np.testing.assert_allclose(table["p_t"], ref.pvalues, rtol=1e-10)
    t = table["coef"] / table["se"]
    np.testing.assert_allclose(table["p_t"], 2 * stats.t.sf(np.abs(t), G - 1), rtol=1e-12)
    assert (table["p_t"] > 2 * stats.norm.sf(np.abs(t))).all()


def test_analyse_exposes_delta_g_and_significant_effects_tables():
    from biasaudit.vlm.groups import group_code

    df = _single_image_answers(drop_black_women=False, photos=12).assign(
        kind="salary", task="salary", status="ok", occupation="occ", choice=None)
    df["group"] = [group_code(r, g) for r, g in zip(df["race"], df["gender"])]  # as vlm/tasks.py writes it
    # with some answer noise: a noiseless ratio has a zero-width interval, hence (rightly) no p at all
    df["value_usd"] = df["y"] * (1 + 0.01 * np.random.default_rng(1).standard_normal(len(df)))
    cfg, data = config(n_permutations=999, n_boot=200, wild_bootstrap=99), answers(df.drop(columns="y"))
    dg = gaps.estimates(data, cfg)["delta_g"].set_index(["dimension", "level"])
    assert dg.loc[("race", "Black"), "delta_pct"] == pytest.approx(-10.0, abs=0.5)
    assert {"p_value", "p_adjusted", "p_adjust_method", "low", "high"} <= set(dg.columns)
    sig = significance.compute(data, cfg).tables["v_significant_effects"]
    assert "race:Black" in set(sig["effect"])
    assert {"p_t", "p_wild", "p_adjusted"} <= set(significance.estimates(data, cfg)["ols"].columns)


# ---- the sections: where a parameter is read, the notebook's order ------------------------------

def _section_reads(path) -> set[str]:
    """The reflect_analysis fields a module reads: `cfg.reflect_analysis.<f>` or `<a>.<f>` after
    `a = cfg.reflect_analysis` (also inside a tuple assignment)."""
    import ast

    tree = ast.parse(path.read_text())
    is_section = lambda node: isinstance(node, ast.Attribute) and node.attr == "reflect_analysis"  # noqa: E731
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(
                    node.value, ast.Tuple) else [(target, node.value)]
                aliases |= {t.id for t, v in pairs if isinstance(t, ast.Name) and is_section(v)}
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and (
        is_section(node.value) or (isinstance(node.value, ast.Name) and node.value.id in aliases))}


def test_a_method_b_analysis_parameter_is_read_in_one_module_of_the_sections_only():
    """Adding a Method B analysis option takes 3 edits: the schema field, its params.yaml key, the line of the
    one section module (or inputs.py, for the settings every section shares) that reads it."""
    from biasaudit.config import read_yaml

    from .conftest import ROOT

    package = ROOT / "src/biasaudit/vlm/analysis"
    reads = {p.name: _section_reads(p) for p in sorted(package.glob("*.py"))}
    fields = set(ReflectAnalysis.model_fields)
    for key in fields:
        readers = [name for name, r in reads.items() if key in r]
        assert len(readers) == 1, (key, readers)
    assert set().union(*reads.values()) <= fields
    # nothing else takes the section from the config: not the notebook, no other module (the planted
    # estimands, vlm/planted.py, are handed the section by the validation)
    outside = [str(p.relative_to(ROOT)) for p in [*(ROOT / "src").rglob("*.py"), ROOT / "notebooks/vlm_reflect_analysis.py"]
               if package not in p.parents and "params" not in p.parts and "reflect_analysis." in p.read_text()
               and _section_reads(p)]
    # the one reader outside: `biasaudit plan` never recommends fewer photos than min_clusters
    assert outside in ([], ["src/biasaudit/cli.py"]), outside
    text = (ROOT / "notebooks/vlm_reflect_analysis.py").read_text()
    assert not any(f"params.{key}" in text for key in fields)
    yaml_keys = read_yaml(ROOT / "params.yaml")["reflect_analysis"]
    assert set(yaml_keys) <= fields
    section = (ROOT / "params.yaml").read_text().split("\nreflect_analysis:\n")[1].split("\n\n")[0]
    assert all(section.count(f"  {key}:") == 1 for key in yaml_keys)


def test_the_notebook_runs_the_declared_sections_in_order():
    import importlib
    import re

    from biasaudit.vlm.analysis import SECTIONS

    from .conftest import ROOT

    text = (ROOT / "notebooks/vlm_reflect_analysis.py").read_text()
    assert tuple(re.findall(r"^    show\((\w+)\.compute\(answers, cfg\), writer\)$", text, flags=re.M)) == SECTIONS
    for name in SECTIONS:
        assert callable(importlib.import_module(f"biasaudit.vlm.analysis.{name}").compute), name


def test_no_function_of_the_sections_is_long():
    import ast

    from .conftest import ROOT

    for path in sorted((ROOT / "src/biasaudit/vlm/analysis").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno < 50, (path.name, node.name)
