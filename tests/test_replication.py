"""The replication table (report/replication.py): every published number (data/reference/published/) gets a
row, each row quotes its sentence and is listed by id in docs/replication.md, an interval covers or misses a
published value as computed by hand, a stand-in run claims no comparison, and the front page links the page."""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from biasaudit import contracts as C
from biasaudit.params import Params
from biasaudit.report import build_index
from biasaudit.report.replication import (
    COLUMNS,
    LOOKUPS,
    PUBLISHED_COLUMNS,
    STAND_IN_NOTE,
    Run,
    build_replication,
    compare,
    covers,
    load_published,
    replication_table,
)

from .conftest import ROOT

PUBLISHED = load_published(ROOT / C.PUBLISHED_DIR)


def _run(tmp_path: Path) -> Run:
    return Run.load(tmp_path / "reports", tmp_path)


def _tvd_summary(reports: Path, model: str, est: float, low: float, high: float) -> None:
    (reports / "t2i/tables").mkdir(parents=True, exist_ok=True)
    (reports / "t2i/manifest.json").write_text(json.dumps({"sections": []}))
    pd.DataFrame({"model": [model], "category": ["all"], "n_prompts": [150], "mean_tvd": [est], "mean_tvd_low": [low],
                  "mean_tvd_high": [high]}).to_csv(reports / "t2i/tables/tvd_summary.csv", index=False)


def test_published_numbers_are_well_formed():
    assert list(PUBLISHED.columns[:len(PUBLISHED_COLUMNS)]) == list(PUBLISHED_COLUMNS)
    assert PUBLISHED["id"].is_unique and len(PUBLISHED) >= 60
    assert set(PUBLISHED["method"]) == {"A", "B"} and set(PUBLISHED["kind"]) <= {"result", "claim", "design"}
    assert set(PUBLISHED["relation"]) <= {"=", "<", ">"}
    assert PUBLISHED["value"].map(lambda v: math.isfinite(float(v))).all()
    assert (PUBLISHED["sentence"].str.len() > 20).all()
    # every number a result row reports is written in its own sentence (0.110 as "0.110", 20% as "20%"), but for
    # the two the sentence gives in words ("not … for any prompt": 0 prompts; "five percent")
    for r in PUBLISHED[PUBLISHED["kind"] == "result"].itertuples():
        shown = {r.value, r.value.rstrip("0").rstrip("."), f"{float(r.value) * 100:g}%", f"{float(r.value):.3f}"}
        assert any(s in r.sentence for s in shown) or r.statistic in ("share_reaching", "benchmark_share"), r.id
    # the headline numbers of both summaries are there
    values = set(PUBLISHED["value"])
    for v in ("0.452", "0.31", "0.312", "0.523", "31.5", "48.0", "50.1", "0.786", "0.715", "0.463", "0.11", "480"):
        assert v in values, v


def test_every_statistic_has_a_reader_and_every_id_is_in_the_docs():
    assert set(PUBLISHED["statistic"]) <= set(LOOKUPS)
    docs = (ROOT / "docs/replication.md").read_text()
    listed = set(re.findall(r"\b([AB]\d\d)\b", docs))
    assert set(PUBLISHED["id"]) <= listed, sorted(set(PUBLISHED["id"]) - listed)


def test_the_table_has_a_row_for_every_published_number(tmp_path):
    table = replication_table(PUBLISHED, _run(tmp_path), stand_ins=[])
    assert list(table.columns) == list(COLUMNS)
    assert list(table["id"]) == list(PUBLISHED["id"])
    assert (table["sentence"] == PUBLISHED["sentence"]).all()
    # nothing ran here: every row that needs a run output says why it is not computed
    computed = table["this_run"].notna()
    assert table.loc[~computed, "note"].str.contains("not computed: ").all()
    assert set(table.loc[computed, "statistic"]) <= {"n_labels"}


@pytest.mark.parametrize("low, high, covered", [(0.40, 0.50, True), (0.46, 0.60, False), (0.30, 0.45, False)])
def test_an_interval_covers_the_published_value_or_not(tmp_path, low, high, covered):
    """By hand: the paper's 0.452 (SD 3.5's mean TVD) against a run value 0.45 with interval [low, high]."""
    _tvd_summary(tmp_path / "reports", "sd35-large-turbo", 0.45, low, high)
    table = replication_table(PUBLISHED, _run(tmp_path), stand_ins=[]).set_index("id")
    row = table.loc["A07"]
    assert row["published"] == 0.452 and row["this_run"] == 0.45 and (row["low"], row["high"]) == (low, high)
    assert row["covered"] is covered and row["difference"] == pytest.approx(0.45 - 0.452)
    assert row["source"] == "tvd_summary.mean_tvd"
    # Flux Schnell is not a model of this run: not computed, and why
    assert table.loc["A08", "note"].startswith("not computed: this run has no model flux-schnell")
    assert table.loc["A08", "covered"] == "" and math.isnan(table.loc["A08", "difference"])


def test_a_claimed_bound_is_covered_only_by_an_interval_on_its_side():
    assert covers(0.5, 0.6, 0.9, ">") is True
    assert covers(0.5, 0.4, 0.9, ">") is False  # straddles
    assert covers(0.0, -0.2, -0.1, "<") is True and covers(0.0, 0.1, 0.2, "<") is False
    assert covers(0.2, 0.1, 0.3) is True and covers(0.2, 0.21, 0.3) is False
    assert covers(0.2, math.nan, math.nan) is None
    from biasaudit.report.replication import RunValue

    row = {"id": "X", "value": "0", "relation": "<", "kind": "claim"}
    assert "straddles" in compare(row, RunValue(0.01, -0.1, 0.1), False)["note"]
    assert "contradicts" in compare(row, RunValue(0.2, 0.1, 0.3), False)["note"]
    assert compare(row, RunValue(-0.2, -0.3, -0.1), False)["covered"] is True


def test_a_stand_in_run_claims_no_comparison(tmp_path):
    """The offline demo's stand-ins: the table shows the run's values but no difference, no covered, the reason."""
    stand_ins = Params(profile="offline").stand_ins()
    assert stand_ins
    _tvd_summary(tmp_path / "reports", "sd35-large-turbo", 0.45, 0.40, 0.50)
    table = build_replication(tmp_path / "reports", C.PUBLISHED_DIR, "offline", stand_ins, root=ROOT)
    table.index = table["id"]
    assert table.loc["A07", "this_run"] == 0.45  # shown for inspection …
    assert table["difference"].isna().all() and (table["covered"] == "").all()  # … compared with nothing
    assert table["note"].str.startswith(STAND_IN_NOTE).all()
    page = (tmp_path / "reports/pages" / C.REPLICATION_PAGE).read_text()
    assert "NO COMPARISON" in page and "STAND-IN RUN" in page and stand_ins[0] in page
    assert ">yes<" not in page and ">NO<" not in page
    csv = pd.read_csv(tmp_path / C.REPLICATION_CSV)
    assert len(csv) == len(PUBLISHED) and csv["covered"].isna().all()


def test_a_real_run_page_shows_the_comparison(tmp_path):
    _tvd_summary(tmp_path / "reports", "sd35-large-turbo", 0.45, 0.40, 0.50)
    build_replication(tmp_path / "reports", C.PUBLISHED_DIR, "paper", [], root=ROOT)
    page = (tmp_path / "reports/pages" / C.REPLICATION_PAGE).read_text()
    assert "NO COMPARISON" not in page and "STAND-IN" not in page
    assert "0.450 [0.400, 0.500]" in page and ">yes<" in page and "-0.002" in page
    assert "Its overall average TVD is 0.452" in page  # the sentence, quoted


@pytest.mark.parametrize("stand_ins", [[], ["classify.vlm: simulated"]])
def test_the_front_page_links_the_replication_page(tmp_path, stand_ins):
    reports = tmp_path / "reports"
    _tvd_summary(reports, "sd35-large-turbo", 0.45, 0.40, 0.50)
    build_replication(reports, C.PUBLISHED_DIR, "paper", stand_ins, root=ROOT)
    index = build_index(reports, Params(profile="paper"), root=tmp_path).read_text()
    assert f'href="pages/{C.REPLICATION_PAGE}"' in index
    assert (reports / "pages" / C.REPLICATION_PAGE).exists()  # kept: build_index removes only pages it did not write
    line = index.split('id="replication"', 1)[1].split("</p>", 1)[0]
    assert f"{len(PUBLISHED)} published numbers and claims; this run computes" in line
    assert ("no comparison" in line) == bool(stand_ins)
    if not stand_ins:
        assert "1 of 1 with an interval are covered" in line


def test_no_replication_page_no_link(tmp_path):
    index = build_index(tmp_path, Params(profile="paper"), root=tmp_path).read_text()
    assert C.REPLICATION_PAGE not in index
