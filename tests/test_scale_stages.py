"""The per-image stages scale out without a second code path: on a local Ray instance, generate →
classify → faces give exactly the local runner's records; a worker killed mid-run neither loses nor
duplicates an image; `shard i of n` runs on separate machines, copied together and finished by one
unsharded run, give the whole result (overlapping and missing shards included)."""

from __future__ import annotations

import json
import os
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.config import read_yaml, validate
from biasaudit.pipeline.engine import shard_log_path, shard_logs
from biasaudit.t2i.generate import make_generate_fn, plan_items, preflight, run_generate

from .conftest import ROOT

PROMPTS = pd.DataFrame({"prompt_id": ["occ_p0", "geo_p1"], "template_version": "v1",
                        "prompt": ["A person who works as a nurse", "A person from Ohio"]})
MODELS = {
    # one image per forward pass: the local and the Ray runner then make bit-identical images
    "tiny-sd3": {"backend": "tiny", "architecture": "sd3", "width": 32, "height": 32, "num_inference_steps": 2,
                 "max_sequence_length": 16, "device": "cpu", "dtype": "fp32", "batch_size": 1},
    "packaged-photos": {"backend": "packaged-photos", "width": 160, "height": 160},
}


def workspace(directory: Path, shared_models: Path, n_prompts: int = 2) -> Path:
    (directory / "data/t2i").mkdir(parents=True, exist_ok=True)
    if n_prompts <= len(PROMPTS):
        PROMPTS.head(n_prompts).to_csv(directory / "data/t2i/prompts.csv", index=False)
    else:
        pd.DataFrame({"prompt_id": [f"occ_p{i}" for i in range(n_prompts)], "template_version": "v1",
                      "prompt": [f"A person who works as job {i}" for i in range(n_prompts)]}
                     ).to_csv(directory / "data/t2i/prompts.csv", index=False)
    if not (directory / "models").exists():
        (directory / "models").symlink_to(shared_models, target_is_directory=True)  # tiny weights built once
    return directory


def config(runner: str = "local", models: dict | None = None, shard: tuple[int, int] = (0, 1), **generate):
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = models or MODELS
    raw["generate"] = {**raw["generate"], "images_per_prompt": 2, **generate}
    raw["classify"] = {**raw["classify"], "batch_size": 3,
                       "vlm": {**raw["classify"]["vlm"], "backend": "tiny", "model_id": "tiny-qwen2-vl",
                               "api_key_env": "", "batch_mode": False}}
    raw["faces"] = {**raw["faces"], "detector": "dlib", "skin_method": "landmarks", "face_embedding": "dlib",
                    "clip_pretrained": "tiny", "batch_size": 3, "device": "cpu", "limit": 0}
    raw["execution"] = {"runner": runner, "shard_index": shard[0], "shard_count": shard[1],
                        "ray": {"address": "", "num_workers": 2, "num_cpus_per_worker": 1.0, "num_gpus_per_worker": 0.0}}
    return validate(raw)


@pytest.fixture(scope="module")
def shared_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "tiny").mkdir()
    return d


@pytest.fixture
def tiny_env(shared_models, monkeypatch):
    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(shared_models / "tiny"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return shared_models


@pytest.fixture
def ray_local(tiny_env):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # after the env: workers inherit it
    yield ray
    ray.shutdown()


def run_pipeline(directory: Path, runner: str) -> dict[str, pd.DataFrame | np.ndarray]:
    from biasaudit.faces.stage import run_faces
    from biasaudit.t2i.classify import run_classify

    os.chdir(directory)
    cfg = config(runner)
    out: dict = {}
    for model in MODELS:
        g = run_generate(model, cfg, progress=False)
        assert g.summary["this_run"]["processed"] == 4 and g.summary["execution"]["runner"] == runner
        out[f"{model}/manifest"] = g.manifest
        c = run_classify(model, cfg, progress=False)
        assert c["summary"].processed == 4
        out[f"{model}/labels"] = c["table"]
        f = run_faces(model, cfg, progress=False)
        assert f["summary"].processed == 4
        out[f"{model}/faces"], out[f"{model}/index"] = f["faces"], f["index"]
        out[f"{model}/clip"], out[f"{model}/face"] = f["clip"], f["face"]
    return out


@pytest.mark.slow
def test_ray_pipeline_matches_local_row_for_row(tmp_path, tiny_env, ray_local, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = run_pipeline(workspace(tmp_path / "local", tiny_env), "local")
    on_ray = run_pipeline(workspace(tmp_path / "ray", tiny_env), "ray")
    for model in MODELS:
        lm, rm = local[f"{model}/manifest"], on_ray[f"{model}/manifest"]
        assert (lm["status"] == "ok").all() and len(lm) == 4
        assert list(rm["image_id"]) == list(lm["image_id"])
        assert list(rm["sha256"]) == list(lm["sha256"])  # the same image bytes, image for image
        volatile = ["created_at", "answered_at"]  # wall clocks: a real (tiny) model's image is stamped when made
        pd.testing.assert_frame_equal(rm.drop(columns=volatile), lm.drop(columns=volatile))
        stamped = ["answered_at"]  # the classifier's wall clock, per answer
        ll, rl = local[f"{model}/labels"], on_ray[f"{model}/labels"]
        # the second workspace has its own answer cache, so every answer is a fresh model call there too
        assert rl["answered_at"].ne("").all() and ll["answered_at"].ne("").all()
        pd.testing.assert_frame_equal(rl.drop(columns=stamped), ll.drop(columns=stamped))
        lf, rf = local[f"{model}/faces"], on_ray[f"{model}/faces"]
        pd.testing.assert_frame_equal(rf, lf)  # L*, a*, b*, ITA, boxes, statuses
        pd.testing.assert_frame_equal(on_ray[f"{model}/index"], local[f"{model}/index"])
        for space in ("clip", "face"):
            assert np.array_equal(on_ray[f"{model}/{space}"], local[f"{model}/{space}"]), (model, space)
    photos = local["packaged-photos/faces"]
    assert (photos["status"] == "ok").sum() >= 3 and photos["L"].notna().sum() >= 3  # real faces measured
    assert local["packaged-photos/face"].shape[0] >= 3


# --- a worker killed mid-run ---

def dying_once(marker: str, make_fn):
    """Build the real batch function; the first batch any actor runs kills its process (once per marker)."""
    fn = make_fn()

    def batch(items):
        if not os.path.exists(marker):
            Path(marker).write_text(str(os.getpid()))
            os._exit(1)  # no cleanup, no exception: the actor process is gone mid-batch
        return fn(items)

    return batch


@pytest.mark.slow
def test_killed_ray_worker_loses_and_duplicates_nothing(tmp_path, tiny_env, ray_local, monkeypatch):
    from biasaudit.params.execution import Execution, RayOptions
    from biasaudit.pipeline.engine import Stage, run_stage

    on_ray = Execution(runner="ray", ray=RayOptions(num_workers=2))
    models = {"photos": {"backend": "packaged-photos", "width": 96, "height": 96}}
    results = {}
    for name in ("reference", "killed"):
        d = workspace(tmp_path / name, tiny_env, n_prompts=6)
        monkeypatch.chdir(d)
        cfg = config(models=models)
        prompts = pd.read_csv("data/t2i/prompts.csv", dtype={"prompt_id": str})
        spec = cfg.models["photos"]
        revision = preflight("photos", cfg, prompts)
        items = plan_items(prompts, "photos", 2, spec)
        out_dir = Path("data/t2i/images/photos")
        factory = partial(make_generate_fn, "photos", spec, out_dir.as_posix(), revision,
                          8, tuple(prompts["prompt_id"]), cfg.groups)
        marker = str(d / "died-once")
        make_fn = partial(dying_once, marker, factory) if name == "killed" else factory
        stage = Stage("generate photos", items, "image_id", "s", make_fn, out_dir / "log.jsonl", batch_size=2)
        summary = run_stage(stage, on_ray, progress=False).summary
        assert Path(marker).exists() == (name == "killed")  # a worker really died
        assert summary.processed == 12 and summary.status_counts == {"ok": 12}
        lines = [json.loads(x) for x in (out_dir / "log.jsonl").read_text().splitlines()]
        assert len(lines) == 12 and len({r["image_id"] for r in lines}) == 12  # one line per image
        assert sorted(p.name for p in out_dir.glob("*.png")) == sorted(f"{i['image_id']}.png" for i in items)
        assert not list(out_dir.glob(".*.tmp"))
        results[name] = {r["image_id"]: r["sha256"] for r in lines}
    assert results["killed"] == results["reference"]


# --- sharding by hand: several machines, copied together, finished by one unsharded run ---

PHOTOS = {"photos": {"backend": "packaged-photos", "width": 96, "height": 96}}


def test_shards_copied_together_and_merged_by_an_unsharded_run(tmp_path, tiny_env, monkeypatch):
    n_prompts, per_prompt = 5, 2
    total = n_prompts * per_prompt
    # machine A: shard 0 of 3; machine B: shard 1 of 3; machine C: shard 0 of 2 (a re-submitted job with
    # another shard count: overlaps A); shard 2 of 3 never ran (missing)
    machines = {"a": (0, 3), "b": (1, 3), "c": (0, 2)}
    shard_ids = {}
    for name, shard in machines.items():
        d = workspace(tmp_path / name, tiny_env, n_prompts)
        monkeypatch.chdir(d)
        res = run_generate("photos", config(models=PHOTOS, shard=shard), progress=False)
        log = Path("data/t2i/images/photos") / shard_log_path("log.jsonl", *shard).name
        assert log.exists() and not Path("data/t2i/images/photos/manifest.parquet").exists()  # a shard: log only
        assert res.summary["this_run"]["other_shards"] == total - res.summary["this_run"]["processed"]
        shard_ids[name] = set(res.manifest["image_id"])
    assert shard_ids["a"] & shard_ids["c"], "the test needs overlapping shards"

    merged = workspace(tmp_path / "merged", tiny_env, n_prompts)
    for name in machines:  # "copying the folders together"
        shutil.copytree(tmp_path / name / "data/t2i/images", merged / "data/t2i/images", dirs_exist_ok=True)
    monkeypatch.chdir(merged)
    images_dir = Path("data/t2i/images/photos")
    assert len(shard_logs(images_dir / "log.jsonl")) == 3
    done = shard_ids["a"] | shard_ids["b"] | shard_ids["c"]
    final = run_generate("photos", config(models=PHOTOS), progress=False)
    adopted = final.summary["execution"]["adopted_shards"]
    assert len(adopted["adopted"]) == 3 and adopted["overlapping"] == len((shard_ids["a"] | shard_ids["b"]) & shard_ids["c"])
    assert adopted["records"] == len(done)
    this_run = final.summary["this_run"]
    assert this_run["already_done"] == len(done) and this_run["processed"] == total - len(done) > 0  # only the missing shard
    assert not shard_logs(images_dir / "log.jsonl")  # adopted, then removed
    lines = (images_dir / "log.jsonl").read_text().splitlines()
    assert len(lines) == total and len({json.loads(x)["image_id"] for x in lines}) == total

    reference = workspace(tmp_path / "reference", tiny_env, n_prompts)
    monkeypatch.chdir(reference)
    ref = run_generate("photos", config(models=PHOTOS), progress=False)
    cols = ["image_id", "sha256", "path", "status", "seed", "prompt_id", "index"]
    pd.testing.assert_frame_equal(final.manifest[cols], ref.manifest[cols])
    on_disk = pd.read_parquet(merged / "data/t2i/images/photos/manifest.parquet")
    assert len(on_disk) == total and (on_disk["status"] == "ok").all()

    # a shard log made with other settings is adopted, then pruned and redone (never trusted)
    monkeypatch.chdir(merged)
    stale = [json.loads(x) | {"settings_hash": "other"} for x in lines[:2]]
    (images_dir / "log.jsonl").write_text("".join(x + "\n" for x in lines[2:]))
    shard_log_path(images_dir / "log.jsonl", 1, 4).write_text("".join(json.dumps(r) + "\n" for r in stale))
    again = run_generate("photos", config(models=PHOTOS), progress=False)
    assert again.summary["this_run"]["dropped_stale_records"]["other_settings"] == 2
    assert again.summary["this_run"]["processed"] == 2
    assert list(again.manifest["sha256"]) == list(ref.manifest["sha256"])


def test_execution_params_are_validated_and_shared():
    from biasaudit.config import ParamsError

    raw = read_yaml(ROOT / "params.yaml")
    assert set(raw["execution"]) == {"runner", "local_workers", "shard_index", "shard_count", "max_final_share",
                                     "max_transient_runs", "stop_after_same_failures", "ray"}
    for bad, key in (({"runner": "dask"}, "execution.runner"), ({"shard_index": 3, "shard_count": 2}, "shard_index"),
                     ({"max_final_share": 1.5}, "execution.max_final_share"),
                     ({"max_transient_runs": 0}, "execution.max_transient_runs"),
                     ({"stop_after_same_failures": -1}, "execution.stop_after_same_failures"),
                     ({"ray": {"num_workers": 0}}, "execution.ray.num_workers"),
                     ({"local_workers": 0}, "execution.local_workers")):
        r = read_yaml(ROOT / "params.yaml")
        r["execution"] = {**r["execution"], **bad}
        with pytest.raises(ParamsError, match=key):
            validate(r)
    stages = read_yaml(ROOT / "dvc.yaml")["stages"]
    for stage in ("generate", "classify", "faces", "reflect", "baseline", "counterfactuals", "validate_edits"):
        assert "execution" in stages[stage].get("do", stages[stage])["params"], stage
