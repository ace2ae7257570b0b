"""A notebook opened by hand (JupyterLab starts its kernel in `notebooks/`) reads exactly what its
`dvc repro` stage reads, and writes where the stage writes; saving it from JupyterLab keeps its file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
import yaml

from .conftest import ROOT
from .pipeline_copy import make_pipeline_copy

STAGE = "benchmarks"  # the cheapest stage: reference tables in, parquet out, no model
DUMP = """
# %%
import json as _json
import os as _os
from pathlib import Path as _Path
_Path({target!r}).write_text(_json.dumps({{"cwd": _os.getcwd(), "cfg": cfg.model_dump(mode="json"),
                                           "section": params.model_dump(mode="json")}}))
"""


def _with_dump(notebook: Path, target: Path, dst: Path) -> Path:
    """The stage's notebook plus one last cell that writes the parameters it resolved to `target`."""
    dst.write_text(notebook.read_text() + DUMP.format(target=str(target)))
    return dst


def _leaves(value, prefix=""):
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaves(sub, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


@pytest.mark.slow
def test_a_notebook_run_from_notebooks_reads_what_its_stage_reads(tmp_path, monkeypatch):
    root, env = make_pipeline_copy(tmp_path / "repo")
    spec = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][STAGE]
    notebook_rel = spec["cmd"].split()[1]  # scripts/run-notebook notebooks/t2i_benchmarks.py t2i_benchmarks
    notebook = root / notebook_rel

    # 1. the stage, as dvc repro runs it: its own command from the root
    stage_nb = _with_dump(notebook, tmp_path / "stage.json", root / "notebooks" / "_stage_dump.py")
    cmd = spec["cmd"].replace(notebook_rel, str(stage_nb.relative_to(root)))
    run = subprocess.run(cmd.split(), cwd=root, env=dict(env, DVC_STAGE=""), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    stage = json.loads((tmp_path / "stage.json").read_text())
    out = root / "data" / "t2i" / "benchmarks"
    stage_outputs = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    for p in out.iterdir():
        p.unlink()

    # 2. by hand: a kernel started in notebooks/ (what JupyterLab does), the notebook's own defaults
    from nbclient import NotebookClient

    by_hand_nb = _with_dump(notebook, tmp_path / "by_hand.json", root / "notebooks" / "_by_hand_dump.py")
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = jupytext.read(by_hand_nb)
    NotebookClient(nb, kernel_name="python3", timeout=600,
                   resources={"metadata": {"path": str(root / "notebooks")}}).execute()
    by_hand = json.loads((tmp_path / "by_hand.json").read_text())

    assert Path(stage["cwd"]).resolve() == Path(by_hand["cwd"]).resolve() == root.resolve()
    assert by_hand["cfg"] == stage["cfg"] and by_hand["section"] == stage["section"]
    # …and both are params.yaml's values: every leaf of each key the stage declares in `params:`
    raw = yaml.safe_load((root / "params.yaml").read_text())
    for key in spec["params"]:
        for leaf, value in _leaves(raw[key], key):
            node = by_hand["cfg"]
            for part in leaf.split("."):
                node = node[part]
            assert node == value, leaf
    # the hand run wrote the stage's outputs where the stage writes them, with the same content
    assert not (root / "notebooks" / "data").exists()
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == stage_outputs


def test_enter_repo_root_moves_up_only_inside_a_project(tmp_path, monkeypatch):
    from biasaudit.notebook import enter_repo_root, repo_root

    (tmp_path / "proj" / "notebooks" / "deep").mkdir(parents=True)
    (tmp_path / "proj" / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "proj" / "params.yaml").write_text("seed: 1\n")
    monkeypatch.chdir(tmp_path / "proj" / "notebooks" / "deep")
    assert repo_root() == (tmp_path / "proj").resolve()
    assert enter_repo_root() == (tmp_path / "proj").resolve()
    assert Path.cwd() == (tmp_path / "proj").resolve()
    assert enter_repo_root() is None  # already there
    monkeypatch.chdir(tmp_path)  # outside any project: stays put
    assert repo_root() is None and enter_repo_root() is None and Path.cwd() == tmp_path.resolve()


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.py")), ids=lambda p: p.name)
def test_saving_a_notebook_from_jupyterlab_keeps_its_file(notebook, tmp_path):
    """JupyterLab saves through jupytext's contents manager: read, then write in the file's own
    format. The header's metadata filter keeps jupytext's version block out, so the file is unchanged."""
    target = tmp_path / notebook.name
    jupytext.write(jupytext.read(notebook), target, fmt="py:percent")
    assert target.read_text() == notebook.read_text()


def test_make_lab_opens_python_files_as_notebooks(tmp_path, monkeypatch):
    """`make lab` points JUPYTER_CONFIG_PATH at .jupyter/; JupyterLab's settings then make a
    double-clicked .py open in the notebook viewer jupytext's extension registers."""
    from jupyterlab_server.settings_utils import _get_overrides

    makefile = (ROOT / "Makefile").read_text()
    assert "JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter" in makefile
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(ROOT / ".jupyter"))
    overrides, error = _get_overrides(str(tmp_path))  # an empty app-settings folder: only ours apply
    assert not error
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["python"] == "Jupytext Notebook"
    extension = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "jupyterlab-jupytext"
    assert any("Jupytext Notebook" in p.read_text(errors="ignore") for p in extension.rglob("*.js"))
