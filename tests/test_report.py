"""The offline report built from a SYNTHETIC fixture tree: the front page's tables and findings from
column specs (hand-written numbers, so the expected text comes from the fixture, not the code), no-data
notes for missing inputs, the headline metrics, the image and FOCUS pages, JSON as tables, the stage
runner (quiet terminal, figures in the notebook, the cause first), and a headless Chromium check of all
three pages (Debian `chromium`; skipped when missing)."""

import html
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.contracts import ANALYSIS_TABLES, GROUPS, IMAGES_DIR, PROMPTS_CSV, ContractError
from biasaudit.params import Params
from biasaudit.pipeline.outputs import Figure, OutputWriter, Result
from biasaudit.report import build_index
from biasaudit.report.audit_card import Resampling, build_cards
from biasaudit.report.execute import first_line, parse_parameters
from biasaudit.report.gallery import build_gallery
from biasaudit.report.headline import count, headline_metrics
from biasaudit.report.html import json_tables
from biasaudit.report.load import CONTRACT_BROKEN, Outputs
from biasaudit.t2i.analysis import homogeneity, provenance, reliability, representation, skin
from biasaudit.t2i.analysis.inputs import PLOTS, load_inputs

from .browser import chromium, visit
from .fixtures_t2i import MODELS, analysis_config, write_tree

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]

# The numbers the other stages would write (column specs of the analysis outputs), made up here.
TVD = {  # model → (mean_tvd, low, high, null_floor, corrected, corrected_low, corrected_high) for category "all"
    "synth-a": (0.500, 0.400, 0.600, 0.100, 0.420, 0.300, 0.500),
    "synth-b": (0.300, 0.200, 0.350, 0.120, 0.190, 0.100, 0.260),
}


def _analysis(root: Path, stand_in: bool = True) -> None:
    cfg = analysis_config(n_boot=100)
    inputs = load_inputs(root, groups=GROUPS)
    writer = OutputWriter(root / "reports/t2i", dpi=50)
    writer.add(representation.compute(inputs, cfg))
    writer.add(skin.compute(inputs, cfg))
    writer.add(homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=20, min_group_size=5)))
    writer.add(reliability.compute(inputs, cfg))
    writer.add(provenance.compute(inputs, cfg))
    # the later analyses (other stages' column specs), written through the same writer
    tvd = pd.read_csv(root / "reports/t2i/tables/tvd_summary.csv")
    for model, (est, lo, hi, floor, cor, clo, chi) in TVD.items():
        sel = (tvd["model"] == model) & (tvd["category"] == "all")
        tvd.loc[sel, ["mean_tvd", "mean_tvd_low", "mean_tvd_high"]] = [est, lo, hi]
        tvd.loc[sel, ["null_floor", "tvd_corrected", "tvd_corrected_low", "tvd_corrected_high"]] = [floor, cor, clo, chi]
    paired = pd.DataFrame({"model_a": ["synth-a", "synth-a"], "model_b": ["synth-b", "synth-b"],
                           "category": ["all", "surname"], "diff": [0.2, 0.05], "low": [0.1, -0.1],
                           "high": [0.3, 0.2], "p_value": [0.004, 0.4], "p_adjusted": [0.008, 0.4]})
    validation = pd.DataFrame({"model": ["synth-a", "synth-a"], "quantity": ["tvd", "L_slope"],
                               "category_or_group": ["all", "black"], "planted": [0.5, 0.4],
                               "estimate": [0.48, 0.9], "low": [0.4, 0.7], "high": [0.6, 1.1],
                               "covered": [True, False], "note": ["", "planted outside"]})
    face_loss = pd.DataFrame({"model": ["synth-a"] * 2, "by": ["label"] * 2, "group": ["black", "white"],
                              "n_images": [10, 10], "no_face_rate": [0.3, 0.1], "low": [0.1, 0.0], "high": [0.6, 0.4],
                              "threshold": [0.2, 0.2], "flagged": [True, False]})
    calibration = pd.DataFrame({"method": ["cluster bootstrap", "sign-flip"], "kind": ["coverage", "rejection"],
                                "setting": ["n=20", "n=8"], "scale": ["paper", "paper"], "nominal": [0.95, 0.05],
                                "observed": [0.948, 0.10], "mc_se": [0.007, 0.009], "flag": ["ok", "anti-conservative"]})
    writer.add(Result("representation_more", "More", tables={"tvd_summary": tvd, "tvd_paired": paired}))
    writer.add(Result("validation", "Validation", tables={"validation": validation}))
    writer.add(Result("face_loss", "Face loss", tables={"face_loss": face_loss}))
    writer.add(Result("calibration", "Calibration", tables={"calibration": calibration}))
    writer.finish(PLOTS, profile="offline", stand_in=stand_in)


def _vlm(reports: Path) -> None:
    import matplotlib.pyplot as plt

    out = OutputWriter(reports / "vlm", dpi=50)
    gaps = pd.DataFrame({"dimension": ["race", "race"], "level": ["Black", "Asian"], "measure": ["mcq_salary"] * 2,
                         "delta_pct": [-12.5, 3.0], "low": [-20.0, -4.0], "high": [-5.0, 9.0], "p_value": [0.005, 0.6],
                         "p_adjusted": [0.01, 0.6], "vlm": ["synthvlm"] * 2})
    rates = pd.DataFrame({"gender": ["man", "man"], "race": ["Black", "White"], "wins": [3, 9], "n": [12, 12],
                          "rate": [0.25, 0.75], "low": [0.1, 0.5], "high": [0.5, 0.9], "vlm": ["synthvlm"] * 2})
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.bar(["a", "b"], [1, 2])
    res = Result("synthvlm_mcq", "synthvlm: MCQ", tables={"synthvlm_delta_g": gaps, "synthvlm_race_winrate_income": rates})
    res.figures["synthvlm_gaps"] = Figure(fig, "Δg by group", "synthetic")
    out.add(res)
    out.finish()
    (reports / "vlm/summary.json").write_text(json.dumps({"synthetic": True, "vlms": {"synthvlm": {
        "status_counts": {"2afc/ok": 12, "mcq/ok": 8}, "retained": {"2afc": 12, "mcq": 8},
        "race_win_rates": {"income": {"man": {"Black": 0.25, "White": 0.75}}}}}}))


def _images(root: Path) -> None:
    """Image files for the manifests, and one FOCUS source photo with its 10 edits and their checks."""
    rng = np.random.default_rng(3)
    for model in MODELS:
        man = pd.read_parquet(root / f"data/t2i/images/{model}/manifest.parquet")
        for p in man["path"]:
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(root / p)
    src = root / "data/vlm/sources/doctor/p0.png"
    src.parent.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (80, 60, 3), dtype=np.uint8)).save(src)
    rows = []
    for race in ("Asian", "Black", "Latino", "MiddleEastern", "White"):
        for gender in ("man", "woman"):
            path = root / f"data/vlm/focus/doctor/p0/{race}_{gender}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (80, 60, 3), dtype=np.uint8)).save(path)
            failed = "ssim_outside" if (race, gender) == ("Black", "woman") else ""
            rows.append({"edit_id": f"doctor/p0/{race}_{gender}", "occupation": "doctor", "base_id": "p0", "race": race,
                         "gender": gender, "path": path.relative_to(root).as_posix(),
                         "source_path": src.relative_to(root).as_posix(), "status": "ok", "reason": "",
                         "ssim_outside": 0.8 if failed else 0.97, "delta_e_outside": 1.0, "identity_distance": 0.3,
                         "race_pred": race, "gender_pred": gender, "target_race_ok": True, "target_gender_ok": True,
                         "failed_checks": failed, "passed": not failed})
    pd.DataFrame(rows).to_parquet(root / "data/vlm/edit_checks.parquet", index=False)


def _notebook(reports: Path) -> None:
    """An executed notebook whose cell calls representation.compute (the trail's anchor target)."""
    import nbformat

    from biasaudit.report.trail import export_all

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# analysis"), nbformat.v4.new_code_cell("show(representation.compute(data, cfg), writer)")]
    nb.metadata["biasaudit"] = {"stage": "analyze", "wall_s": 12.5, "status": "ok", "reason": ""}  # an older runner's
    (reports / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, reports / "notebooks/t2i_analyze.ipynb")
    export_all(reports / "notebooks", reports / "html")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = write_tree(tmp_path_factory.mktemp("report"))
    _analysis(root)
    _vlm(root / "reports")
    _images(root)
    _notebook(root / "reports")
    for name in ("dvc.yaml", "params.yaml"):
        (root / name).write_text((ROOT / name).read_text())
    gallery = build_gallery(root, root / "reports", images_dir=IMAGES_DIR, prompts_file=PROMPTS_CSV, px=96, per_prompt=4,
                            stand_in=True)
    boot = Resampling(n_boot=100, level=0.95, method="percentile", seed=1)  # the audit cards, as the report stage
    build_cards(root / "reports", root / "data" / "vlm" / "responses", boot, boot, {"salary_salary": None}, stand_in=True,
                out_dir=root / "reports" / "audit")
    return build_index(root / "reports", Params(profile="offline"), title="synthetic report", max_table_rows=10,
                       root=root, gallery=gallery)


def _pages(index: Path) -> dict[str, str]:
    """The front page and every page it links under reports/pages/, by name."""
    return {"index": index.read_text(), **{p.stem: p.read_text() for p in sorted((index.parent / "pages").glob("*.html"))}}


def _findings(page: str) -> list[str]:
    block = page.split('id="findings"', 1)[1].split("</ul>", 1)[0]
    return [html.unescape(re.sub(r"<[^>]+>", "", x)).strip() for x in block.split("<li>")[1:]]


@pytest.mark.slow
def test_front_page_tables_and_findings_come_from_the_numbers(built):
    pages = _pages(built)
    page, every = pages["index"], "".join(pages.values())
    assert "STAND-IN RUN" in page and "describe no real model" in page
    # the front page: at most 6 findings, the first led by the TVD (raw here: the fixture has no reliability sample)
    findings = _findings(page)
    assert 3 <= len(findings) <= 6, findings
    assert findings[0] == ("Distance from the benchmark over all prompts (raw TVD: mean per-prompt TVD, 95% "
                           "cluster-bootstrap CI over prompts): synth-a 0.500 [0.400, 0.600]; synth-b 0.300 [0.200, 0.350]. Raw, because "
                           "no reliability sample to correct with.")
    # no table on the front page: one line per block, linking to its page
    assert "<table" not in page
    for name in ("tvd", "paired", "skin", "homogeneity", "kappa", "winrates", "delta_g", "significant", "validation",
                 "validation_b", "instruments", "calibration", "notebooks"):
        assert f'href="pages/{name}.html"' in page and name in pages, name
    # TVD with its CI and the null floor, as the fixture wrote them, on the TVD page
    assert "0.500 [0.400, 0.600]<br><small>null floor 0.100</small>" in pages["tvd"]
    assert "95% cluster-bootstrap CI over prompts" in pages["tvd"]
    # paired difference: the significant one becomes a sentence, the other does not
    assert "synth-a is farther from the benchmark than synth-b on all prompts: difference in raw TVD 0.200 " \
           "[0.100, 0.300], p after adjustment 0.008" in pages["paired"]
    assert "on surname prompts" not in every
    # Method B: Δg with CI, significance after adjustment, win rates with their CIs
    assert "-12.5 [-20.0, -5.0] *" in pages["delta_g"]
    assert "1 of 2 Δg effects are significant after adjustment; the largest is race:Black on mcq_salary " \
           "(synthvlm): -12.5 [-20.0, -5.0]% (95% CI)." in findings
    assert "from 0.25 [0.10, 0.50] (Black man) to 0.75 [0.50, 0.90] (White man)" in pages["winrates"]
    # planted effects, instrument bias (the flag threshold stated), calibration
    assert "recovers 1 of 2 planted quantities" in page and "missed (how many rows): L_slope (1)" in pages["validation"]
    assert "Face loss is highest for black (synth-a, 0.300 [0.100, 0.600]) and lowest for white (synth-a, " \
           "0.100 [0.000, 0.400])" in pages["instruments"] and "flagged above 0.20" in pages["instruments"]
    assert "Calibration by simulation: 1 of 2 paper-scale intervals and tests are within their band" in page
    # homogeneity: the within-prompt gap leads (front page line and its page), the paper's gap beside it, labelled
    line = page.split('href="pages/homogeneity.html"', 1)[1].split("</li>", 1)[0]
    # the verdict is the localising test's (#45): a group is named only when it is flagged
    assert "localising homogeneity test" in line and "significant after adjustment" not in line
    assert "unstratified gap" in pages["homogeneity"]
    assert "within-prompt gap [95% prompt-cluster bootstrap CI]" in \
        pages["homogeneity"] and "paper (unstratified): the paper's gap over all pairs, shown for replication" in \
        pages["homogeneity"]
    assert "1 row is labelled" in pages["calibration"]
    # the trail: function names and a link to the cell that called them
    assert "biasaudit.t2i.analysis.representation.compute" in pages["tvd"]
    assert 'href="html/t2i_analyze.html#cell-id=' in pages["tvd"] and '<base href="../">' in pages["tvd"]
    # no wall time on the page (it lives in reports/runs/, so a re-run of unchanged code changes no output)
    assert "12.5 s" not in pages["notebooks"] and "reports/runs/" in pages["notebooks"]
    assert "running</span> (writing this report)" in pages["notebooks"]  # the report stage is not "not run"
    assert "t2i/images/planted-a" in pages["notebooks"]  # ${generate.images_dir}/${key} from params.yaml
    assert "tvd_summary.csv" in pages["tvd"] and " download>" in pages["tvd"]
    # nothing unresolved, no broken contract, nothing from the network
    assert "${" not in every and CONTRACT_BROKEN not in every
    assert "http://" not in every and "https://" not in every


@pytest.mark.slow
def test_each_statistic_has_one_interval_wherever_it_appears(built):
    """Every raw TVD of tvd_summary is printed with its own interval on every page about the TVD (the
    corrected-TVD table carries the raw estimate without a second interval of its own)."""
    tvd = pd.read_csv(built.parent / "t2i/tables/tvd_summary.csv")
    pages = _pages(built)
    every = _findings(pages["index"])[0] + "".join(pages[n] for n in ("tvd", "paired", "validation"))
    for r in tvd.dropna(subset=["mean_tvd"]).itertuples():
        want = f"{r.mean_tvd:.3f} [{r.mean_tvd_low:.3f}, {r.mean_tvd_high:.3f}]"
        seen = set(re.findall(re.escape(f"{r.mean_tvd:.3f}") + r" \[[-0-9.]+, [-0-9.]+\]", every))
        assert seen <= {want}, (r.model, r.category, seen)


@pytest.mark.slow
def test_units_thresholds_and_interval_types_are_labelled(built):
    pages = _pages(built)
    assert "(L* &lt; 40)" in pages["skin"] or "very dark" not in pages["skin"]  # the threshold of skin_dark_share
    for name in ("tvd", "paired", "winrates", "delta_g", "validation", "instruments"):
        assert "95%" in pages[name], name  # every interval names its level and kind
    cal = pd.read_csv(built.parent / "t2i/tables/calibration.csv")
    assert "nominal level" in pages["calibration"] and len(cal) == 2
    # an empty section (ok, no figure, no table) gets no page and no line of its own
    manifest = json.loads((built.parent / "t2i/manifest.json").read_text())
    for s in manifest["sections"]:
        if s["status"] == "ok" and not s["figures"] and not s["tables"]:
            assert f"a-{s['name']}" not in pages and f'pages/a-{s["name"]}.html' not in pages["index"]


def _paper() -> Params:
    """The paper profile's parameters (real models everywhere: no stand-in part)."""
    from biasaudit.cli import profile_params

    return profile_params("paper", ROOT / "params.yaml")


def test_missing_inputs_render_as_no_data(tmp_path):
    pages = _pages(build_index(tmp_path, _paper(), root=tmp_path))
    every = "".join(pages.values())
    assert "STAND-IN" not in every
    for reason in ("reports/t2i/manifest.json not found", "reports/vlm/manifest.json not found"):
        assert reason in pages["index"], reason
    assert "manifest.json not found (the stage has not run)" in pages["calibration"]
    assert "manifest.json not found (the stage has not run)" in pages["instruments"]


def test_a_missing_column_fails_instead_of_being_guessed(tmp_path):
    t2i = tmp_path / "t2i"
    (t2i / "tables").mkdir(parents=True)
    (t2i / "manifest.json").write_text(json.dumps({"sections": []}))
    pd.DataFrame({"model": ["m"], "category": ["all"], "n_prompts": [3], "mean_tvd": [0.4], "mean_tvd_low": [0.3],
                  "mean_tvd_high": [0.5]}).to_csv(t2i / "tables/tvd_summary.csv", index=False)
    pd.DataFrame({"model_a": ["m"], "model_b": ["n"], "category": ["all"], "difference": [0.1]}).to_csv(
        t2i / "tables/tvd_paired.csv", index=False)
    pages = _pages(build_index(tmp_path, Params(profile="paper"), root=tmp_path))
    assert "0.400 [0.300, 0.500]" in pages["tvd"]  # optional columns (null floor) may be absent
    assert f"{CONTRACT_BROKEN}: tvd_paired.csv lacks column(s) diff, low, high, p_value, p_adjusted" in pages["paired"]
    # the writer refuses such a table in the first place
    with pytest.raises(ContractError, match="tvd_paired lacks column"):
        OutputWriter(tmp_path / "out" / "t2i").add(Result("x", "x", tables={"tvd_paired": pd.read_csv(
            t2i / "tables/tvd_paired.csv")}))


def test_every_column_the_report_reads_is_declared():
    """The report reads tables only through Outputs.table / tables_of, which keep only the declared
    columns; statically too, every string key the report reads is a declared column or one it wrote itself."""
    import ast

    declared = {c for t in ANALYSIS_TABLES for c in (*t.columns, *t.optional)}
    for name in ("front.py", "headline.py"):
        tree = ast.parse((ROOT / "src/biasaudit/report" / name).read_text())
        keys = [(n.slice.value, type(n.ctx)) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
                and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)]
        written = {k for k, ctx in keys if ctx is ast.Store}
        read = {k for k, ctx in keys if ctx is ast.Load}
        assert read <= declared | written, (name, read - declared - written)


@pytest.mark.slow
def test_headline_metrics_are_few_and_exact(built):
    m = headline_metrics(built.parent)
    assert count(m) <= 25
    assert m["tvd"] == {"synth-a": 0.5, "synth-b": 0.3} and m["tvd_corrected"] == {"synth-a": 0.42, "synth-b": 0.19}
    assert m["dg_max"] == {"synthvlm": 12.5} and m["planted_covered"] == 0.5
    assert "n_sig" not in m  # no sign-flip/OLS table in the fixture: absent, not 0


def test_headline_gap_is_the_within_prompt_gap_with_the_papers_beside_it(tmp_path):
    """wp_gap_max is the largest |within-prompt gap| (CLIP space) per model, paper_gap_max the largest
    |paper's unstratified gap|, read from different columns (here they peak at different groups)."""
    tables = tmp_path / "t2i" / "tables"
    tables.mkdir(parents=True)
    (tmp_path / "t2i" / "manifest.json").write_text(json.dumps({"sections": []}))
    pd.DataFrame({"model": ["m"] * 4, "space": ["clip", "clip", "face", "face"],
                  "group": ["black", "white", "black", "white"],
                  "wp_gap": [0.02, -0.03, 0.5, 0.5], "wp_gap_lo": [0.0, -0.05, 0.4, 0.4], "wp_gap_hi": [0.04, -0.01, 0.6, 0.6],
                  "gap": [0.11, 0.01, 0.9, 0.9], "gap_lo": [0.09, 0.0, 0.8, 0.8], "gap_hi": [0.13, 0.02, 1.0, 1.0]}
                 ).to_csv(tables / "homogeneity_by_race.csv", index=False)
    m = headline_metrics(tmp_path)
    assert m["wp_gap_max"] == {"m": 0.03} and m["paper_gap_max"] == {"m": 0.11}
    assert "gap_max" not in m


def test_homogeneity_line_leads_with_the_within_prompt_gap_and_the_papers_beside_it():
    """The front page's homogeneity line names the largest |within-prompt gap| (significant ones first)
    and the paper's unstratified gap of the same group beside it, labelled replication."""
    from biasaudit.report.front import homogeneity_findings

    df = pd.DataFrame({"model": ["m", "m"], "space": ["clip", "clip"], "group": ["black", "white"],
                       "wp_gap": [0.01, -0.03], "wp_gap_lo": [0.0, -0.05], "wp_gap_hi": [0.02, -0.01],
                       "gap": [0.11, 0.002], "p_adjusted": [0.5, 0.9]})
    line = homogeneity_findings(df, "p_adjusted")[0]
    assert line == ("No within-prompt homogeneity gap is significant after adjustment (2 gaps); the largest: white in "
                    "m (clip embeddings), within-prompt gap -0.030 [-0.050, -0.010] (95% prompt-cluster bootstrap "
                    "CI); beside it the paper's unstratified gap (replication) 0.002.")
    line = homogeneity_findings(df.assign(p_adjusted=[0.01, 0.9]), "p_adjusted")[0]
    assert line.startswith("1 of 2 within-prompt homogeneity gaps are significant after adjustment; the largest: "
                           "black in m (clip embeddings), within-prompt gap 0.010 [0.000, 0.020] (95% prompt-cluster "
                           "bootstrap CI); beside it the paper's unstratified gap (replication) 0.110")


def test_homogeneity_line_and_table_mark_a_gap_that_rests_on_few_prompts(tmp_path):
    """A row flagged few_prompts (pairs in fewer than MIN_PROMPTS_CI prompts) is marked † in the table, with
    the note, and the headline line says its interval under-covers; unflagged tables carry no note."""
    from biasaudit.contracts import MIN_PROMPTS_CI
    from biasaudit.report.front import homogeneity_block, homogeneity_findings

    df = pd.DataFrame({"model": ["m", "m"], "space": ["clip", "clip"], "group": ["black", "other"],
                       "wp_gap": [0.01, 0.2], "wp_gap_lo": [0.0, 0.1], "wp_gap_hi": [0.02, 0.3], "gap": [0.11, 0.3],
                       "p_adjusted": [0.5, 0.01], "n_prompts": [40, 3], "few_prompts": [False, True]})
    line = homogeneity_findings(df, "p_adjusted")[0]
    assert (f"0.200 [0.100, 0.300] (95% prompt-cluster bootstrap CI; pairs in only 3 prompts, so that interval "
            f"under-covers (fewer than {MIN_PROMPTS_CI})); beside it the paper's unstratified gap") in line
    assert "under-covers" not in homogeneity_findings(df.assign(few_prompts=False), "p_adjusted")[0]
    one = df.assign(n_prompts=[40, 1], wp_gap_lo=[0.0, np.nan], wp_gap_hi=[0.02, np.nan])
    assert "CI; pairs in only 1 prompt, so no interval); beside it" in homogeneity_findings(one, "p_adjusted")[0]
    t2i = tmp_path / "t2i"
    (t2i / "tables").mkdir(parents=True)
    (t2i / "manifest.json").write_text(json.dumps({"sections": []}))
    for flags, marked in (([False, True], True), ([False, False], False)):
        df.assign(few_prompts=flags, gap_lo=0.0, gap_hi=0.5).to_csv(t2i / "tables" / "homogeneity_by_race.csv",
                                                                    index=False)
        b = homogeneity_block(Outputs.load(t2i), tmp_path, "95%", ("black", "other"))
        assert ("0.200 [0.100, 0.300] †" in b.html) == marked and ("†: the group has pairs in fewer than" in b.html) == marked
        assert "0.010 [0.000, 0.020] · exploratory p=" in b.html


def test_homogeneity_line_says_when_no_gap_could_reach_alpha():
    """With 199 permutations the smallest p is 1/200 = 0.005; Holm over 20 gaps multiplies the smallest by 20, so
    0.1 is the best an adjusted p can be: the page says so instead of only 'not significant'."""
    from biasaudit.report.front import homogeneity_findings

    base = pd.DataFrame({"model": "m", "space": "clip", "group": [f"g{i}" for i in range(20)], "wp_gap": 0.02,
                         "wp_gap_lo": 0.01, "wp_gap_hi": 0.03, "gap": 0.02, "p_value": [0.005] * 2 + [0.5] * 18,
                         "p_adjusted": [0.1] * 2 + [1.0] * 18})
    line = homogeneity_findings(base, "p_adjusted")[0]
    assert "none can fall below 0.1" in line and "no gap can reach" in line
    few = base.iloc[:5].assign(p_adjusted=[0.025, 0.025, 1, 1, 1])  # 5 × 0.005 = 0.025 < α: significant ones exist
    assert "no gap can reach" not in homogeneity_findings(few, "p_adjusted")[0]
    assert "no gap can reach" not in homogeneity_findings(base.iloc[:5].assign(p_adjusted=1.0), "p_adjusted")[0]


def test_calibration_line_counts_rows_below_the_band_and_reads_the_grid_row(tmp_path):
    """The front page's calibration line: rows within their band, rows labelled, how many of those lie
    on the unsafe side (coverage < 0.93, null rejection > 0.07), and the corrected TVD's share of audits
    closer to the truth than raw over the random grid at paper scale, as the table holds them."""
    from biasaudit.report.front import calibration_block

    t2i = tmp_path / "t2i"
    (t2i / "tables").mkdir(parents=True)
    (t2i / "manifest.json").write_text(json.dumps({"sections": []}))
    grid = "debiased_tvd estimate closer to the true TVD than raw (random grid of 12, M vs consensus labels)"
    pd.DataFrame({"method": ["a CI", "b CI", "c test", "d test", grid, grid],
                  "kind": ["coverage", "coverage", "rejection", "rejection", "share", "share"],
                  "setting": ["s"] * 4 + ["50 prompts × 100 images", "5 prompts × 12 images"],
                  "scale": ["paper"] * 5 + ["small"], "nominal": [0.95, 0.95, 0.05, 0.05, np.nan, np.nan],
                  "observed": [0.944, 0.90, 0.02, 0.10, 0.716, 0.584], "mc_se": [0.004, 0.01, 0.006, 0.01, 0.02, 0.02],
                  "flag": ["ok", "n < 50, skewed: under-covers", "conservative: FAILS at paper scale",
                           "over-rejects: FAILS at paper scale", "measured: beats raw", "measured: does not beat raw"],
                  "replications": [4000, 500, 500, 500, 500, 500], "mean_width": [0.019, 0.3, np.nan, np.nan, np.nan, np.nan]}
                 ).to_csv(t2i / "tables" / "calibration.csv", index=False)
    b = calibration_block(Outputs.load(t2i), tmp_path)
    line = b.summary
    assert line.startswith("Calibration by simulation: 1 of 4 paper-scale intervals and tests are within their band")
    assert "3 rows are labelled" in line and "2 of them below the band" in line
    assert ("(50 prompts × 100 images), the corrected TVD is closer to the truth than the raw TVD in 72% of 500 "
            "simulated audits; measured: beats raw.") in line and "58%" not in line  # paper scale only
    assert "mean interval width" in b.html and "0.019" in b.html


def test_json_summaries_become_tables():
    html = json_tables({"vlms": {"tiny": {"status_counts": {"2afc/ok": 3, "mcq/ok": 2},
                                          "delta_g": {"mcq": {"race:Asian": 0.0}, "salary": {"race:Asian": 1.5}}}}})
    assert html.count("<table") == 2 and "race:Asian" in html and "vlms.tiny" not in html


@pytest.mark.slow
def test_image_pages_and_thumbnails(built):
    reports = built.parent
    images = (reports / "images.html").read_text()
    assert images.count('<section class="group"') == len(MODELS) * 7  # model × prompt (fixtures_t2i.PROMPTS)
    assert images.count("<figure ") == len(MODELS) * 7 * 4  # per_prompt=4
    assert 'data-lbin="<40"' in images or 'data-lbin="&lt;40"' in images
    thumbs = sorted((reports / "thumbs").rglob("*.jpg"))
    assert len(thumbs) == len(MODELS) * 7 * 4 + 11  # + the FOCUS source and its 10 edits
    assert all(max(Image.open(p).size) <= 96 for p in thumbs)
    focus = (reports / "focus.html").read_text()
    assert focus.count("<img ") == 11 and "⚑ ssim_outside" in focus and focus.count("all checks passed") == 9
    again = build_gallery(reports.parent, reports, images_dir=IMAGES_DIR, prompts_file=PROMPTS_CSV, px=96,
                          per_prompt=4, stand_in=True)
    assert again.thumbs_made == 0  # made once


def test_runner_parses_papermill_flags():
    assert parse_parameters(["-p", "n", "3", "-p", "x", "0.5", "-r", "s", "3", "-y", "flag: true", "-p", "b", "True"]) == \
        {"n": 3, "x": 0.5, "s": "3", "flag": True, "b": True}
    with pytest.raises(SystemExit):
        parse_parameters(["--bogus"])
    assert first_line("ParamsError", "invalid parameters:\n  - analyze.n_boot: too small\n  - x: bad") == \
        "ParamsError: invalid parameters: analyze.n_boot: too small; x: bad"


def _run_notebook(tmp_path: Path, source: str, name: str) -> subprocess.CompletedProcess:
    nb = tmp_path / f"{name}.py"
    nb.write_text(textwrap.dedent(source))
    env = {**__import__("os").environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "biasaudit.report.execute", str(nb), name], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_runner_embeds_figures_and_keeps_the_terminal_quiet(tmp_path):
    proc = _run_notebook(tmp_path, """\
        # %%
        import matplotlib.pyplot as plt
        from IPython.display import display
        from tqdm.auto import tqdm
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        display(fig)
        plt.close(fig)
        for _ in tqdm(range(3)):
            pass
        """, "ok_nb")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0] == "▶ ok_nb" and lines[1].startswith("✓ ok_nb "), proc.stderr
    assert "TCP" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr + proc.stdout
    nb = json.loads((tmp_path / "reports/notebooks/ok_nb.ipynb").read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not [o for o in outputs if "<Figure size" in json.dumps(o) and "image/png" not in o.get("data", {})]
    text = json.dumps(outputs)
    assert "IProgress" not in text and "3/3" in text


@pytest.mark.slow
def test_a_failing_stage_prints_its_cause_first(tmp_path):
    proc = _run_notebook(tmp_path, """\
        # %%
        raise ValueError("generate.limit: must be >= 0 (got -1)")
        """, "bad_nb")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[1] == "✗ bad_nb: ValueError: generate.limit: must be >= 0 (got -1)", proc.stderr
    assert len(lines) == 3 and "Traceback" not in proc.stderr and "TCP" not in proc.stderr
    assert "KeyboardInterrupt" not in proc.stderr + proc.stdout
    nb = json.loads((tmp_path / "reports/notebooks/bad_nb.ipynb").read_text())
    assert any(o.get("output_type") == "error" for c in nb["cells"] for o in c.get("outputs", []))


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="Debian chromium not installed (apt-get install chromium; .ci/run does)")
def test_pages_in_headless_chromium(built, tmp_path):
    """The front page at 1400 px: under 6,000 px tall, never wider than the window, at least 3 figures
    shown without a click, no console error, no request outside file://; the pages it links likewise."""
    reports = built.parent
    svgs = sorted((reports / "t2i/figures").glob("homogeneity_gap_heatmap.svg"))
    linked = [reports / "pages" / f"{n}.html" for n in ("tvd", "skin", "validation", "calibration", "notebooks")]
    pages = visit([reports / "index.html", reports / "images.html", reports / "focus.html", *linked], width=1400,
                  screenshots=tmp_path, svgs=svgs)
    html_pages = pages[:3 + len(linked)]
    for page in html_pages:
        assert not page["errors"], (page["url"], page["errors"])
        assert not page["external"], (page["url"], page["external"])
        assert page["images"] or page is not pages[0], page["url"]
        assert all(ok for _, ok in page["images"]), (page["url"], page["images"])
        assert page["scroll_width"] <= page["client_width"], (page["url"], page["scroll_width"])  # no horizontal scroll
        assert (tmp_path / page["screenshot"]).stat().st_size > 1000
        for href in page["links"]:
            _check_link(href, page)
    index = pages[0]
    assert index["client_width"] == 1400 and index["height"] < 6000, index["height"]
    assert index["visible_figures"] >= 3, index["visible_figures"]  # open, not behind a click
    assert float(index["banner"].rstrip("px")) >= 28
    images = pages[1]
    assert images["filtered"] is not None and 0 < images["filtered"] < images["figures"]  # the label filter works
    # a section whose figures a filter hides goes with its heading (CSS must not override `hidden`)
    assert images["hidden_headings"] > 0 and images["empty_headings"] == 0, images
    for svg in pages[len(html_pages):]:  # figures: no two text boxes overlap
        assert svg["texts"] >= 5 and not svg["overlaps"], (svg["url"], svg["overlaps"])


def _check_link(href: str, page: dict) -> None:
    from urllib.parse import unquote, urlparse

    url = urlparse(href)
    assert url.scheme == "file", href
    target = Path(unquote(url.path))
    assert target.is_file() and target.stat().st_size > 0, href
    if url.fragment and target.suffix == ".html":
        text = target.read_text()
        assert f'id="{url.fragment}"' in text, href


@pytest.mark.slow
def test_the_analysis_notebook_holds_its_figures(tmp_path):
    """The real t2i_analyze notebook through scripts/run-notebook (MPLBACKEND=Agg outside): its PNGs
    are in the executed notebook, not `<Figure size …>` lines."""
    root = write_tree(tmp_path)
    for name in ("params.yaml", "dvc.yaml"):
        (root / name).write_text((ROOT / name).read_text())
    env = {**__import__("os").environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "biasaudit.report.execute", str(ROOT / "notebooks/t2i_analyze.py"),
                           "t2i_analyze"], cwd=root, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    nb = json.loads((root / "reports/notebooks/t2i_analyze.ipynb").read_text())
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 4
    assert not [o for o in outputs if "<Figure size" in json.dumps(o) and "image/png" not in o.get("data", {})]


def test_dvc_metrics_are_tracked_and_plots_render_offline():
    """The headline metrics file is in git (a baseline for `dvc metrics diff`), no analysis metric
    hides under the ignored reports/, and every dvc plot is an image (no Vega from a CDN)."""
    import yaml

    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    metrics = [next(iter(m)) for s in dvc["stages"].values() for m in s.get("do", s).get("metrics", [])]
    assert metrics == ["metrics/headline.json"]
    ignored = subprocess.run(["git", "check-ignore", "-q", "metrics/headline.json"], cwd=ROOT).returncode
    assert ignored == 1  # not ignored
    plots = [next(iter(p)) if isinstance(p, dict) else p for p in dvc.get("plots", [])]
    plots += [next(iter(p)) for s in dvc["stages"].values() for p in s.get("do", s).get("plots", [])]
    assert plots and all(p.endswith(".png") for p in plots)
    for stage in dvc["stages"].values():
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("do", stage).get("outs", [])]
        assert not [o for o in outs if o.startswith("reports/notebooks/") and o.endswith(".html")]


def test_tqdm_bars_are_echoed_live_to_a_terminal():
    import io

    from biasaudit.report.execute import BarEcho

    term = io.StringIO()
    echo = BarEcho(term, "  stage ")
    echo.write("loading weights\n")  # not a bar: not echoed
    assert term.getvalue() == ""
    echo.write("\r 40%|████      | 4/10 [00:01<00:02]\r 50%|█████     | 5/10 [00:01<00:01]")
    assert term.getvalue().startswith("\r  stage 50%|█████     | 5/10") and "40%" not in term.getvalue()
    echo.clear()
    assert term.getvalue().endswith("\r")


def test_stage_end_line_counts_items_by_status(tmp_path):
    from biasaudit.report.execute import format_counts, item_counts, stage_outs

    (tmp_path / "imgs").mkdir()
    pd.DataFrame({"status": ["ok"] * 3 + ["refused", "no_face"]}).to_parquet(tmp_path / "imgs/manifest.parquet")
    pd.DataFrame({"status": ["failed"]}).to_parquet(tmp_path / "labels.parquet")
    (tmp_path / "dvc.yaml").write_text("stages:\n  gen:\n    foreach: [a]\n    do:\n      cmd: x\n      outs:\n"
                                       f"        - {tmp_path}/imgs\n        - {tmp_path}/${{key}}.parquet:\n"
                                       "            cache: false\n")
    (tmp_path / "a.parquet").write_bytes((tmp_path / "labels.parquet").read_bytes())
    outs = stage_outs("gen@a", tmp_path / "dvc.yaml")
    assert outs == [f"{tmp_path}/imgs", f"{tmp_path}/a.parquet"]
    assert format_counts(item_counts(outs)) == " · ok 3 · failed 1 · refused 1 · no_face 1"
    assert format_counts({}) == ""


def test_table_contracts_match_by_output_folder():
    from biasaudit import contracts as C

    assert C.contract_of("planted_race_winrate_income", "vlm") is C.RACE_WINRATE
    assert C.RACE_WINRATE.parts("planted_race_winrate_income") == {"vlm": "planted", "task": "income"}
    assert C.DELTA_G.of("tiny") == "tiny_delta_g"
    assert C.contract_of("skin_earnings_ols", "t2i") is C.SKIN_EARNINGS_OLS  # a Method A table is no VLM's OLS
    C.check_table("tvd_summary", [], rows=0)  # a section's empty result passes
    with pytest.raises(ContractError, match="contracts.TVD_SUMMARY"):
        C.check_table("tvd_summary", ["model", "category"], rows=1)
