"""Our assumptions (data/reference/assumptions.csv, report/assumptions.py): every params key it names is a real key
of the validated params, ids are unique, every row has a reason and says what the paper says, the report stage
depends on the file and on each key, the page lists every row with this run's value, and the front page links it."""

import pandas as pd
import yaml
from markupsafe import escape

from biasaudit.config import load_params
from biasaudit.params import Params
from biasaudit.report import build_index
from biasaudit.report.assumptions import (
    ASSUMPTIONS_CSV,
    ASSUMPTIONS_PAGE,
    COLUMNS,
    build_assumptions,
    load_assumptions,
    lookup,
    shown,
)

from .conftest import ROOT

TABLE = pd.read_csv(ROOT / ASSUMPTIONS_CSV, dtype=str, keep_default_na=False)
KEYS = [k for k in dict.fromkeys(TABLE["params_key"]) if k]


def _keys(d, prefix=""):
    """Every dotted key of a nested mapping (leaves and the mappings above them)."""
    out = set()
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.add(key)
        if isinstance(v, dict):
            out |= _keys(v, key + ".")
    return out


def test_columns_ids_and_reasons():
    assert tuple(TABLE.columns) == COLUMNS
    assert not TABLE["id"].duplicated().any(), sorted(TABLE.loc[TABLE["id"].duplicated(), "id"])
    for col in ("choice", "value", "reason", "seed_says"):
        empty = TABLE.loc[TABLE[col].str.strip() == "", "id"].tolist()
        assert not empty, f"rows without {col}: {empty}"
    assert set(TABLE["method"]) <= {"A", "B", "both"}
    load_assumptions(ROOT / ASSUMPTIONS_CSV)  # the reader's own checks agree


def test_every_params_key_is_a_key_of_the_validated_params():
    real = _keys(load_params(ROOT / "params.yaml").model_dump())
    missing = [k for k in KEYS if k not in real]
    assert not missing, f"not keys of the validated params: {missing}"


def test_the_choices_the_brief_names_are_listed():
    for key in ("prompts.templates", "prompts.style_suffix", "benchmarks.hispanic_assumption", "prompts.size_weight",
                "prompts.min_size", "classify.instruction", "faces.skin_method", "analyze.n_boot",
                "analyze.n_permutations", "reflect_analysis.min_clusters", "reflect.salary_min", "reflect.salary_max",
                "counterfactuals.model_id", "sources.occupations", "vlms", "classify.vlm.model_id"):
        assert key in KEYS, key
    text = " ".join(TABLE["value"])
    for word in ("DeepSeek-VL2", "teacher", "gemini-2.5-flash-image", "within-prompt", "L* bins", "0.8"):
        assert word in text or word in " ".join(TABLE["choice"]), word


def test_the_report_stage_depends_on_the_file_and_on_every_key_params_yaml_holds():
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    assert ASSUMPTIONS_CSV.as_posix() in [str(d).split()[0] for d in stage["deps"]]
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = stage["params"]
    for key in KEYS:
        try:
            lookup(raw, key)
        except KeyError:
            continue  # a code default, not in params.yaml: it changes only with the code (a dep)
        assert any(p == key or key.startswith(p + ".") for p in params), f"report stage lacks the param {key}"


def test_the_page_lists_every_row_with_this_runs_value(tmp_path):
    cfg = Params(profile="paper", prompts={"size_weight": 0.25})
    dump = cfg.model_dump()
    table = build_assumptions(tmp_path / "reports", dump, cfg.profile, cfg.stand_ins(), root=ROOT)
    page = (tmp_path / "reports/pages" / ASSUMPTIONS_PAGE).read_text()
    assert len(table) == len(TABLE) and page.count('<tr id="') == len(TABLE)
    for r in table.to_dict("records"):
        assert f'<tr id="{r["id"]}">' in page
        if r["params_key"]:
            assert r["this_run"] == shown(lookup(dump, r["params_key"]))
            assert str(escape(r["this_run"])) in page, r["id"]
    row = table.set_index("params_key").loc["prompts.size_weight"]
    assert row["this_run"] == "0.25"  # the run's value, not the CSV's


def test_the_front_page_links_the_page(tmp_path):
    reports = tmp_path / "reports"
    index = build_index(reports, Params(profile="paper"), root=tmp_path).read_text()
    assert ASSUMPTIONS_PAGE not in index  # no page, no link
    build_assumptions(reports, Params().model_dump(), "offline", root=ROOT)
    index = build_index(reports, Params(profile="paper"), root=tmp_path).read_text()
    assert f'href="pages/{ASSUMPTIONS_PAGE}"' in index and 'id="assumptions"' in index
    assert f"{len(TABLE)} choices the papers leave open" in index
    assert (reports / "pages" / ASSUMPTIONS_PAGE).exists()  # kept: build_index removes only pages it did not write
