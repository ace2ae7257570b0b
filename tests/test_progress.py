"""The terminal of a `dvc repro`: "k/N" on each stage line (the order DVC runs them), progress lines
in a log for a long per-item stage, and no warning the user cannot act on."""

from __future__ import annotations

import io
import json
import os

import pytest
import yaml

from biasaudit.pipeline.progress import plan_key, position, write_plan
from biasaudit.report.execute import BarEcho

from .conftest import ROOT
from .pipeline_copy import dvc, make_pipeline_copy


def _project(root, stages: dict[str, list[str]]) -> None:
    """A DVC project whose stages (in this yaml order) depend on each other's outputs and log, when
    they run, their name to order.txt (not an output)."""
    root.mkdir()
    spec = {name: {"cmd": f"echo {name} >> order.txt && echo {name} > {name}.out", "deps": [f"{d}.out" for d in deps],
                   "outs": [f"{name}.out"]} for name, deps in stages.items()}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": spec}, sort_keys=False))
    (root / "params.yaml").write_text("seed: 1\n")


@pytest.mark.slow
def test_the_plan_is_the_order_dvc_repro_runs(tmp_path):
    # yaml order is not the run order: DVC walks the graph
    root = tmp_path / "p"
    _project(root, {"report": ["analyze"], "gen_b": ["check"], "analyze": ["gen_a", "gen_b"], "check": [],
                    "gen_a": ["check"]})
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    assert dvc(root, env, "init", "--no-scm", "-q").returncode == 0
    plan = write_plan(root)
    done = dvc(root, env, "repro")
    assert done.returncode == 0, done.stderr
    assert plan == (root / "order.txt").read_text().split()
    assert position("check", root) == "1/5" and position("report", root) == "5/5" and position("nosuch", root) == ""
    # kept while dvc.yaml and params.yaml are unchanged; stale (no k/N rather than a wrong one) after
    before = (root / ".dvc/tmp/biasaudit-stage-plan.json").read_text()
    assert write_plan(root) == plan and (root / ".dvc/tmp/biasaudit-stage-plan.json").read_text() == before
    (root / "params.yaml").write_text("seed: 2\n")
    assert position("check", root) == ""
    assert json.loads(before)["key"] != plan_key(root)


@pytest.mark.slow
def test_a_stage_under_dvc_repro_makes_a_stale_plan_again(tmp_path):
    """`check` makes the plan when it runs, but it does not run when only dvc.yaml changed: a stage's
    own line (current_position, under `dvc repro`) then makes it again instead of losing its k/N."""
    import sys

    root = tmp_path / "p"
    _project(root, {"check": [], "gen": ["check"]})
    spec = yaml.safe_load((root / "dvc.yaml").read_text())
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    assert dvc(root, env, "init", "--no-scm", "-q").returncode == 0
    assert dvc(root, env, "repro").returncode == 0
    write_plan(root)
    spec["stages"]["gen"]["cmd"] = (f"{sys.executable} -c \"from biasaudit.pipeline.progress import current_position; "
                                    f"open('where.txt', 'w').write(current_position('gen'))\" && echo gen > gen.out")
    spec["stages"]["late"] = {"cmd": "echo late > late.out", "deps": ["gen.out"], "outs": ["late.out"]}
    (root / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert position("gen", root) == ""  # the plan is stale: dvc.yaml changed
    done = dvc(root, env, "repro")
    assert done.returncode == 0, done.stderr
    assert "Running stage 'check'" not in done.stdout and (root / "where.txt").read_text() == "2/3"


@pytest.mark.slow
def test_the_pipelines_plan_lists_every_stage_after_what_it_reads(tmp_path):
    root, env = make_pipeline_copy(tmp_path / "repo")
    plan = write_plan(root)
    listed = dvc(root, env, "stage", "list", "--name-only")
    assert sorted(plan) == sorted(listed.stdout.split()) and plan[0] == "check"
    assert position(plan[8], root) == f"9/{len(plan)}"


def test_no_stage_dependency_is_an_empty_file():
    """DVC warns "'…' is empty." for each empty dependency of each stage it checks (16 lines for the
    5 empty __init__.py files): nothing the user can act on, so no dependency may be empty."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    empty = set()
    for spec in stages.values():
        for dep in (spec.get("do", spec).get("deps") or []):
            path = ROOT / str(dep)
            files = [path] if path.is_file() else (sorted(path.rglob("*.py")) if path.is_dir() else [])
            empty |= {str(f.relative_to(ROOT)) for f in files if f.stat().st_size == 0}
    assert not empty, sorted(empty)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_log_gets_a_progress_line_at_most_every_interval():
    out, clock = io.StringIO(), Clock()
    echo = BarEcho(out, "  … 9/20 faces@planted-a ", live=False, every_s=30, clock=clock)
    for i in range(1, 181):  # tqdm's updates, one a second, 180 items
        clock.now = float(i)
        echo.write(f"\rfaces@planted-a: {100 * i // 180:3d}%|###   | {i}/180 [00:{i:02d}<00:10, 1.0item/s]")
    echo.write("no bar in this text\n")
    echo.clear()  # a log keeps its lines
    lines = out.getvalue().splitlines()
    assert len(lines) == 180 // 30  # at 30, 60, …, 180 s
    assert all(line.startswith("  … 9/20 faces@planted-a faces@planted-a:") for line in lines)
    assert "30/180" in lines[0] and "180/180" in lines[-1] and "\r" not in out.getvalue()


def test_a_terminal_gets_the_bar_live_on_the_stage_line():
    out, clock = io.StringIO(), Clock()
    echo = BarEcho(out, "▶ 9/20 faces@planted-a ", live=True, clock=clock)
    echo.write("\r 50%|#####     | 90/180")
    echo.write("\r100%|##########| 180/180")
    assert out.getvalue().count("\r") == 2 and "\n" not in out.getvalue()
    echo.clear()
    assert out.getvalue().endswith("\r")


# --- a clean tree after the demo: the same code gives the same output bytes ---------------------------

@pytest.mark.slow
def test_an_executed_notebook_is_the_same_bytes_in_every_run(tmp_path):
    """Two runs of one notebook (a progress bar whose clock and rate differ, a figure): the same
    .ipynb, so dvc.lock records the same hash; the wall time is in reports/runs/, outside it."""
    import subprocess
    import sys
    import textwrap

    nb = tmp_path / "bars.py"
    nb.write_text(textwrap.dedent("""\
        # %%
        import time
        import matplotlib.pyplot as plt
        from IPython.display import display
        from tqdm.auto import tqdm
        for _ in tqdm(range(3), desc="items", mininterval=0):
            time.sleep(0.2)
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        display(fig)
        print("done")
        """))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONPATH=str(ROOT / "src"))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "biasaudit.report.execute", str(nb), "bars"], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append((tmp_path / "reports/notebooks/bars.ipynb").read_bytes())
    assert runs[0] == runs[1]
    text = runs[0].decode()
    assert "3/3" in text and "it/s" not in text and "iopub" not in text and "wall_s" not in text
    ledger = json.loads((tmp_path / "reports/runs/bars.json").read_text())
    assert ledger["wall_s"] > 0.5 and ledger["status"] == "ok"


def _git(repo, *args):
    import subprocess

    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                   GIT_COMMITTER_EMAIL="t@t")).stdout.strip()


def test_provenance_names_the_code_commit_so_committing_the_lock_changes_no_output(tmp_path, monkeypatch):
    from datetime import datetime, timezone

    from biasaudit.pipeline import provenance
    _git(tmp_path, "init", "-q")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "code.py").write_text("x = 1\n")
    (tmp_path / "dvc.lock").write_text("a\n")
    _git(tmp_path, "add", "-A")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-01-02T03:04:05+00:00")
    _git(tmp_path, "commit", "-qm", "code")
    code = _git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "dvc.lock").write_text("b\n")  # the lock a run wrote, committed on its own
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2026-02-03T04:05:06+00:00")
    _git(tmp_path, "commit", "-qam", "lock")
    (tmp_path / "README.md").write_text("docs\n")  # and the docs after it
    _git(tmp_path, "add", "README.md")
    _git(tmp_path, "commit", "-qm", "docs")
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.chdir(tmp_path)
    provenance._code_commit.cache_clear()
    assert provenance.git_commit(tmp_path) == code != _git(tmp_path, "rev-parse", "HEAD")
    assert provenance.utc_now() == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc).isoformat()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert provenance.utc_now() == "1970-01-01T00:00:00+00:00"
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    (tmp_path / "README.md").write_text("more docs\n")  # uncommitted docs: still the same code
    provenance._code_commit.cache_clear()
    assert provenance.git_commit(tmp_path) == code
    (tmp_path / "src" / "code.py").write_text("x = 2\n")  # uncommitted code: marked, and timestamps are the clock's
    provenance._code_commit.cache_clear()
    assert provenance.git_commit(tmp_path) == code + "+dirty"
    assert provenance.utc_now()[:4] >= "2026" and provenance.utc_now() != "2026-01-02T03:04:05+00:00"
    provenance._code_commit.cache_clear()


def test_the_work_logs_inside_persist_outputs_are_not_part_of_them(tmp_path):
    """generate keeps its resumable log in the image folder (a persist output) and the FOCUS edits in
    data/vlm/focus/.work/: the record order and the driver's pid differ per run, so DVC must not hash
    them (.dvcignore), while every image and the manifest stay in the output."""
    from dvc.ignore import DvcIgnoreFilter
    from dvc.repo import Repo

    from biasaudit import contracts as C
    from biasaudit.pipeline.engine import shard_log_path
    from biasaudit.pipeline.io import DriverLock, RecordLog

    repo = Repo(str(ROOT))
    ignore = DvcIgnoreFilter(repo.fs, str(ROOT))
    images = ROOT / "data/t2i/images/planted-a"
    log = RecordLog(tmp_path / "log.jsonl", "image_id")  # the names the engine gives them
    work = [images / log.path.name, images / log.lock_path.name, images / log.torn_path.name,
            images / DriverLock(log.path, "x").path.name, images / shard_log_path("log.jsonl", 2, 8).name,
            ROOT / C.FOCUS_DIR / ".work" / "edits.jsonl", ROOT / "reports/thumbs/index.json"]
    for path in work:
        assert ignore.is_ignored(repo.fs, str(path)), path
    for kept in (images / "manifest.parquet", images / "summary.json", images / "planted-a-occ_x-0.png",
                 ROOT / C.FOCUS_DIR / "manifest.parquet", ROOT / "data/t2i/cache/classify/planted-a.jsonl",
                 ROOT / "reports/thumbs/t2i/planted-a/x.jpg"):
        assert not ignore.is_ignored(repo.fs, str(kept)), kept
