"""End to end: the offline pipeline in a fresh copy of the repository, run by DVC as `make demo` does.

Checks every expected artifact exists and is non-empty, that a second `dvc repro` does nothing, and
that changing an analysis-only parameter re-runs only `analyze` and `report`.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

# the first test runs the whole offline pipeline in its fixture (gender and clusters made it longer than 900 s on a
# loaded 2-core machine): the module gets the runner's own 2,400 s, not the suite's 900 s
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(2400)]

EXPECTED = [
    "data/t2i/benchmarks/occupation.parquet", "data/t2i/benchmarks/geography.parquet",
    "data/t2i/benchmarks/surname.parquet", "data/t2i/prompts.csv",
    "data/t2i/images/planted-a/manifest.parquet", "data/t2i/images/planted-b/manifest.parquet",
    "data/t2i/labels/planted-a.parquet", "data/t2i/labels/planted-b.parquet",
    "data/t2i/faces/planted-a.parquet", "data/t2i/embeddings/planted-a/clip.npy",
    "data/t2i/embeddings/planted-a/face.npy", "data/t2i/embeddings/planted-a/index.parquet",
    "reports/t2i/reliability/summary.json", "reports/t2i/metrics.json", "reports/t2i/manifest.json",
    "reports/t2i/tables/validation.csv", "reports/t2i/tables/face_loss.csv", "reports/t2i/tables/cross_detector.csv",
    "reports/t2i/instruments/sweep.csv", "reports/t2i/instruments/summary.csv",
    "reports/t2i/instruments/instruments.png",
    "data/vlm/edit_checks.parquet", "reports/vlm/summary.json", "reports/vlm/metrics.json",
    "reports/index.html", "reports/html/t2i_analyze.html", "reports/images.html", "reports/focus.html",
    "reports/audit/index.html", "reports/audit/all_models.csv", "reports/audit/planted-a.html",
    "reports/audit/planted-a.csv", "reports/audit/planted.html", "reports/audit/planted.csv",
    "metrics/headline.json",
]


def run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(cwd / "src"),  # the copy's code, not the editable install's
           "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def stages_run(output: str) -> set[str]:
    """The stages DVC ran, less `check` (it validates params.yaml: it runs whenever params.yaml changes)."""
    return set(re.findall(r"Running stage '([^']+)'", output)) - {"check"}


@pytest.fixture(scope="module")
def fresh_repo(tmp_path_factory) -> Path:
    """The working tree (tracked and new files, no outputs) in a new git repository."""
    dest = tmp_path_factory.mktemp("e2e") / "repo"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@example.org", "commit", "-qm", "e2e"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True)
    (dest / "dvc.lock").unlink(missing_ok=True)  # start from nothing, as a new clone would
    return dest


@pytest.fixture(scope="module")
def first_run(fresh_repo) -> str:
    return run(["dvc", "repro"], fresh_repo)


def test_every_artifact_exists_and_is_non_empty(fresh_repo, first_run):
    missing = [p for p in EXPECTED if not (fresh_repo / p).exists() or (fresh_repo / p).stat().st_size == 0]
    assert not missing, f"missing or empty: {missing}"
    html = (fresh_repo / "reports/index.html").read_text()
    assert "STAND-IN" in html.upper()
    import json

    validation = json.loads((fresh_repo / "reports/t2i/metrics.json").read_text())["validation"]
    assert validation["planted"] is True and validation["rows"] > 0


def test_the_demo_recovers_each_planted_gender_distortion_and_shows_the_gender_tvd(fresh_repo, first_run):
    """Each planted generator's gender distortion (params.yaml: planted-a women × 0.5, planted-b men × 0.6) inside
    its interval in the demo's validation table; the gender TVD on the front page and on the Method A card."""
    import pandas as pd

    table = pd.read_csv(fresh_repo / "reports/t2i/tables/validation.csv")
    rows = table[table["quantity"] == "gender_mean_deviation_woman"]
    for model in ("planted-a", "planted-b"):
        r = rows[(rows["model"] == model) & (rows["category_or_group"] == "gender/occupation")]
        assert len(r) == 1, (model, rows)
        r = r.iloc[0]
        assert r["low"] <= r["planted"] <= r["high"] and bool(r["covered"]), r.to_dict()
        assert (r["planted"] < 0) == (model == "planted-a")  # women under-produced by planted-a, over by planted-b
    front = (fresh_repo / "reports/index.html").read_text()
    assert "apparent-gender TVD from BLS" in front
    card = (fresh_repo / "reports/audit/planted-a.html").read_text()
    assert "apparent-gender TVD (occupations vs BLS share of women)" in card


def test_method_b_recovers_its_planted_effects_and_no_zero_se_row_is_significant(fresh_repo, first_run):
    import json

    import pandas as pd

    metrics = json.loads((fresh_repo / "reports/vlm/metrics.json").read_text())["planted_validation"]
    assert metrics["source_photos"] >= 12 and metrics["covered"] >= 0.9 * metrics["informative"] > 0
    table = pd.read_csv(fresh_repo / "reports/vlm/tables/planted_validation.csv")
    assert table.loc[table["informative"], "width"].notna().all()
    for path in (fresh_repo / "reports").rglob("*.csv"):
        df = pd.read_csv(path)
        se = next((c for c in ("se", "std_err") if c in df), None)
        if se is None:
            continue
        zero = pd.to_numeric(df[se], errors="coerce") == 0
        for p in (c for c in df.columns if c in ("p", "p_t", "p_wild", "p_value", "p_adjusted")):
            assert not (zero & (pd.to_numeric(df[p], errors="coerce") < 0.05)).any(), (path, p)


def test_executed_analysis_notebook_holds_its_figures(fresh_repo, first_run):
    import json

    nb = json.loads((fresh_repo / "reports/notebooks/t2i_analyze.ipynb").read_text())
    pngs = [o for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(pngs) >= 4


def test_no_output_names_the_folder_of_the_checkout(fresh_repo, first_run):
    """Tracked outputs must hash alike in every clone: a warning that prints a source path (as numpy's did from
    vlm/analysis/interaction.py) writes the checkout's folder into an executed notebook."""
    named = [str(p.relative_to(fresh_repo)) for d in ("reports/notebooks", "reports/html", "reports/t2i", "reports/vlm")
             for p in sorted((fresh_repo / d).rglob("*")) if p.is_file() and p.suffix in (".ipynb", ".html", ".json", ".csv")
             and str(fresh_repo) in p.read_text(errors="ignore")]
    assert named == []


def test_second_repro_does_nothing(fresh_repo, first_run):
    out = run(["dvc", "repro"], fresh_repo)
    assert not re.findall(r"Running stage '([^']+)'", out), out  # not even `check`


def test_analysis_parameter_reruns_only_analysis_and_report(fresh_repo, first_run):
    from ruamel.yaml import YAML

    params_path = fresh_repo / "params.yaml"
    rt = YAML()
    doc = rt.load(params_path.read_text())
    doc["analyze"]["n_boot"] += 1  # the bootstrap size: an analysis-only parameter
    with open(params_path, "w") as fh:
        rt.dump(doc, fh)
    out = run(["dvc", "repro"], fresh_repo)
    assert stages_run(out) == {"analyze", "report"}, out


def test_a_code_change_redoes_what_it_changes_and_a_comment_nothing(fresh_repo, first_run):
    """An L* + 10 edit of faces.colour.describe_rgb recomputes every L*; a comment-only edit recomputes
    nothing; a behaviour change in vlm/tasks.py re-parses the model's cached answers with 0 requests."""
    import json

    import pandas as pd

    log = fresh_repo / "data/t2i/.work/faces/planted-a/records.jsonl"
    faces = fresh_repo / "data/t2i/faces/planted-a.parquet"
    colour = fresh_repo / "src/biasaudit/faces/colour.py"
    original, L_before = colour.read_text(), pd.read_parquet(faces).set_index("image_id")["L"]
    lines = len(log.read_text().splitlines())
    colour.write_text(original + "\n# a comment only: the same code\n")
    run(["dvc", "repro", "-s", "faces@planted-a"], fresh_repo)
    assert len(log.read_text().splitlines()) == lines  # nothing recomputed
    colour.write_text(original.replace('"L": float(lab[0]),', '"L": float(lab[0]) + 10.0,'))
    run(["dvc", "repro", "-s", "faces@planted-a"], fresh_repo)
    L_after = pd.read_parquet(faces).set_index("image_id")["L"]
    measured = L_before.dropna().index
    assert len(measured) > 100 and ((L_after[measured] - L_before[measured] - 10).abs() < 1e-6).all()
    colour.write_text(original)
    tasks = fresh_repo / "src/biasaudit/vlm/tasks.py"
    source = tasks.read_text()
    run_json = fresh_repo / "data/vlm/responses/tiny.run.json"
    answers = pd.read_parquet(fresh_repo / "data/vlm/responses/tiny.parquet")
    uncached = int((answers["text"].fillna("") == "").sum())  # empty answers: the cache does not keep them
    tasks.write_text(source.replace('    out: dict[str, Any] = {"choice": None,', '    out: dict[str, Any] = {"choice": None, "reparsed": True,'))
    run(["dvc", "repro", "-s", "reflect@tiny"], fresh_repo)  # the real transformers path, behind its cache
    accounting = json.loads(run_json.read_text())["accounting"]
    # every kept answer from the cache: only those the cache refuses (an empty or cut-off answer) are asked again
    assert accounting["requests"] > 500 and accounting["calls"] == uncached
    assert accounting["cache_hits"] == accounting["requests"] - uncached
    tasks.write_text(source)
