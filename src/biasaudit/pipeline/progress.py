"""Where a `dvc repro` is: every stage line says "k/N", its place in the order DVC runs the pipeline.

The plan comes from DVC itself (the same planner `dvc repro` uses: a post-order walk of the stage graph)
and is kept in DVC's scratch folder, keyed by the content of dvc.yaml and params.yaml (a profile switch
changes the stage instances); the check stage makes it when it runs, and the notebook runner under
`dvc repro` when it is missing or stale (a changed dvc.yaml does not re-run `check`). Each stage line then reads its position from there: `▶ 9/20 faces@planted-a`.
A stage that is up to date is skipped by DVC, so a re-run after one change prints, e.g., only 13/20 to 20/20.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from biasaudit import contracts as C

KEYED_BY = ("dvc.yaml", "params.yaml")


def plan_key(root: str | Path = ".") -> str:
    h = hashlib.sha256()
    for name in KEYED_BY:
        path = Path(root) / name
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return h.hexdigest()


def dvc_plan(root: str | Path = ".") -> list[str]:
    """The stage instances in the order `dvc repro` (no targets) runs them, from DVC's own planner."""
    from dvc.dvcfile import PROJECT_FILE
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    with Repo(str(root)) as repo:
        stages = collect_stages(repo, [str(Path(repo.root_dir) / PROJECT_FILE)])
        return [stage.name for stage in plan_repro(get_active_graph(repo.index.graph), stages)]


def write_plan(root: str | Path = ".", path: Path = C.STAGE_PLAN) -> list[str]:
    """The plan, computed again only when dvc.yaml or params.yaml changed (it costs DVC's index)."""
    target = Path(root) / path
    key = plan_key(root)
    try:
        cached = json.loads(target.read_text())
        if cached.get("key") == key:
            return list(cached["stages"])
    except (OSError, ValueError, KeyError):
        pass
    stages = dvc_plan(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"key": key, "stages": stages}) + "\n")
    return stages


def current_position(stage: str, root: str | Path = ".") -> str:
    """position(); under `dvc repro` (DVC sets DVC_STAGE for a stage's command) the plan is made first
    when it is missing or stale: the check stage, which makes it, does not run when only dvc.yaml changed."""
    if os.environ.get("DVC_STAGE"):
        try:
            write_plan(root)
        except Exception:  # no plan: the stage line lacks k/N
            pass
    return position(stage, root)


def position(stage: str, root: str | Path = ".", path: Path = C.STAGE_PLAN) -> str:
    """'k/N' for `stage` in the current plan; '' without one (a notebook run outside `dvc repro`, a
    plan made for another dvc.yaml or params.yaml, a stage it does not list)."""
    try:
        plan = json.loads((Path(root) / path).read_text())
    except (OSError, ValueError):
        return ""
    stages = plan.get("stages") or []
    if plan.get("key") != plan_key(root) or stage not in stages:
        return ""
    return f"{stages.index(stage) + 1}/{len(stages)}"
