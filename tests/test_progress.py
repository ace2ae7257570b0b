"""The terminal of a `dvc repro`: "k/N" on each stage line (the order DVC runs them), progress lines
in a log for a long per-item stage, and no warning the user cannot act on."""

from __future__ import annotations

import io
import json
import os

import pytest
import yaml

from biasaudit.progress import plan_key, position, write_plan
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
