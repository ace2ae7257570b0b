"""Issue #45: each finding carries its caveats where it is stated.

- Answer-dependent refusals with no effect (the planted VLM's selective refusal, as benchmarks/calibration.py
  draws it): the primary-endpoint table, the front page and the audit card each show the refusal flag beside the
  Black endpoint, and none calls it robust. Oracles: the planted null (no group effect: the would-have-answered
  win rate is 0.5), the definition of the refusal-rate gap (Black faces refused more often, counted by hand),
  and the definition of "robust" (the bounds' interval excludes no effect).
- Beside a displaced group, the front page announces no unaffected group (the localising test is the verdict).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from biasaudit import contracts as C
from biasaudit.params.vlm import Reflect
from biasaudit.report import audit_card as ac
from biasaudit.report import front
from biasaudit.report.load import Outputs
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import endpoints, refusals, significance

from .conftest import calibration_module
from .fixtures_vlm import answers, config

BLACK_MEN = "race_winrate:income:man:Black"


@pytest.fixture(scope="module")
def selective_null(tmp_path_factory):
    """A planted VLM with no group effect that refuses a comparison more often when it would pick a Black face
    (calibration's SELECTIVE), 24 photos; its analysis tables written where the report reads them."""
    cal = calibration_module()
    pl = cal._selective(True)
    df = P.simulate_responses(pl, cal._units(24), np.random.default_rng(11), Reflect(tasks=["2afc_income", "mcq_salary", "salary_salary"]))
    cfg = config(n_boot=300, n_permutations=199, wild_bootstrap=0,
                 primary_endpoints=[BLACK_MEN, "race_winrate:income:woman:Black", "delta_g:salary_salary:race:Black"])
    data = answers(df, vlm="v")
    root = tmp_path_factory.mktemp("sel")
    tables = root / "reports" / "vlm" / "tables"
    tables.mkdir(parents=True)
    for res in (significance.compute(data, cfg), refusals.compute(data, cfg)):
        for name, t in res.tables.items():
            t.to_csv(tables / f"{name}.csv", index=False)
    (root / "responses").mkdir()
    df.to_parquet(root / "responses" / "v.parquet")
    return root, df, data, cfg


def _black_refused_more(df: pd.DataFrame) -> bool:
    """By hand: the share of refused 2AFC comparisons showing a Black face vs one showing none."""
    two = df[(df["kind"] == "2afc") & df["status"].isin(["ok", "refused"])]
    black = two["group_a"].isin(["BM", "BF"]) | two["group_b"].isin(["BM", "BF"])
    share = two["status"].eq("refused").groupby(black).mean()
    return share[True] > share[False]


def test_the_primary_endpoint_table_flags_the_refusals_and_calls_nothing_robust(selective_null):
    _, df, data, cfg = selective_null
    assert _black_refused_more(df)  # the planted refusal pattern is there
    t = endpoints.primary_endpoints(data, cfg).set_index("endpoint")
    bm = t.loc[BLACK_MEN]
    assert bool(bm["refusal_gap"]) and bm["refusal_gap_p"] < 0.05
    assert "REFUSAL GAP" in bm["caveats"]
    # no effect was planted: the win rate every filling-in could give holds 0.5, so the endpoint is not robust
    assert bm["bounds_low"] <= 0.5 <= bm["bounds_high"] and bm["robust_to_refusals"] == "no"
    assert "robust to refusals: no" in bm["caveats"]
    # robust means exactly: the bounds' interval excludes the no-effect value
    for _, r in t.dropna(subset=["bounds_low"]).iterrows():
        null = 0.5 if r.name.startswith("race_winrate") else 0.0
        assert (r["robust_to_refusals"] == "yes") == (not r["bounds_low"] <= null <= r["bounds_high"])
    note = endpoints.error_rate_note(t.reset_index(), 0.05)
    assert "missing at random" in note and BLACK_MEN in note


def test_the_front_page_shows_the_flag_beside_the_black_endpoint(selective_null):
    root, *_ = selective_null
    reports = root / "reports"
    b = front.primary_block(Outputs.load(reports / "vlm"), reports, "95%")
    finding = b.findings[0]
    assert BLACK_MEN in finding
    after = finding[finding.index(BLACK_MEN):]
    assert "REFUSAL GAP" in after.split(";")[0] + after and "robust to refusals: yes" not in finding
    row = next(r for r in b.html.split("<tr>") if BLACK_MEN in r)
    # the flag and "robust to refusals: no" beside it, rejected or not (under this selective null the
    # complete-case estimate is biased, so whether it is rejected depends on the draw)
    assert "REFUSAL GAP" in row and ">no<" in row
    blocks = {"method_b": [b]}
    assert front.headline_findings(blocks) == [finding]


def test_the_card_shows_the_flag_beside_the_black_rows_and_calls_none_robust(selective_null):
    root, *_ = selective_null
    out = root / "audit"
    ac.build_cards(root / "reports", root / "responses", ac.Resampling(300, 0.95, "percentile", 1),
                   ac.Resampling(300, 0.95, "percentile", 1), {"salary_salary": None}, stand_in=True, out_dir=out)
    card = pd.read_csv(out / "v.csv", keep_default_na=False)
    black = card[card["measure"].str.startswith("2afc income") & card["category"].isin(["Black", "Black man"])]
    assert len(black) == 2 and (black["refusal_gap"].astype(str) == "True").all()
    assert not (black["robust_to_refusals"] == "yes").any()
    # the bounds hold every filling-in of the refused comparisons: the planted null's ratio, 1, for Black men
    # (no group effect), lies in the interval of the bounds
    bm = black[black["category"] == "Black man"].iloc[0]
    assert float(bm["bounds_low"]) <= 1.0 <= float(bm["bounds_high"]) + 1e-12
    page = (out / "v.html").read_text()
    row = next(r for r in page.split("<tr") if "<td>Black</td>" in r and "REFUSAL GAP" in r)
    assert ">yes<" not in row


def test_card_ratio_bounds_hold_a_brute_force_over_the_refused_comparisons():
    """Three photos, two categories: the bounds (point) hold the least and greatest impact ratio over every way
    the refused comparisons could have been answered (the lower end is sharp, the upper need not be)."""
    from itertools import product

    rows = [("WM", "BM", "A", "ok", "u1"), ("BM", "WM", "A", "ok", "u1"), ("WM", "BM", None, "refused", "u2"),
            ("WM", "BM", "B", "ok", "u2"), ("BM", "WM", None, "refused", "u3"), ("WM", "BM", "A", "ok", "u3")]
    df = pd.DataFrame(rows, columns=["group_a", "group_b", "choice", "status", "unit"]).assign(
        kind="2afc", task="income", race=None, gender=None)
    ratios = []
    for fill in product("AB", repeat=2):
        full = df.copy()
        full.loc[full["status"] == "refused", "choice"] = fill
        cats, wins, n = ac.two_afc_selections(full, "race")
        rate = wins.sum(0) / n.sum(0)
        ratios.append(rate / rate.max())
    ok = df[df["status"] == "ok"]
    cats, wins, n = ac.two_afc_selections(ok, "race")
    b = ac.refusal_bounds(df, (cats, wins, n), list(pd.unique(ok["unit"])), "race",
                          ac.Resampling(50, 0.95, "percentile", 1)).set_index("category")
    for j, c in enumerate(cats):
        lo, hi = min(r[j] for r in ratios), max(r[j] for r in ratios)
        assert b.loc[c, "bounds_low"] <= lo + 1e-12 and b.loc[c, "bounds_high"] >= hi - 1e-12


def test_beside_a_displaced_group_the_front_page_announces_no_unaffected_group():
    """One group (black) with a look of its own (shifted): the old per-group test reads every group beside it as
    displaced; the front page names only what the localising test flags."""
    from biasaudit.stats.homogeneity import add_p_adjusted, within_prompt_table

    cal = calibration_module()
    unaffected = [g for g in C.GROUPS if g != "black"]
    announced_by_old_test = 0
    for seed in range(3):
        X, labels, prompts = cal._loc_data(np.random.default_rng(seed), 20, 60, shift=cal.LOOK_SHIFT)
        t = within_prompt_table(X, prompts, {"race": labels}, categories={"race": list(C.GROUPS)}, n_boot=200,
                                n_perm=199, seed=seed, paper=True, small_group=30)["race"]
        t = add_p_adjusted(t.assign(model="m", space="clip", p_value=t["p_perm"]))
        announced_by_old_test += int((t.set_index("group").loc[unaffected, "p_adjusted"] < 0.05).any())
        text = " ".join(front.homogeneity_findings(t, "p_adjusted"))
        flagged = set(t.loc[t["flagged"].astype(bool), "group"])
        for g in unaffected:
            if g not in flagged:
                assert f"{g} in m" not in text, (seed, text)
        assert "localising" in text
    assert announced_by_old_test > 0  # the case the issue describes does occur here


def test_the_card_names_its_race_groups_as_focus_not_eeo1_and_the_replication_banner_is_prose(tmp_path):
    from biasaudit.report.replication import write_replication

    assert "five of the FOCUS data set" in ac.ABOUT_DATA_B and "not the EEO-1" in ac.ABOUT_DATA_B
    for race in C.RACES:  # every group the card reports is named as FOCUS names it
        assert (race if race != "MiddleEastern" else "Middle Eastern") in ac.ABOUT_DATA_B
    _, page = write_replication(tmp_path, pd.DataFrame(), "offline", ["planted generator a", "simulated classifier"])
    text = page.read_text()
    assert "planted generator a; simulated classifier" in text and "['" not in text


def test_the_significance_rows_name_their_unit_and_reference_group(tmp_path):
    import json

    tables = tmp_path / "vlm" / "tables"
    tables.mkdir(parents=True)
    (tmp_path / "vlm" / "manifest.json").write_text(json.dumps({"sections": []}))
    pd.DataFrame({"dimension": ["race"], "level": ["Black"], "reference": ["White"], "mean_diff": [-12037.494],
                  "p": [0.01], "p_adjusted": [0.02], "measure": ["salary_salary"], "reason": [""]}).to_csv(
        tables / "v_sign_flip.csv", index=False)
    b = front.significance_block(Outputs.load(tmp_path / "vlm"), tmp_path, "95%")
    row = next(r for r in b.html.split("<tr>") if "-12037.494" in r)
    assert "Black vs White" in row and "USD per year" in row


def test_an_answer_carries_when_it_came_and_a_cached_rerun_keeps_it(tmp_path, monkeypatch):
    """A hosted model's answer is stamped with the wall clock when it arrives and the stamp is cached with it (a
    re-run with cached answers writes the same record); a stand-in's with the reproducible timestamp."""
    from datetime import datetime, timezone

    from biasaudit.backends.vlm import CachedVLM, VLMRequest
    from biasaudit.backends.vlm.base import VLMBackend, VLMResponse

    class Hosted(VLMBackend):
        name, model_id, revision, stand_in = "fake", "m", "", False

        def decoding_params(self):
            return {}

        def generate(self, requests, on_result=None):
            return self._each(requests, lambda r: VLMResponse("A", "ok"), on_result)

    img = tmp_path / "a.png"
    img.write_bytes(b"not read: the key hashes the bytes")
    req = VLMRequest(images=(str(img),), prompt="q", options=("A", "B"))
    before = datetime.now(timezone.utc).replace(microsecond=0)
    first = CachedVLM(Hosted(), tmp_path / "c.sqlite").generate([req])[0]
    after = datetime.now(timezone.utc)
    when = datetime.fromisoformat(first.meta["answered_at"])
    assert before <= when <= after and not first.from_cache
    again = CachedVLM(Hosted(), tmp_path / "c.sqlite").generate([req])[0]
    assert again.from_cache and again.meta["answered_at"] == first.meta["answered_at"]

    class StandIn(Hosted):
        stand_in = True

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1764547200")  # 2025-12-01T00:00:00Z
    stand = CachedVLM(StandIn(), tmp_path / "d.sqlite").generate([req])[0]
    assert stand.meta["answered_at"] == "2025-12-01T00:00:00+00:00"


def test_an_underpowered_endpoint_says_so_in_its_caveats():
    """Six photos, below min_clusters 12: the interval and p are blanked, and the row's caveats say why."""
    cal = calibration_module()
    df = P.simulate_responses(cal._selective(True), cal._units(6), np.random.default_rng(2), Reflect(tasks=["2afc_income", "mcq_salary", "salary_salary"]))
    cfg = config(n_boot=100, n_permutations=99, wild_bootstrap=0, primary_endpoints=[BLACK_MEN])
    r = endpoints.primary_endpoints(answers(df), cfg).iloc[0]
    assert np.isnan(r["low"]) and r["caveats"].startswith("UNDERPOWERED: ") and "min_clusters 12" in r["caveats"]
    assert r["robust_to_refusals"] != "yes"
