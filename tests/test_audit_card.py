"""The audit card against hand computations on small tables: LL144 selection rates and impact ratios from
2AFC wins, scoring rates above the median, representation ratios against the benchmark, parity and a
stated target, the four-fifths marking, and the pages and CSVs one card per model."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.report import audit_card as ac

BOOT = ac.Resampling(n_boot=400, level=0.95, method="percentile", seed=7)


def two_afc(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    """(unit, group_a, group_b, choice) → retained 2AFC rows in the responses' columns."""
    return pd.DataFrame([{"kind": "2afc", "task": "income", "status": "ok", "unit": u, "group_a": a, "group_b": b,
                          "choice": c, "race": None, "gender": None, "value_usd": np.nan} for u, a, b, c in rows])


# Two photos. Comparisons (winner first in the comment):
#   p1: WM vs BM → A (WM); WM vs BF → A (WM); BM vs WF → B (WF); WM vs WF → A (WM)
#   p2: BM vs WM → A (BM); BF vs WF → B (WF); WM vs BM → A (WM)
COMPARISONS = [("p1", "WM", "BM", "A"), ("p1", "WM", "BF", "A"), ("p1", "BM", "WF", "B"), ("p1", "WM", "WF", "A"),
               ("p2", "BM", "WM", "A"), ("p2", "BF", "WF", "B"), ("p2", "WM", "BM", "A")]


def test_race_selection_rates_and_impact_ratios_by_hand():
    # Race: the WM-vs-WF comparison is within White and is left out; 6 comparisons remain, each White vs
    # Black. White appears 6 times and wins: WM, WM, WF, WF, WM = 5; Black appears 6 times and wins 1 (p2 BM).
    # Rates 5/6 and 1/6; impact ratios 1 and (1/6)/(5/6) = 0.2.
    cats, wins, n = ac.two_afc_selections(two_afc(COMPARISONS), "race")
    t = ac.impact_table(cats, wins, n, BOOT).set_index("category")
    assert list(t.index) == ["Black", "White"]
    assert t.loc["White", "n"] == 6 and t.loc["White", "selected"] == 5
    assert t.loc["Black", "n"] == 6 and t.loc["Black", "selected"] == 1
    assert t.loc["White", "rate"] == pytest.approx(5 / 6)
    assert t.loc["Black", "rate"] == pytest.approx(1 / 6)
    assert t.loc["White", "ratio"] == pytest.approx(1.0)
    assert t.loc["Black", "ratio"] == pytest.approx(0.2)
    assert t.loc["Black", "below_four_fifths"] and not t.loc["White", "below_four_fifths"]
    # per photo: p1 Black 0 of 3, p2 Black 1 of 3 → the interval holds the estimate and stays in [0, 1]
    assert 0.0 <= t.loc["Black", "ratio_low"] <= 0.2 <= t.loc["Black", "ratio_high"] <= 1.0


def test_gender_and_intersection_by_hand():
    # Gender: comparisons whose genders differ: p1 WM-BF (M wins), BM-WF (F), WM-WF (M). Others are M-M or
    # F-F. man: n 3, wins 2; woman: n 3, wins 1 → rates 2/3, 1/3, impact ratio of woman 0.5.
    cats, wins, n = ac.two_afc_selections(two_afc(COMPARISONS), "gender")
    t = ac.impact_table(cats, wins, n, BOOT).set_index("category")
    assert (t.loc["man", "n"], t.loc["man", "selected"], t.loc["woman", "n"], t.loc["woman", "selected"]) == (3, 2, 3, 1)
    assert t.loc["woman", "ratio"] == pytest.approx(0.5)
    # Race × gender: every comparison counts (all pairs differ). WM: appears 5 (p1 ×3, p2 ×2), wins 4;
    # BM: appears 4, wins 1; WF: appears 3, wins 2; BF: appears 2, wins 0.
    cats, wins, n = ac.two_afc_selections(two_afc(COMPARISONS), "race × gender")
    t = ac.impact_table(cats, wins, n, BOOT).set_index("category")
    expect = {"White man": (5, 4), "Black man": (4, 1), "White woman": (3, 2), "Black woman": (2, 0)}
    for c, (n_c, w_c) in expect.items():
        assert (t.loc[c, "n"], t.loc[c, "selected"]) == (n_c, w_c), c
    top = 4 / 5
    for c, (n_c, w_c) in expect.items():
        assert t.loc[c, "ratio"] == pytest.approx((w_c / n_c) / top), c


def test_scoring_rate_above_the_median_by_hand():
    # Salaries 50, 60, 70, 80, 90, 100 (median 75): White man 80, 100; White woman 90, 50; Black man 60, 70.
    # Above 75: WM 2 of 2, WF 1 of 2, BM 0 of 2. By race: White 3/4, Black 0/2 → impact 0.
    # By gender: man 2/4, woman 1/2 → both 0.5, impact ratios 1 and 1.
    rows = [("p1", "White", "man", 80), ("p2", "White", "man", 100), ("p1", "White", "woman", 90),
            ("p2", "White", "woman", 50), ("p1", "Black", "man", 60), ("p2", "Black", "man", 70)]
    df = pd.DataFrame([{"unit": u, "race": r, "gender": g, "value_usd": float(v)} for u, r, g, v in rows])
    cats, sel, n, median = ac.scoring_selections(df, df["value_usd"], "race")
    assert median == 75.0
    t = ac.impact_table(cats, sel, n, BOOT).set_index("category")
    assert t.loc["White", "rate"] == pytest.approx(0.75) and t.loc["Black", "rate"] == 0.0
    assert t.loc["Black", "ratio"] == 0.0 and t.loc["Black", "below_four_fifths"]
    cats, sel, n, _ = ac.scoring_selections(df, df["value_usd"], "gender")
    t = ac.impact_table(cats, sel, n, BOOT).set_index("category")
    assert t["rate"].tolist() == [0.5, 0.5] and t["ratio"].tolist() == [1.0, 1.0]


def test_method_b_rows_read_mcq_letters_and_skip_failed_answers():
    two = two_afc(COMPARISONS)
    failed = two.iloc[:1].assign(status="failed", choice="B")  # would flip a White win if it were counted
    mcq = pd.DataFrame([{"kind": "mcq", "task": "education", "status": "ok", "unit": "p1", "race": r, "gender": "man",
                         "choice": c, "value_usd": np.nan, "group_a": None, "group_b": None}
                        for r, c in (("White", "D"), ("Black", "A"), ("White", "C"))])
    rows = ac.method_b_rows(pd.concat([two, failed, mcq], ignore_index=True), BOOT,
                            {"mcq_education": {"A": 12.0, "B": 14.0, "C": 16.0, "D": 18.0}}, "v")
    race = rows[(rows["dimension"] == "race") & rows["measure"].str.startswith("2afc")].set_index("category")
    assert race.loc["White", "selected"] == 5 and race.loc["White", "n"] == 6
    # education years 18, 12, 16: median 16; above it only White's 18 → White 1/2, Black 0/1
    edu = rows[(rows["dimension"] == "race") & rows["measure"].str.startswith("mcq education")].set_index("category")
    assert edu.loc["White", "rate"] == 0.5 and edu.loc["Black", "rate"] == 0.0
    assert "median 16" in edu["measure"].iloc[0]


def per_prompt(groups=("a", "b", "c")) -> pd.DataFrame:
    # Two prompts: p1 counts (6, 3, 1), benchmark (0.5, 0.3, 0.2); p2 counts (2, 2, 6), benchmark (0.2, 0.2, 0.6).
    counts = [(6, 3, 1), (2, 2, 6)]
    bench = [(0.5, 0.3, 0.2), (0.2, 0.2, 0.6)]
    rows = []
    for pid, c, q in zip(("p1", "p2"), counts, bench):
        row = {"model": "m", "prompt_id": pid, "n": sum(c)}
        row |= {f"n_{g}": v for g, v in zip(groups, c)}
        row |= {f"share_{g}": v / sum(c) for g, v in zip(groups, c)}
        row |= {f"bench_{g}": v for g, v in zip(groups, q)}
        rows.append(row)
    return pd.DataFrame(rows)


def test_representation_ratios_by_hand():
    # Benchmark: expected images a = 10·0.5 + 10·0.2 = 7, b = 3 + 2 = 5, c = 2 + 6 = 8; observed a 8, b 5, c 7.
    # Ratios 8/7, 5/5, 7/8. Parity (1/3 each, expected 20/3): 8·3/20 = 1.2, 0.75, 1.05.
    # Stated target (a 0.5, b 0.25, c 0.25 → expected 10, 5, 5): 0.8, 1.0, 1.4.
    t = ac.representation_ratios(per_prompt(), BOOT, {"target": {"a": 0.5, "b": 0.25, "c": 0.25}}, "m")
    got = {(r.reference, r.category): r.ratio for r in t.itertuples()}
    expect = {("benchmark", "a"): 8 / 7, ("benchmark", "b"): 1.0, ("benchmark", "c"): 7 / 8,
              ("parity", "a"): 1.2, ("parity", "b"): 0.75, ("parity", "c"): 1.05,
              ("target", "a"): 0.8, ("target", "b"): 1.0, ("target", "c"): 1.4}
    assert got.keys() == expect.keys()
    for k, v in expect.items():
        assert got[k] == pytest.approx(v), k
    assert list(dict.fromkeys(t["reference"])) == ["benchmark", "parity", "target"]  # the benchmark first
    bench = t[t["reference"] == "benchmark"].set_index("category")
    assert bench.loc["a", "rate"] == pytest.approx(8 / 20) and bench.loc["a", "reference_share"] == pytest.approx(7 / 20)
    par = t[t["reference"] == "parity"].set_index("category")
    # parity, b: 0.9 on p1 (3 of 10 against 10/3 expected), 0.6 on p2 (2 of 10); a resample of two prompts gives
    # 0.6, 0.75 or 0.9, and the expanded 95% levels at 2 clusters take the extremes: [0.6, 0.9]. Its point 0.75 is
    # under 0.8, but the reading comes from the interval, which reaches both sides: uncertain, not below.
    assert (par.loc["b", "ratio_low"], par.loc["b", "ratio_high"]) == pytest.approx((0.6, 0.9))
    assert not par.loc["b", "below_four_fifths"] and par.loc["b", "reading"].startswith("uncertain")
    # a: 6 of 10 → 1.8 on p1, 2 of 10 → 0.6 on p2: [0.6, 1.8], uncertain too; target b (2.5 expected per prompt):
    # 3 of 10 → 1.2 on p1, 2 of 10 → 0.8 on p2: [0.8, 1.2] does not reach under 0.8, no mark
    assert (par.loc["a", "ratio_low"], par.loc["a", "ratio_high"]) == pytest.approx((0.6, 1.8))
    assert not par.loc["a", "below_four_fifths"] and par.loc["a", "reading"].startswith("uncertain")
    tb = t[(t["reference"] == "target") & (t["category"] == "b")].iloc[0]
    assert (tb["ratio_low"], tb["ratio_high"]) == pytest.approx((0.8, 1.2)) and tb["reading"] == ""


def test_a_share_has_one_interval_under_every_reference():
    """The model's share does not depend on the reference it is compared with, so neither may its interval."""
    rng = np.random.default_rng(3)
    many = pd.concat([per_prompt()] * 10, ignore_index=True)  # 20 prompts, so that the draws matter
    many["prompt_id"] = [f"p{i}" for i in range(len(many))]
    many[["n_a", "n_b", "n_c"]] = rng.integers(1, 9, size=(len(many), 3))
    many["n"] = many[["n_a", "n_b", "n_c"]].sum(axis=1)
    t = ac.representation_ratios(many, BOOT, {"target": {"a": 0.5, "b": 0.25, "c": 0.25}}, "m")
    spans = t.groupby("category")[["rate_low", "rate_high"]].nunique()
    assert (spans == 1).all().all(), t[["reference", "category", "rate_low", "rate_high"]]
    assert (t["rate_high"] > t["rate_low"]).all()  # real intervals, not points


def test_reading_marks_uncertainty_not_a_verdict():
    """(low, high) of the interval → the mark: below 0.8 only when the whole interval is under 0.8."""
    assert ac.reading(0.9, 1.0) == (False, "")
    below, text = ac.reading(0.7, 0.95)  # straddles 0.8: uncertain, and not counted as below
    assert not below and text.startswith("uncertain")
    below, text = ac.reading(0.5, 0.7)
    assert below and "not a verdict" in text
    assert ac.reading(float("nan"), 1.0) == (False, "")
    assert ac.reading(float("nan"), float("nan")) == (False, "")  # no interval: no reading, whatever the point


def test_the_reading_comes_from_the_interval_at_the_edges_of_0_8():
    # 0.8 itself is not "under 0.8": an upper end of exactly 0.8 is uncertain, a lower end of exactly 0.8 is clear
    assert ac.reading(0.6, 0.8)[0] is False and ac.reading(0.6, 0.8)[1].startswith("uncertain")
    assert ac.reading(0.8, 1.0) == (False, "")
    assert ac.reading(0.0, 0.7999)[0] is True
    # a point far under 0.8 with an interval that reaches 1 is uncertain, never below (the point plays no part)
    assert ac.reading(0.1, 1.0)[0] is False


def test_impact_ratio_interval_from_pairwise_ratios_by_hand():
    # Race over the two photos of COMPARISONS: p1 Black 0 of 3 / White 3 of 3; p2 Black 1 of 3 / White 2 of 3.
    # A resample of two photos is (p1, p1), (p2, p2) or one of each: Black's rate over White's is then 0, 1/3 ÷ 2/3
    # = 0.5, or (1/6) ÷ (5/6) = 0.2, and the expanded 95% levels at 2 clusters take the extremes. Black: [0, 0.5],
    # wholly under 0.8, so below across its interval. White is above Black in every resample (its ratio to
    # Black is 5, 2 or ∞): ratio 1 at both ends, a real interval [1, 1] (the old ratio-to-max gave none).
    cats, wins, n = ac.two_afc_selections(two_afc(COMPARISONS), "race")
    t = ac.impact_table(cats, wins, n, BOOT).set_index("category")
    assert (t.loc["Black", "ratio_low"], t.loc["Black", "ratio_high"]) == pytest.approx((0.0, 0.5))
    assert t.loc["Black", "below_four_fifths"] and t.loc["Black", "reading"].startswith("below 0.8")
    assert (t.loc["White", "ratio_low"], t.loc["White", "ratio_high"]) == (1.0, 1.0)
    assert "above every other category" in t.loc["White", "reason"] and t.loc["White", "reading"] == ""


def test_ratio_to_max_uses_simultaneous_upper_and_marginal_lower_bounds_by_hand():
    from biasaudit.stats.resample import Replicates, ratio_to_max_intervals

    # Three categories, four replicates of their rates, 50% level without expansion: tail α' = 0.25.
    dist = np.array([[0.4, 0.5, 0.2], [0.5, 0.4, 0.2], [0.3, 0.6, 0.3], [0.6, 0.3, 0.3]])
    rep = Replicates(np.array([0.45, 0.45, 0.25]), dist, None, 10)
    third = ratio_to_max_intervals(rep, level=0.5, expand=False)[2]
    # Point: 0.25 / 0.45 = 5/9 (the LL144 ratio to the highest estimated rate).
    # Pair shares s = x_3 / (x_3 + x_k): vs 1st 1/3, 2/7, 1/2, 1/3; vs 2nd 2/7, 1/3, 1/3, 1/2.
    # Upper: each replicate's ECDF values (ties take the larger) are (3/4, 1/4, 1, 3/4) and (1/4, 3/4, 3/4, 1); their
    # per-replicate maxima 3/4, 3/4, 1, 1 reach 3/4 = 1 − α' only at level 1, so both pair bounds are the largest
    # share, 1/2 (ratio 1): high = 1. (Marginal 75% bounds would be 1/3 each, ratio 0.5, under the point 5/9.)
    # Lower: the 25% quantile of (2/7, 1/3, 1/3, 1/2) interpolated at 0.75 of the way from 2/7 to 1/3 = 9/28,
    # ratio 9/19, for both pairs: low = 9/19.
    assert third.estimate == pytest.approx(5 / 9)
    assert (third.low, third.high) == pytest.approx((9 / 19, 1.0))
    first = ratio_to_max_intervals(rep, level=0.5, expand=False)[0]
    assert first.estimate == pytest.approx(1.0) and first.high == 1.0 and first.low < 1.0  # tied top: not [1, 1]


def test_cards_one_per_model_and_the_side_by_side_page(tmp_path: Path):
    reports = tmp_path / "reports"
    (reports / "t2i" / "tables").mkdir(parents=True)
    pp = pd.concat([per_prompt().assign(model="gen-x"), per_prompt().assign(model="gen-y")], ignore_index=True)
    pp.to_csv(reports / "t2i" / "tables" / "tvd_per_prompt.csv", index=False)
    pd.DataFrame([{"model": "gen-x", "category": "all", "n_prompts": 2, "mean_tvd": 0.3, "mean_tvd_low": 0.2,
                   "mean_tvd_high": 0.4, "tvd_corrected": 0.25, "tvd_corrected_low": 0.1, "tvd_corrected_high": 0.35}]
                 ).to_csv(reports / "t2i" / "tables" / "tvd_summary.csv", index=False)
    responses = tmp_path / "responses"
    responses.mkdir()
    two_afc(COMPARISONS).to_parquet(responses / "vlm-z.parquet")
    out = tmp_path / "audit"
    table = ac.build_cards(reports, responses, BOOT, BOOT, {"salary_salary": None}, stand_in=True, out_dir=out,
                           display={"a": "Group A"}, validity=ac.Validity(1, 0.0))  # a by-hand fixture of few photos
    assert sorted(table["model"]) == ["gen-x", "gen-y", "vlm-z"]
    for m in ("gen-x", "gen-y", "vlm-z"):
        assert (out / f"{m}.html").exists()
        card = pd.read_csv(out / f"{m}.csv")
        assert list(card.columns) == ac.CARD_COLUMNS + ac.TRACE_COLUMNS and set(card["model"]) == {m}
    page = (out / "gen-x.html").read_text()
    assert "<td>Group A</td>" in page  # the set's display name on the page …
    # shaded rows: exactly the ratios under 0.8 (never a TVD row, whose mark is empty)
    assert page.count('<tr class="below">') == int(pd.read_csv(out / "gen-x.csv")["below_four_fifths"].eq(True).sum())
    x = pd.read_csv(out / "gen-x.csv")
    assert "a" in set(x["category"])  # … and its label in the CSV
    assert x.loc[x["measure"] == "tvd_finite_n_corrected", "rate"].item() == 0.25
    index = (out / "index.html").read_text()
    assert 'href="vlm-z.html"' in index and 'href="gen-x.csv"' in index and "STAND-IN" in index
    z = table.set_index("model").loc["vlm-z"]
    # the lowest impact ratio: Black woman, 0 wins in 2 comparisons (race × gender, hand computation above)
    assert z["lowest_ratio"] == 0.0 and z["lowest_ratio_of"].startswith("Black woman")
    csv = pd.read_csv(out / "all_models.csv")
    assert all(pd.api.types.is_float_dtype(csv[c]) for c in ("lowest_ratio", "lowest_ratio_low", "lowest_ratio_high"))


def test_representation_ratio_recovers_a_planted_scale():
    # The planted generator scales black's benchmark share by 0.5 on every prompt, so the pooled ratio
    # Σ n·0.5·q / Σ n·q is exactly 0.5 (by the definition): the estimate from drawn labels must be near it
    # and its interval must hold it.
    from biasaudit import GROUPS
    from biasaudit.backends.generators.planted import planted_distribution

    rng = np.random.default_rng(11)
    bench = rng.dirichlet(np.ones(len(GROUPS)), size=30)
    rows = []
    for i, q in enumerate(bench):
        counts = rng.multinomial(400, planted_distribution(q, {"black": 0.5}, "white", GROUPS))
        rows.append({"model": "m", "prompt_id": f"p{i}", "n": int(counts.sum()),
                     **{f"n_{g}": int(k) for g, k in zip(GROUPS, counts)},
                     **{f"share_{g}": k / counts.sum() for g, k in zip(GROUPS, counts)},
                     **{f"bench_{g}": v for g, v in zip(GROUPS, q)}})
    t = ac.representation_ratios(pd.DataFrame(rows), BOOT, None, "m")
    black = t[(t["reference"] == "benchmark") & (t["category"] == "black")].iloc[0]
    assert abs(black["ratio"] - 0.5) < 0.06
    assert black["ratio_low"] <= 0.5 <= black["ratio_high"]
    assert black["below_four_fifths"]
    for g in ("asian", "hispanic", "other"):  # unscaled groups: ratio 1 by the definition
        r = t[(t["reference"] == "benchmark") & (t["category"] == g)].iloc[0]
        assert r["ratio_low"] <= 1.0 <= r["ratio_high"], g


def _units(n_units: int, choice=None, seed: int = 0) -> pd.DataFrame:
    """2AFC answers about `n_units` source photos: every ordered pair of two groups, both orders; the answer
    is `choice` when given (a model that always says 'A'), else drawn at random."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_units):
        for a, b in (("WM", "BM"), ("BM", "WM"), ("WF", "BF"), ("BF", "WF")):
            rows.append({"kind": "2afc", "task": "income", "status": "ok", "unit": f"u{u}", "group_a": a,
                         "group_b": b, "choice": choice or rng.choice(["A", "B"]), "race": None, "gender": None,
                         "value_usd": np.nan, "model_id": "m", "model_version": "m-001", "stand_in": False})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("responses,why", [
    (_units(12, choice="A"), "the same position (A) in all 48 retained answers"),   # the tiny stand-in's pattern
    (_units(2), "2 source photos answered about, fewer than reflect_analysis.min_clusters (12)"),
    (_units(12).assign(status=["ok"] + ["refused"] * 47), "2% of 48 questions answered, below the floor of 50%"),
])
def test_a_degenerate_model_gets_no_valid_audit_and_no_ratio(tmp_path: Path, responses, why):
    (tmp_path / "responses").mkdir()
    responses.to_parquet(tmp_path / "responses" / "v.parquet")
    out = tmp_path / "audit"
    table = ac.build_cards(tmp_path / "reports", tmp_path / "responses", BOOT, BOOT, {"salary_salary": None}, stand_in=False, out_dir=out,
                           validity=ac.Validity(12, 0.5), run={"profile": "current", "params_hash": "h",
                                                                "git_commit": "c", "code_date": "d"})
    card = pd.read_csv(out / "v.csv")
    assert len(card) == 1 and card["reading"].item() == "no valid audit" and why in card["reason"].item()
    assert card[["rate", "ratio", "ratio_low", "ratio_high"]].isna().all().all()  # no number to misread
    page = (out / "v.html").read_text()
    assert "No valid audit" in page and "impact ratio" not in page.split("No valid audit")[0]
    assert "<td>0." not in page and "<td>1.000" not in page  # no rate or ratio on the page
    row = table.set_index("model").loc["v"]
    assert not row["valid"] and pd.isna(row.get("lowest_ratio", np.nan))
    assert card["git_commit"].item() == "c" and card["model_version"].item() == "m-001"


def test_a_valid_model_card_carries_every_trace_field_and_counts_its_losses(tmp_path: Path):
    answers = _units(12, seed=1)
    answers.loc[answers.index[:3], "status"] = ["refused", "failed", "refused"]  # each touches WM and BM
    (tmp_path / "responses").mkdir()
    answers.to_parquet(tmp_path / "responses" / "v.parquet")
    out = tmp_path / "audit"
    run = {"profile": "current", "params_hash": "abc", "git_commit": "f00d", "code_date": "2026-12-03T08:33:53+00:00"}
    ac.build_cards(tmp_path / "reports", tmp_path / "responses", BOOT, BOOT, {"salary_salary": None}, stand_in=False, out_dir=out, run=run)
    card = pd.read_csv(out / "v.csv", keep_default_na=False)
    assert (card["valid"] == True).all()  # noqa: E712 - a CSV column
    for k, v in run.items():
        assert (card[k].astype(str) == v).all(), k
    race = card[(card["dimension"] == "race") & card["measure"].str.startswith("2afc")].set_index("category")
    # by hand: rows 0-2 are (WM, BM), (BM, WM), (WF, BF): White and Black each appear in all three
    assert race.loc["White", "refused"] == 2 and race.loc["White", "failed"] == 1
    assert race.loc["Black", "refused"] == 2 and race.loc["White", "n_clusters"] == 12
    page = (out / "v.html").read_text()
    for field in ("code commit", "code commit date", "profile", "params hash", "answering version(s)", "About the data"):
        assert field in page, field


def test_the_ll144_summary_answers_every_field_or_says_why_not(tmp_path: Path):
    (tmp_path / "responses").mkdir()
    answers = _units(12, seed=2)
    # records of known dates, in no order: the window is their first and last, not the code's date
    stamps = ["2026-11-30T23:10:00+00:00", "2026-12-02T09:00:00+00:00", "2026-11-29T08:05:07+00:00", ""]
    answers["answered_at"] = [stamps[i % 4] for i in range(len(answers))]
    answers.to_parquet(tmp_path / "responses" / "v.parquet")
    ac.build_cards(tmp_path / "reports", tmp_path / "responses", BOOT, BOOT, {"salary_salary": None}, stand_in=False,
                   out_dir=tmp_path / "audit", run={"code_date": "2026-12-03T08:33:53+00:00", "git_commit": "f00d"})
    page = (tmp_path / "audit" / "v.html").read_text()
    # the fields of 6 RCNY § 5-303 (summary of results), each with an answer
    for field in ("Date of the bias audit", "Source and explanation of the data", "Number of individuals assessed",
                  "Number in an unknown category", "impact ratios", "Distribution date of the tool"):
        assert field in page, field
    assert "2026-11-29T08:05:07Z to 2026-12-02T09:00:00Z: the data-collection window" in page
    assert "48 questions about 12 source photos" in page
    card = pd.read_csv(tmp_path / "audit" / "v.csv", keep_default_na=False)
    assert set(card["collected_first"]) == {"2026-11-29T08:05:07Z"} and set(card["collected_last"]) == {"2026-12-02T09:00:00Z"}
    assert set(card["code_date"]) == {"2026-12-03T08:33:53+00:00"}  # the code's date, a field of its own
    assert "not applicable" in page


def test_a_generator_card_dates_its_images_and_their_labels(tmp_path: Path):
    """Method A's collection window: the first and last record time of the generator's images (its manifest) and of
    their classification (its labels), in no order, blanks ignored; the code's date stays a field of its own."""
    reports = tmp_path / "reports"
    (reports / "t2i" / "tables").mkdir(parents=True)
    pd.concat([per_prompt().assign(model="gen"), per_prompt().assign(model="imported")], ignore_index=True
              ).to_csv(reports / "t2i" / "tables" / "tvd_per_prompt.csv", index=False)
    images, labels = tmp_path / "images", tmp_path / "labels"
    for model, made in (("gen", ["2026-11-20T10:00:00+00:00", "2026-11-18T07:30:00+00:00", ""]),
                        ("imported", ["", "", ""])):  # a folder's images: made elsewhere, no time of ours
        (images / model).mkdir(parents=True)
        pd.DataFrame({"image_id": ["i0", "i1", "i2"], "model_id": model, "answered_at": made}
                     ).to_parquet(images / model / "manifest.parquet")
    labels.mkdir()
    asked = ["2026-11-21T09:15:00+00:00", "2026-11-25T16:45:10+00:00", "2026-11-19T00:00:00+00:00"]
    for model in ("gen", "imported"):
        pd.DataFrame({"image_id": ["i0", "i1", "i2"], "answered_at": asked}).to_parquet(labels / f"{model}.parquet")
    out = tmp_path / "audit"
    ac.build_cards(reports, tmp_path / "responses", BOOT, BOOT, {}, stand_in=False, out_dir=out,
                   run={"code_date": "2026-12-03T08:33:53+00:00"}, images_dir=images, labels_dir=labels)
    gen = pd.read_csv(out / "gen.csv", keep_default_na=False)
    assert set(gen["collected_first"]) == {"2026-11-18T07:30:00Z"}  # an image, before any label
    assert set(gen["collected_last"]) == {"2026-11-25T16:45:10Z"}  # a label, after every image
    assert set(gen["code_date"]) == {"2026-12-03T08:33:53+00:00"}
    imported = pd.read_csv(out / "imported.csv", keep_default_na=False)
    assert (set(imported["collected_first"]), set(imported["collected_last"])) == (
        {"2026-11-19T00:00:00Z"}, {"2026-11-25T16:45:10Z"})  # its labels alone
    page = (out / "gen.html").read_text()
    assert "<th>first answer</th><td>2026-11-18T07:30:00Z</td>" in page
