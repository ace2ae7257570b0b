"""A pixel budget bounds memory for any input: load_rgb decodes a large image small (a JPEG in the DCT,
so its full-size pixels never exist), resized to the declared working side, with the scale recorded;
an 8000×8000 photo goes through the faces stage's real process pool and the peak resident memory of
every process stays under the bound stated in docs/architecture.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from biasaudit.pipeline.images import load_rgb, working_size

ROOT = Path(__file__).resolve().parents[1]
SIDE = 8000
PEAK_BOUND_MIB = 3072  # docs/architecture.md: every process of faces@<model> at image_max_side 1024


def hopper() -> Image.Image:
    from matplotlib import cbook

    return Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB")


@pytest.fixture(scope="module")
def big_jpeg(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.jpg"
    hopper().resize((SIDE, SIDE), Image.Resampling.BICUBIC).save(path, quality=90)
    return path


def test_working_size_keeps_the_aspect_and_small_images():
    assert working_size(8000, 8000, 1024) == (1024, 1024)
    assert working_size(3000, 2000, 1000) == (1000, 667)
    assert working_size(2000, 3000, 1000) == (667, 1000)
    assert working_size(800, 600, 1024) == (800, 600) and working_size(8000, 10, 0) == (8000, 10)


def test_a_uniform_colour_survives_the_budget_exactly(tmp_path):
    Image.new("RGB", (3000, 2000), (181, 120, 93)).save(tmp_path / "u.png")
    got = load_rgb(tmp_path / "u.png", max_side=1000)
    assert got.rgb.shape == (667, 1000, 3) and got.scale == pytest.approx(1000 / 3000)
    assert (got.rgb == np.array([181, 120, 93], np.uint8)).all()
    assert load_rgb(tmp_path / "u.png").scale == 1.0  # no budget: as stored


def test_the_budget_applies_orientation_and_alpha_as_without_it(tmp_path):
    # a portrait stored sideways (EXIF 6: rotate 90° clockwise to view) and shrunk 4×: the same picture
    # as the full-size load shrunk by hand
    arr = np.zeros((400, 800, 3), np.uint8)
    arr[:, :400] = (200, 40, 40)  # left half red as stored → top half once upright
    img = Image.fromarray(arr)
    exif = img.getexif()
    exif[0x0112] = 6
    img.save(tmp_path / "cam.png", exif=exif)
    full, small = load_rgb(tmp_path / "cam.png"), load_rgb(tmp_path / "cam.png", max_side=200)
    assert full.rgb.shape == (800, 400, 3) and small.rgb.shape == (200, 100, 3)
    assert "EXIF orientation 6 applied" in small.note
    by_hand = np.asarray(Image.fromarray(full.rgb).resize((100, 200), Image.Resampling.LANCZOS))
    assert np.abs(small.rgb.astype(int) - by_hand.astype(int)).max() <= 2
    # transparent pixels are composited on white after the shrink as before it
    rgba = np.zeros((600, 600, 4), np.uint8)
    rgba[..., :3], rgba[:, :300, 3] = 30, 255  # left half opaque dark, right half fully transparent
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    got = load_rgb(tmp_path / "a.png", max_side=300)
    assert got.note == "RGBA: alpha composited on white" and got.rgb.shape == (300, 300, 3)
    assert (got.rgb[:, :140] == 30).all() and (got.rgb[:, 160:] == 255).all()


def hwm_mib(pid: int | str = "self") -> float:
    """A process's peak resident memory so far (VmHWM, MiB): the OS's high-water mark of its own
    address space (unlike ru_maxrss of a fresh interpreter, it does not start at its parent's peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def test_a_large_jpeg_is_decoded_small(big_jpeg):
    """8000×8000 RGB is 183 MiB of pixels; under a 1024 budget the decode never holds them (DCT scaling
    to 2000×2000, 11 MiB), so the interpreter grows by far less than one full-size copy."""
    def run(args: str) -> float:  # MiB the peak grows by while loading, in a fresh interpreter
        code = ("from biasaudit.pipeline.images import load_rgb; from tests.test_pixel_budget import hwm_mib; "
                f"base = hwm_mib(); load_rgb({str(big_jpeg)!r}{args}); print(hwm_mib() - base)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                             env=os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])})
        return float(out.stdout.split()[-1])

    budget, full = run(", max_side=1024"), run("")
    assert budget < 60 < 183 <= full  # MiB above the imports
    got = load_rgb(big_jpeg, max_side=1024)
    assert got.rgb.shape == (1024, 1024, 3) and got.scale == 1024 / SIDE


def faces_driver() -> None:
    """faces@big as the stage runs it (run_faces: engine, local pool of 2, the params.yaml faces
    section with one image per batch so both images go to the pool); prints the pool's report and the
    table as JSON. Run in a fresh directory. (The driver measures no image here; the overlays it draws
    in the notebook go through the same `FaceMeasurer.load` and `measure`.)"""
    from multiprocessing import forkserver

    import pandas as pd

    from biasaudit.config import load_params
    from biasaudit.faces.stage import run_faces

    cfg = load_params(ROOT / "params.yaml")
    cfg = cfg.model_copy(update={"faces": cfg.faces.model_copy(update={"batch_size": 1}),
                                 "execution": cfg.execution.model_copy(update={"local_workers": 2})})
    manifest = pd.DataFrame([{"image_id": f"big-p-{i}", "model": "big", "prompt_id": "p", "path": name,
                              "status": "ok", "reason": "", "stand_in": True}
                             for i, name in enumerate(["big.jpg", "small.png"])])
    manifest.to_parquet("manifest.parquet")
    out = run_faces("big", cfg, progress=False, manifest_path="manifest.parquet", faces_path="faces.parquet",
                    emb_dir="emb")
    peaks = {"driver": hwm_mib(), "fork_server": hwm_mib(forkserver._forkserver._forkserver_pid)}
    faces = out["faces"][["image_id", "status", "reason", "image_scale", "L", "n_faces"]]
    print(json.dumps({"pool": out["execution"].get("pool", {}) | out["measured"], "faces": faces.to_dict("records"), "peaks": peaks},
                     default=float))


@pytest.mark.slow
def test_an_8000px_photo_goes_through_the_faces_stage_within_the_memory_bound(tmp_path, big_jpeg):
    os.symlink(big_jpeg, tmp_path / "big.jpg")
    hopper().resize((1024, 1024), Image.Resampling.LANCZOS).save(tmp_path / "small.png")  # the oracle
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
                        "BIASAUDIT_TINY_DIR": str(tmp_path / "tiny"), "OMP_NUM_THREADS": "1"}

    def limit() -> None:  # a regression fails this test, not the machine: 8 GB of address space each
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (8_000_000_000, 8_000_000_000))

    proc = subprocess.run([sys.executable, "-c", "from tests.test_pixel_budget import faces_driver; faces_driver()"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, preexec_fn=limit)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = {r["image_id"]: r for r in got["faces"]}
    big, small = rows["big-p-0"], rows["big-p-1"]
    assert big["status"] == "ok" and big["n_faces"] == 1 and big["image_scale"] == 1024 / SIDE
    assert small["status"] == "ok" and small["image_scale"] == 1.0
    # measured at the working size, the 8000 px photo reads as the same photo made 1024 px directly
    assert abs(big["L"] - small["L"]) < 1.5
    pool = got["pool"]
    assert pool["worker_deaths"] == 0 and pool["workers_started"] == 2
    # every process of the stage: the driver and the fork server (VmHWM), the workers (their ru_maxrss
    # after their batch, which for a forked process is its own high-water mark)
    peaks = got["peaks"] | {"workers": pool["worker_peak_rss_mib"]}
    print("peak resident memory, MiB:", {k: round(v) for k, v in peaks.items()})
    assert max(peaks.values()) < PEAK_BOUND_MIB, peaks
