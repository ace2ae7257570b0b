"""benchmarks/gpu_check.sh for a GPU machine without network: its wheel set (pinned, < 60 MiB, installed with
pip --no-index --no-deps --target before the first import) and its CPU dry run (tiny sizes, every step
through our backends, the same wheel install path). The real run needs a GPU (docs/real-models.md: "GPU check")."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".gpu-wheels"
LIST = ROOT / "benchmarks" / "gpu_wheels.txt"


def _gpu_wheels():
    spec = importlib.util.spec_from_file_location("gpu_wheels", ROOT / "benchmarks" / "gpu_wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _norm(name: str) -> str:
    return name.lower().replace("-", "_")


def make_wheel(folder: Path, name: str, version: str = "1.0", tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel (one module that records where it was imported from), built offline."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "WHERE = __file__\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def pin_list(path: Path, wheels: list[Path]) -> Path:
    lines = [f"{w.name.split('-')[0]}=={w.name.split('-')[1]} --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}"
             for w in wheels]
    path.write_text("# test pins\n" + "\n".join(lines) + "\n")
    return path


def test_the_pinned_wheels_are_the_locked_versions():
    pins = _gpu_wheels().pinned(LIST)
    lock = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            lock[_norm(name)] = version.strip()
    assert {"diffusers", "pydantic", "pydantic_core", "open_clip_torch", "insightface"} <= set(pins)
    for name, (version, digest) in pins.items():
        assert lock.get(name) == version, name  # the GPU run imports what the tests import
        assert len(digest) == 64 and int(digest, 16) >= 0, name


@pytest.mark.skipif(not WHEELS.is_dir(), reason="no .gpu-wheels/: `make gpu-wheels` downloads them (needs PyPI)")
def test_the_downloaded_wheel_set_is_complete_pinned_and_under_60_mib():
    gw = _gpu_wheels()
    chosen, problems = gw.check(WHEELS, LIST)
    assert problems == [] and len(chosen) == len(gw.pinned(LIST))
    assert sum(w.stat().st_size for w in chosen) < 60 * 2 ** 20
    tags = {w.name.split("-", 2)[2] for w in chosen}
    assert all(t.startswith(("py3-none-any", "cp312-cp312-manylinux", "cp310-abi3-manylinux")) for t in tags), tags


def test_the_install_path_with_local_wheels(tmp_path):
    gw = _gpu_wheels()
    good = make_wheel(tmp_path / "w", "probe_pkg")
    foreign = make_wheel(tmp_path / "w", "foreign_pkg", tag="cp99-cp99-manylinux_2_17_x86_64")  # loads nowhere
    pins = pin_list(tmp_path / "pins.txt", [good, foreign])
    with pytest.raises(SystemExit, match="cannot be loaded"):
        gw.install(tmp_path / "w", pins, tmp_path / "site", strict=True)  # the GPU run: every wheel must load
    manifest = gw.install(tmp_path / "w", pins, tmp_path / "site", strict=False)
    assert manifest["installed"] == {good.name: ["probe_pkg"]} and list(manifest["skipped"]) == [foreign.name]
    out = subprocess.run([sys.executable, "-c", "import probe_pkg; print(probe_pkg.WHERE)"], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")), check=True)
    assert out.stdout.strip().startswith(str(tmp_path / "site"))
    good.write_bytes(good.read_bytes() + b"x")  # not the pinned bytes any more
    with pytest.raises(SystemExit, match="sha256"):
        gw.install(tmp_path / "w", pins, tmp_path / "site", strict=False)
    (tmp_path / "w" / "probe_pkg-2.0-py3-none-any.whl").write_bytes(b"")  # a second version: refused
    assert any("not in" in p for p in gw.check(tmp_path / "w", pins)[1])


@pytest.mark.slow  # ~2 min on 2 cores: builds the random-weight pipelines/models of every step
def test_gpu_check_dry_run_installs_the_wheels_and_writes_one_json(tmp_path):
    """The same script as on the GPU: the real wheel set when `make gpu-wheels` has fetched it (each pure
    wheel this Python can load is imported from the --target folder), else a local wheel."""
    out = tmp_path / "gpu_check.json"
    if WHEELS.is_dir():
        wheels, pins = WHEELS, LIST
    else:
        wheels = tmp_path / "wheels"
        pins = pin_list(tmp_path / "pins.txt", [make_wheel(wheels, "probe_pkg")])
    site = tmp_path / "site"
    env = dict(os.environ, PYTHON=sys.executable, BIASAUDIT_TINY_DIR=str(tmp_path / "tiny"), GPU_WHEELS=str(wheels),
               GPU_WHEEL_LIST=str(pins), GPU_SITE=str(site), OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--dry-run", "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["dry_run"] and set(data["steps"]) == {"sd35-large-turbo", "flux-schnell", "clip-vit-h-14",
                                                      "insightface", "face-parser", "vlm-2b"}
    assert all(step["status"] == "ok" for step in data["steps"].values()), {
        k: v.get("reason") for k, v in data["steps"].items()}
    wheels_used = data["wheels"]
    assert wheels_used["installed"] and wheels_used["target"] == str(site)
    for module, origin in wheels_used["imported_from"].items():
        assert origin and str(site) in origin, module  # imported from the --target folder, not the venv
    for model in ("sd35-large-turbo", "flux-schnell"):
        step = data["steps"][model]
        assert step["memory"]["cpu_offload"] == "none" and set(step["caps"]) == {"24GB", "40GB"}
        assert all(set(c["auto_picks"]) == {"batch 1", "batch 4"} for c in step["caps"].values())
        assert [r["batch_size"] for r in step["runs"]] == [1, 2]
        for r in step["runs"]:
            assert r["images_per_s"] > 0 and r["plain_images_per_s"] > 0 and r["ratio_images_per_s"] > 0
            # same seeds, same pipeline: the same images up to the pipeline's own run-to-run noise (two
            # identical plain calls of the tiny FLUX differed by up to 2 of 255 levels here; another seed: ~100)
            assert r["max_abs_diff_vs_plain_same_seeds"] <= 8
        assert "config.json" in step["config_source"]
    assert [r["batch_size"] for r in data["steps"]["face-parser"]["runs"]] == [1, 2]
    assert [r["batch_size"] for r in data["steps"]["clip-vit-h-14"]["runs"]] == [2, 4]
    assert data["steps"]["insightface"]["device"] == "cpu" and data["steps"]["vlm-2b"]["statuses"] == ["ok"]
