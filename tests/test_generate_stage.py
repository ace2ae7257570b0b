"""The generation stage end to end on small inputs: packaged-photos stand-in (real faces), folder
import, an API backend through the whole stage, resumption rules, and (slow) the tiny diffusers
pipelines and a real SIGKILL kill-and-resume of a subprocess."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from biasaudit.backends.generators.packaged_photos import PATCH, SOURCES, make_variant, mean_lab, patch_mask, source_rgb
from biasaudit.config import ParamsError, read_yaml, validate
from biasaudit.pipeline.provenance import sha256_file
from biasaudit.t2i.generate import MANIFEST_COLUMNS, run_generate

from .conftest import ROOT
from .servers_images import ImagenServer

CONTRACT = ["image_id", "model", "backend", "model_id", "model_revision", "prompt_id", "prompt", "seed", "index",
            "width", "height", "sha256", "path", "status", "reason", "created_at", "libraries", "stand_in"]


def write_prompts(directory: Path, n: int = 3) -> pd.DataFrame:
    prompts = pd.DataFrame({"prompt_id": [f"occ_p{i}" for i in range(n)],
                            "prompt": [f"A person who works as job {i}" for i in range(n)],
                            "template_version": "v1"})
    (directory / "data/t2i").mkdir(parents=True, exist_ok=True)
    prompts.to_csv(directory / "data/t2i/prompts.csv", index=False)
    return prompts


def config(models: dict, **generate):
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = models
    raw["generate"] = {**raw["generate"], **generate}
    return validate(raw)


PHOTOS = {"photos": {"backend": "packaged-photos", "width": 128, "height": 128}}


# --- packaged-photos: real faces, controlled skin tone ---

def test_packaged_face_boxes_are_where_dlib_finds_the_faces():
    dlib = pytest.importorskip("dlib")
    detector = dlib.get_frontal_face_detector()
    for src in SOURCES:
        rects = detector(source_rgb(src.name), 1)
        l, t, r, b = src.face_box
        assert any(abs(d.left() - l) < 10 and abs(d.top() - t) < 10 and abs(d.right() - r) < 10
                   and abs(d.bottom() - b) < 10 for d in rects), src.name
        for x, y in src.cheeks:
            assert l < x < r and t < y < b


def test_packaged_variants_hit_target_lightness_and_span_dark_to_light():
    targets = []
    for seed in range(12):
        rgb, info = make_variant(seed, 512, 512)
        assert rgb.shape == (512, 512, 3) and rgb.dtype == np.uint8
        # measure the cheek patches in the output (undo crop, flip and resize)
        x0, y0, c, _ = info["crop_xywh"]
        src = next(s for s in SOURCES if s.name == info["source_photo"])
        scale = 512 / c
        pts = [((x - x0) * scale, (y - y0) * scale) for x, y in src.cheeks]
        if info["flip"]:
            pts = [(511 - x, y) for x, y in pts]
        mask = patch_mask((512, 512), [(int(x), int(y)) for x, y in pts], half=round(PATCH * scale))
        assert abs(mean_lab(rgb, mask)[0] - info["target_L"]) < 3.0, info  # resampling moves it slightly
        targets.append(info["target_L"])
    assert min(targets) < 40 and max(targets) > 60 and all(25 <= t <= 75 for t in targets)
    again, _ = make_variant(3, 512, 512)
    assert np.array_equal(again, make_variant(3, 512, 512)[0])
    assert not np.array_equal(again, make_variant(4, 512, 512)[0])


def test_darkest_variant_still_has_a_detectable_face():
    dlib = pytest.importorskip("dlib")
    detector = dlib.get_frontal_face_detector()
    seed = next(s for s in range(50) if make_variant(s, 512, 512)[1]["target_L"] < 32)
    rgb, info = make_variant(seed, 512, 512)
    assert len(detector(rgb, 1)) >= 1, info


# --- the stage ---

def test_stage_manifest_resume_and_invalidation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prompts = write_prompts(tmp_path)
    cfg = config(PHOTOS, images_per_prompt=2)
    first = run_generate("photos", cfg, progress=False)
    m = first.manifest
    assert list(m.columns) == MANIFEST_COLUMNS and set(CONTRACT) <= set(m.columns)
    assert len(m) == 6 and (m["status"] == "ok").all() and m["stand_in"].all()
    assert sorted(m["image_id"]) == sorted(f"photos-{p}-{i:03d}" for p in prompts["prompt_id"] for i in range(2))
    for row in m.itertuples():
        assert not Path(row.path).is_absolute() and sha256_file(row.path) == row.sha256
        with Image.open(row.path) as img:
            assert img.size == (128, 128) and "STAND-IN" in img.text["biasaudit:note"]
        assert json.loads(row.libraries)["python"] and json.loads(row.extra)["target_L"]
    on_disk = pd.read_parquet("data/t2i/images/photos/manifest.parquet")
    pd.testing.assert_frame_equal(on_disk, m)
    summary = json.loads(Path("data/t2i/images/photos/summary.json").read_text())
    assert summary["ok"] == 6 and summary["prompts_complete"] == 3 and summary["stand_in"]

    # a re-run does nothing
    again = run_generate("photos", cfg, progress=False)
    assert again.summary["this_run"]["processed"] == 0
    pd.testing.assert_frame_equal(again.manifest.drop(columns="created_at"), m.drop(columns="created_at"))

    # a deleted or altered file is redone, and only that one
    Path(m.path[0]).unlink()
    Path(m.path[1]).write_bytes(b"truncated")
    fixed = run_generate("photos", cfg, progress=False)
    assert fixed.summary["this_run"]["processed"] == 2
    assert fixed.summary["this_run"]["dropped_stale_records"]["file_missing_or_changed"] == 2
    assert list(fixed.manifest["sha256"]) == list(m["sha256"])  # deterministic: the same bytes again

    # `limit` makes a subset; other output settings invalidate earlier records
    cfg2 = config({"photos": {**PHOTOS["photos"], "width": 96, "height": 96}}, images_per_prompt=2, limit=2)
    part = run_generate("photos", cfg2, progress=False)
    assert part.summary["this_run"]["dropped_stale_records"]["other_settings"] == 6
    assert len(part.manifest) == 2 and set(part.manifest["index"]) == {0}  # index-major: one per prompt first
    assert (part.manifest["width"] == 96).all()


def test_stage_with_api_backend_counts_retries_refusals_and_black(tmp_path, monkeypatch):
    from datetime import date

    from biasaudit import lifecycle

    monkeypatch.setattr(lifecycle, "today", lambda: date(2026, 8, 1))  # before Imagen 4 Fast's shutdown date
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_IMAGEN_KEY", "secret-in-env-only")
    write_prompts(tmp_path, n=4)
    with ImagenServer() as server:
        cfg = config({"img": {"backend": "imagen", "model_id": "imagen-4.0-fast-generate-001",
                              "api_key_env": "TEST_IMAGEN_KEY", "base_url": server.url, "backoff_s": 0.0,
                              "max_retries": 1}}, images_per_prompt=1, retry_failed=True)
        server.queue(server.rate_limited("0"), server.black, server.filtered(), server.server_error(),
                     server.server_error())
        res = run_generate("img", cfg, progress=False)
        m = res.manifest.set_index("image_id")
        statuses = sorted(m["status"])
        assert statuses == ["failed", "ok", "refused", "refused"]
        assert res.summary["this_run"]["retries"] == 2
        assert any("black image" in r for r in m["reason"]) and any("safety filter" in r for r in m["reason"])
        assert not m["stand_in"].any() and (m["model_revision"] == "imagen-4.0-fast-generate-001").all()
        # a re-run retries the failure (not the refusals) and completes
        res2 = run_generate("img", cfg, progress=False)
        assert res2.summary["this_run"]["processed"] == 1
        assert sorted(res2.manifest["status"]) == ["ok", "ok", "refused", "refused"]
    assert "secret-in-env-only" not in Path("data/t2i/images/img/log.jsonl").read_text()


def test_folder_import_validates_and_records_bad_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_prompts(tmp_path, n=2)
    src = tmp_path / "mine"
    src.mkdir()
    Image.fromarray(np.full((64, 64, 3), 120, np.uint8)).save(src / "a.jpg")
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(src / "b.png")
    (src / "broken.png").write_bytes(b"not an image")
    pd.DataFrame({"file": ["a.jpg", "b.png", "broken.png"], "prompt_id": ["occ_p0", "occ_p1", "occ_p0"]}).to_csv(
        tmp_path / "map.csv", index=False)
    models = {"mine": {"backend": "folder", "folder": "mine", "mapping_csv": "map.csv"}}
    res = run_generate("mine", config(models, images_per_prompt=2), progress=False)
    m = res.manifest.set_index("image_id")
    assert m.loc["mine-occ_p0-000", "status"] == "ok" and m.loc["mine-occ_p1-000", "status"] == "ok"
    assert m.loc["mine-occ_p0-001", "status"] == "failed" and "not an image" in m.loc["mine-occ_p0-001", "reason"]
    assert "no file mapped" in m.loc["mine-occ_p1-001", "reason"]
    assert json.loads(m.loc["mine-occ_p0-000", "extra"])["source_file"] == "a.jpg"
    # validation: unknown prompt id and duplicates stop the stage before any work
    pd.DataFrame({"file": ["a.jpg", "b.png"], "prompt_id": ["occ_p0", "nope"], "index": [0, 0]}).to_csv(
        tmp_path / "bad.csv", index=False)
    pd.DataFrame({"file": ["a.jpg", "b.png"], "prompt_id": ["occ_p0", "occ_p0"], "index": [0, 0]}).to_csv(
        tmp_path / "dup.csv", index=False)
    for csv, message in (("bad.csv", "not in the prompts table"), ("dup.csv", "duplicate")):
        bad = {"mine2": {"backend": "folder", "folder": "mine", "mapping_csv": csv}}
        with pytest.raises(ParamsError, match=f"models.mine2.mapping_csv: .*{message}"):
            run_generate("mine2", config(bad), progress=False)
        assert not Path("data/t2i/images/mine2/log.jsonl").exists()


# --- tiny diffusers pipelines (slow: torch) ---

TINY = {"backend": "tiny", "width": 32, "height": 32, "num_inference_steps": 2, "max_sequence_length": 16,
        "device": "cpu", "dtype": "fp32"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sd3", "flux"])
def test_tiny_pipeline_is_real_deterministic_and_batch_invariant(arch, tmp_path, monkeypatch):
    import diffusers

    from biasaudit.backends.generators import make_generator
    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.params.generate import GeneratorSpec

    monkeypatch.chdir(tmp_path)
    spec = GeneratorSpec(**TINY, architecture=arch, batch_size=3)
    gen = make_generator(f"tiny-{arch}", spec)
    expected = diffusers.StableDiffusion3Pipeline if arch == "sd3" else diffusers.FluxPipeline
    assert isinstance(gen.pipe, expected) and gen.stand_in and gen.revision.startswith("sha256:")
    reqs = [GenRequest(f"i{k}", "p", f"a person {k}", k, 1000 + k, 32, 32) for k in range(3)]
    batched = gen.generate(reqs)
    single = [gen.generate([r])[0] for r in reqs]
    assert all(r.status == "ok" and r.rgb.shape == (32, 32, 3) for r in batched)
    for b, s in zip(batched, single):
        assert np.abs(b.rgb.astype(int) - s.rgb.astype(int)).max() <= 2  # batching noise only
    assert not np.array_equal(batched[0].rgb, batched[1].rgb)
    # rebuilt from scratch elsewhere: the same weights hash and the same image
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    gen2 = make_generator(f"tiny-{arch}", spec)
    assert gen2.revision == gen.revision
    assert np.array_equal(gen2.generate([reqs[0]])[0].rgb, single[0].rgb)


# --- SIGKILL mid-run, then resume ---

def _run_cli(cwd: Path, model: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "biasaudit.t2i.generate", "--model", model, "--no-progress"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_lossless(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    params = read_yaml(ROOT / "params.yaml")
    params["models"] = {"photos": {"backend": "packaged-photos", "width": 256, "height": 256}}
    params["generate"] = {**params["generate"], "images_per_prompt": 4, "limit": 0}
    runs = {}
    for name in ("killed", "reference"):
        d = tmp_path / name
        d.mkdir()
        write_prompts(d, n=5)
        (d / "params.yaml").write_text(yaml.safe_dump(params))
        runs[name] = d
    log = runs["killed"] / "data/t2i/images/photos/log.jsonl"
    proc = _run_cli(runs["killed"], "photos", env)
    deadline = time.time() + 120
    while _lines(log) < 4 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "finished before it could be killed: " + proc.stderr.read().decode()[-500:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = _lines(log)
    assert 4 <= done_at_kill < 20
    resumed = _run_cli(runs["killed"], "photos", env)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-2000:]
    summary = json.loads(out)
    assert summary["this_run"]["already_done"] == done_at_kill
    assert summary["this_run"]["processed"] == 20 - done_at_kill  # nothing redone
    ref = _run_cli(runs["reference"], "photos", env)
    assert ref.wait(timeout=300) == 0
    killed_m = pd.read_parquet(runs["killed"] / "data/t2i/images/photos/manifest.parquet")
    ref_m = pd.read_parquet(runs["reference"] / "data/t2i/images/photos/manifest.parquet")
    assert len(killed_m) == 20 and killed_m["image_id"].is_unique and (killed_m["status"] == "ok").all()
    assert list(killed_m["sha256"]) == list(ref_m["sha256"])  # exactly the images of an uninterrupted run
    images = sorted((runs["killed"] / "data/t2i/images/photos").glob("*.png"))
    assert len(images) == 20 and not list((runs["killed"] / "data/t2i/images/photos").glob(".*.tmp"))
    for p in images:
        with Image.open(p) as img:
            img.load()  # no truncated file
    assert _lines(log) == 20  # one record per image: no duplicate work


@pytest.mark.slow
def test_diffusers_backend_loads_local_dirs_and_offline_hub_cache(tmp_path, monkeypatch):
    """The real `diffusers` backend (DiffusionPipeline auto class) on a local pipeline folder and on a
    hub id served from the local Hugging Face cache with HF_HUB_OFFLINE=1; the revision recorded is the
    weights hash / the snapshot commit."""
    import shutil

    import huggingface_hub.constants

    from biasaudit.tiny.diffusion import ensure_tiny_pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_prompts(tmp_path, n=1)
    local, digest = ensure_tiny_pipeline("flux", tmp_path / "weights")
    commit = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hf-cache"
    repo = cache / "models--biasaudit-test--tiny-flux"
    shutil.copytree(local, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    common = {"backend": "diffusers", "width": 32, "height": 32, "num_inference_steps": 2, "max_sequence_length": 16,
              "device": "cpu", "dtype": "fp32"}
    cfg = config({"local": {**common, "model_id": str(local)}, "hub": {**common, "model_id": "biasaudit-test/tiny-flux"},
                  "absent": {**common, "model_id": "biasaudit-test/not-cached"}}, images_per_prompt=1)
    res_local = run_generate("local", cfg, progress=False)
    res_hub = run_generate("hub", cfg, progress=False)
    assert res_local.manifest["model_revision"].tolist() == [digest]
    assert res_hub.manifest["model_revision"].tolist() == [commit]
    assert (res_local.manifest["status"] == "ok").all() and (res_hub.manifest["status"] == "ok").all()
    assert not res_hub.manifest["stand_in"].any()  # the backend cannot know; the tiny backend labels its own
    with pytest.raises(ParamsError, match="models.absent.model_id: hub id 'biasaudit-test/not-cached'"):
        run_generate("absent", cfg, progress=False)
