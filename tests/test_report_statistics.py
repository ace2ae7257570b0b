"""One name per statistic (biasaudit.report.statistics): every credit is checked against the code it names,
and the front page, its TVD page and the audit cards show the same number under the same name."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import jupytext
import nbformat
import pandas as pd
import pytest

from biasaudit.report import audit_card as ac
from biasaudit.report import front
from biasaudit.report import statistics as S
from biasaudit.report.load import Outputs
from biasaudit.report.trail import call_needles, cell_anchor

from .test_audit_card import per_prompt

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("st", S.ALL, ids=lambda s: s.key)
def test_each_credit_names_the_function_that_writes_the_number_and_the_cell_that_calls_it(st, tmp_path):
    # the table declares the columns the pages read
    assert all(st.table.keeps(c) for c in st.columns), st
    # the credited module writes the estimate (its column name is a literal there: a rename breaks this; the
    # interval columns are suffixed in code, so the contract above is their check)
    module_name, func_name = st.function.rsplit(".", 1)
    module = importlib.import_module(module_name)
    assert callable(getattr(module, func_name))
    source = inspect.getsource(module)
    assert f'"{st.column}"' in source, st.key
    # the credited notebook has one code cell calling it, and the trail's anchor finds that cell
    nb = jupytext.read(ROOT / "notebooks" / f"{st.notebook}.py")
    needles = call_needles(st.function)  # `corrected.compute(`, or `result(corrected.compute)` (computed elsewhere)
    calls = [c for c in nb.cells if c.cell_type == "code" and any(n in c.source for n in needles)]
    assert len(calls) >= 1, (st.notebook, needles)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i}"
    path = tmp_path / f"{st.notebook}.ipynb"
    nbformat.write(nb, path)
    anchor = cell_anchor(path, *needles)
    assert anchor == f"cell-id={calls[0]['id']}"


def test_statistic_names_are_unique():
    assert len({s.name for s in S.ALL}) == len(S.ALL) and len(S.BY_KEY) == len(S.ALL)


def _tables(reports: Path) -> None:
    tables = reports / "t2i" / "tables"
    tables.mkdir(parents=True)
    per_prompt(("a", "b", "c")).assign(model="gen-x").to_csv(tables / "tvd_per_prompt.csv", index=False)
    # made-up numbers: the corrected TVD (tvd_point, honest interval) differs from the other three
    pd.DataFrame([{"model": "gen-x", "category": "all", "n_prompts": 15, "mean_tvd": 0.300, "mean_tvd_low": 0.200,
                   "mean_tvd_high": 0.400, "tvd_corrected": 0.212, "tvd_corrected_low": 0.100,
                   "tvd_corrected_high": 0.350}]).to_csv(tables / "tvd_summary.csv", index=False)
    pd.DataFrame([{"model": "gen-x", "category": "all", "n_prompts": 15, "mean_tvd_raw": 0.300, "tvd_debiased": 0.140,
                   "tvd_debiased_low": 0.000, "tvd_debiased_high": 0.357, "identifiable": True, "tvd_point": 0.140,
                   "tvd_point_source": "corrected", "tvd_classifier_corrected": 0.213,
                   "tvd_classifier_corrected_low": 0.120, "tvd_classifier_corrected_high": 0.330}]
                 ).to_csv(tables / "tvd_corrected_summary.csv", index=False)


def test_front_page_tvd_page_and_cards_show_one_corrected_tvd_under_one_name(tmp_path):
    reports = tmp_path / "reports"
    _tables(reports)
    t2i = Outputs.load(reports / "t2i")
    headline = front.tvd_headline(t2i, "95%")
    assert "corrected TVD" in headline and "gen-x 0.140 [0.000, 0.357]" in headline
    block = front.tvd_block(t2i, reports, "95%")
    # each statistic on the page is credited to the function that computed it
    credits = {name: function for name, function, _, _ in block.credits}
    assert credits == {"raw TVD": "biasaudit.t2i.analysis.representation.compute",
                       "corrected TVD": "biasaudit.t2i.analysis.corrected.compute"}
    assert "corrected TVD 0.140 [0.000, 0.357]" in block.html
    out = tmp_path / "audit"
    ac.build_cards(reports, tmp_path / "none", ac.Resampling(100, 0.95, "percentile", 1),
                   ac.Resampling(100, 0.95, "percentile", 1), {}, stand_in=True, out_dir=out)
    index = (out / "index.html").read_text()
    # the index shows the front page's number under the front page's name, and no retired name
    assert "corrected TVD [honest interval" in index and "<td>0.140 [0.000, 0.357]</td>" in index
    for old in ("bias-corrected TVD", "classifier-corrected TVD [CI]"):
        assert old not in index
    card = (out / "gen-x.html").read_text()
    rows = dict(re.findall(r"<tr><td>([^<]+)</td><td>15</td><td>([^<]+)</td>", card))
    assert rows == {"raw TVD": "0.300 [0.200, 0.400]", "finite-n-corrected TVD": "0.212 [0.100, 0.350]",
                    "classifier-corrected TVD (plug-in)": "0.213 [0.120, 0.330]",
                    "corrected TVD": "0.140 [0.000, 0.357]"}
    assert "95% honest interval" in card and "biasaudit.t2i.analysis.corrected.compute" in card
    csv = pd.read_csv(out / "gen-x.csv").set_index("measure")
    assert csv.loc["tvd_corrected", "interval"] == S.HONEST
