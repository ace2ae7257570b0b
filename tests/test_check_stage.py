"""Validation before deletion: with an invalid parameter, `dvc repro` stops at the check stage and
nothing in data/ or reports/ is removed (many outputs are cache: false / persist and could not be
restored). Runs the real dvc on a copy of the pipeline whose every output already exists."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT

COPIED = ("dvc.yaml", "params.yaml", "scripts", "src", "notebooks", "data/reference")


def tree_hash(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for top in ("data", "reports"):
        for p in sorted((root / top).rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not any(rel.startswith(s) for s in skip):
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def pipeline_copy(tmp_path):
    for name in COPIED:
        src, dst = ROOT / name, tmp_path / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "src"), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, env=env, check=True)
    # every output of every stage exists (a finished earlier run), as a file or a folder with a file
    from dvc.repo import Repo

    with Repo(str(tmp_path)) as repo:
        outs = [str(o.def_path) for s in repo.index.stages for o in s.outs]
    for out in outs:
        path = tmp_path / out
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"finished result {out}\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "result.txt").write_text(f"finished result {out}\n")
    return tmp_path, env


def _set(params_path: Path, dotted: str, value) -> None:
    raw = yaml.safe_load(params_path.read_text())
    node = raw
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.mark.slow
@pytest.mark.parametrize("dotted, value, named", [("analyze.ci_level", 1.5, "analyze.ci_level"),
                                                  ("classify.vlm.backend", "nope", "classify.vlm.backend")])
def test_invalid_params_stop_dvc_repro_before_any_output_is_removed(pipeline_copy, dotted, value, named):
    root, env = pipeline_copy
    _set(root / "params.yaml", dotted, value)
    before = tree_hash(root)
    run = subprocess.run([sys.executable, "-m", "dvc", "repro"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode != 0
    assert named in run.stderr + run.stdout and "failed to reproduce 'check'" in run.stderr + run.stdout
    after = tree_hash(root)
    # the check stage's own folder is the only thing DVC removed (it is rebuilt from params.yaml)
    assert {k: v for k, v in before.items() if not k.startswith("data/check/")} == after
    assert not any(k.startswith("data/check/") for k in after)
