import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _run_from_repo_root():
    """Stages use repository-relative paths (data/reference, params.yaml), as under DVC."""
    old = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(old)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def in_repo(monkeypatch):
    """Run from the repository root (relative data/reference paths)."""
    monkeypatch.chdir(ROOT)
    return ROOT


def calibration_module():
    """benchmarks/calibration.py loaded as a module (it is a script, not part of the package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("calibration", ROOT / "benchmarks" / "calibration.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibration"] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module
