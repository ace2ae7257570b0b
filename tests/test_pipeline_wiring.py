"""dvc.yaml → papermill → notebook: every passed parameter exists in the notebook's parameters cell
and arrives with the type that cell declares (papermill silently ignores unknown names and guesses
the type of -p values)."""

import ast
import shlex

import jupytext
import pytest
import yaml
from papermill.cli import _resolve_type

from biasaudit.config import load_params

from .conftest import ROOT


def resolved_stages() -> dict[str, str]:
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        return {stage.addressing: stage.cmd for stage in repo.index.stages}


def parameters_cell(notebook_path) -> dict[str, type]:
    nb = jupytext.read(ROOT / notebook_path)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{notebook_path}: expected exactly one cell tagged 'parameters'"
    declared = {}
    for node in ast.parse(cells[0].source).body:
        assert isinstance(node, ast.AnnAssign), f"{notebook_path}: parameters must be annotated (name: type = value)"
        declared[node.target.id] = {"int": int, "float": float, "str": str, "bool": bool, "list": list,
                                    "dict": dict}[ast.unparse(node.annotation).split("[")[0]]
    return declared


def passed_parameters(cmd: str) -> tuple[str, dict[str, object]]:
    args = shlex.split(cmd)
    assert args[0] == "scripts/run-notebook", f"stage must run through scripts/run-notebook: {cmd}"
    notebook, rest = args[1], args[3:]
    values, i = {}, 0
    while i < len(rest):
        flag = rest[i]
        if flag == "-p":
            values[rest[i + 1]] = _resolve_type(rest[i + 2])
            i += 3
        elif flag == "-r":
            values[rest[i + 1]] = rest[i + 2]
            i += 3
        elif flag == "-y":
            values.update(yaml.safe_load(rest[i + 1]))
            i += 2
        else:
            raise AssertionError(f"unexpected argument {flag!r} in {cmd}")
    return notebook, values


STAGES = resolved_stages()


def test_every_stage_runs_a_notebook():
    assert STAGES, "dvc.yaml defines no stages"
    for cmd in STAGES.values():
        assert (ROOT / passed_parameters(cmd)[0]).exists()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_passed_parameters_exist_with_declared_types(stage):
    notebook, values = passed_parameters(STAGES[stage])
    declared = parameters_cell(notebook)
    for name, value in values.items():
        assert name in declared, f"{stage}: passes '{name}', which {notebook} does not declare"
        expected = declared[name]
        ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
        ok = ok or (expected is float and isinstance(value, int) and not isinstance(value, bool))
        assert ok, f"{stage}: '{name}' arrives as {type(value).__name__} {value!r}, declared {expected.__name__}"


def test_stage_outputs_declare_executed_notebooks():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    for name, stage in dvc["stages"].items():
        stage = stage.get("do", stage)  # foreach/matrix stages keep their definition under `do`
        outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])]
        assert any(str(o).startswith("reports/notebooks/") for o in outs), f"{name}: executed notebook not an output"
        deps = stage.get("deps", [])
        assert not any(str(d).startswith("reports/notebooks/") for d in deps), f"{name}: depends on an executed notebook"


def test_params_file_is_valid(in_repo):
    load_params(ROOT / "params.yaml")


def test_source_dependencies_exist():
    """A dependency on code or reference data that no longer exists fails `dvc repro` late; catch it here."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    missing = []
    for name, stage in dvc["stages"].items():
        for dep in stage.get("do", stage).get("deps", []):
            if dep.split("/")[0] in ("src", "notebooks", "scripts") or dep.startswith("data/reference"):
                if "${" not in dep and not (ROOT / dep).exists():
                    missing.append(f"{name}: {dep}")
    assert not missing, missing
