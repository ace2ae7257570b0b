"""A copy of the pipeline (dvc.yaml, params.yaml, scripts, src, notebooks, reference data) in a temporary
folder, with DVC initialised and an environment whose Python imports the copy's sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import ROOT

COPIED = ("dvc.yaml", "params.yaml", "scripts", "src", "notebooks", "data/reference", "profiles")


def make_pipeline_copy(dst: Path) -> tuple[Path, dict[str, str]]:
    for name in COPIED:
        src, target = ROOT / name, dst / name
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    if (ROOT / ".venv").exists():
        (dst / ".venv").symlink_to((ROOT / ".venv").resolve())  # scripts/ put .venv/bin on PATH
    env = dict(os.environ, PYTHONPATH=str(dst / "src"), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=dst, env=env, check=True)
    return dst, env


def set_params(params_path: Path, **dotted) -> None:
    """Set dotted keys (`analyze__ci_level` → analyze.ci_level) in a params file."""
    raw = yaml.safe_load(params_path.read_text())
    for key, value in dotted.items():
        node = raw
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False))


def dvc(root: Path, env: dict[str, str], *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)
