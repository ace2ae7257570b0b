"""benchmarks/gpu_check.sh in its CPU dry-run mode (tiny sizes): every step runs through our backends
and one JSON file comes out. The real run needs a GPU (README: "From a GPU box to the paper run")."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~80 s on 2 cores: builds five random-weight pipelines/models
def test_gpu_check_dry_run_writes_one_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, PYTHON=str(ROOT / ".venv/bin/python"), BIASAUDIT_TINY_DIR=str(tmp_path / "tiny"))
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["dry_run"] and set(data["steps"]) == {"sd35-large-turbo", "flux-schnell", "clip-vit-h-14",
                                                      "insightface", "vlm-2b"}
    assert all(step["status"] == "ok" for step in data["steps"].values())
    for model in ("sd35-large-turbo", "flux-schnell"):
        step = data["steps"][model]
        assert step["memory"]["cpu_offload"] == "none" and set(step["offload_by_card"]) == {"24GB", "48GB", "80GB"}
        assert [r["batch_size"] for r in step["runs"]] == [1, 2] and all(r["images_per_s"] > 0 for r in step["runs"])
    assert data["steps"]["insightface"]["device"] == "cpu" and data["steps"]["vlm-2b"]["statuses"] == ["ok"]
