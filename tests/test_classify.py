"""classify@<model>: manifest → labels through the cache; statuses; kill-and-resume with zero repeats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from biasaudit.backends.vlm import CachedVLM, VLMResponse, make_vlm_backend
from biasaudit.params.classify import VLMSpec
from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import run_local
from biasaudit.pipeline.io import RecordLog
from biasaudit.t2i import classify as cl

from .servers_vlm import LABELS, VLMServer, grey_image

LEVELS = [10, 70, 120, 170, 230, 20, 80]  # → white black asian hispanic other white black


def make_manifest(tmp_path, n=None):
    rows = []
    for i, level in enumerate(LEVELS[:n or len(LEVELS)]):
        p = tmp_path / f"m-p{i % 3}-{i:03d}.png"
        grey_image(p, level)
        rows.append({"image_id": p.stem, "model": "m", "prompt_id": f"p{i % 3}", "path": str(p), "status": "ok",
                     "reason": ""})
    rows.append({"image_id": "m-p0-099", "model": "m", "prompt_id": "p0", "path": None, "status": "refused",
                 "reason": "safety filter"})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("response,expected", [
    (VLMResponse("White", "ok"), ("white", "ok", "")),
    (VLMResponse("white or black", "ok"), ("unknown", "unparsed", "several options: white, black")),
    (VLMResponse("I can't tell race", "ok"), ("unknown", "refused", "refusal: I can't tell race")),
    (VLMResponse("", "refused", "finish reason SAFETY"), ("unknown", "refused", "finish reason SAFETY")),
    (VLMResponse("", "failed", "HTTP 500"), ("unknown", "failed", "HTTP 500")),
])
def test_label_from_response(response, expected):
    assert cl.label_from_response(response, LABELS) == expected


def test_classify_openai_server_and_second_run_makes_no_calls(tmp_path):
    manifest = make_manifest(tmp_path)
    items = cl.items_from_manifest(manifest)
    with VLMServer(script=["ok", "text-refuse"]) as server:
        spec = VLMSpec(backend="openai", model_id="m", base_url=server.openai_url, api_key_env="NOPE",
                       concurrency=1, constrain=False)
        for run in range(2):
            vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "cache.sqlite")
            log = RecordLog(tmp_path / f"log{run}.jsonl", key="image_id")  # a fresh log: only the cache helps
            run_local(items, cl.make_batch_fn(vlm, "race?", "v1", LABELS), log, batch_size=3, progress=False, execution=Execution())
            table = cl.labels_table(log.records(), items)
            if run == 0:
                assert vlm.accounting.calls == 7
            else:
                assert vlm.accounting.calls == 0 and vlm.accounting.cache_hits == 7 and table.from_cache[:7].all()
        assert server.calls == 7
    assert list(table.columns[:13]) == cl.LABEL_COLUMNS[:13]
    assert table.loc[1, "status"] == "refused" and table.loc[1, "label"] == "unknown"
    assert table.loc[1, "raw_answer"].startswith("I cannot")
    ok = table[table.status == "ok"]
    expected = {f"m-p{i % 3}-{i:03d}": LABELS[min(lv // 51, 4)] for i, lv in enumerate(LEVELS)}
    assert all(ok.label == ok.image_id.map(expected))
    skipped = table[table.image_id == "m-p0-099"].iloc[0]
    assert skipped.status == "skipped" and "safety filter" in skipped.reason


SCRIPT = textwrap.dedent("""
    import sys, pandas as pd
    from biasaudit.backends.vlm import CachedVLM, make_vlm_backend
    from biasaudit.pipeline.io import RecordLog
    from biasaudit.params.classify import VLMSpec
    from biasaudit.params.execution import Execution
    from biasaudit.pipeline.engine import run_local
    from biasaudit.t2i import classify as cl
    url, d = sys.argv[1], sys.argv[2]
    items = cl.items_from_manifest(pd.read_parquet(d + "/manifest.parquet"))
    spec = VLMSpec(backend="openai", model_id="m", base_url=url, api_key_env="NOPE", concurrency=1, timeout_s=30.0)
    vlm = CachedVLM(make_vlm_backend(spec), d + "/cache.sqlite")
    run_local(items, cl.make_batch_fn(vlm, "race?", "v1", ("white", "black", "asian", "hispanic", "other")),
              RecordLog(d + "/log.jsonl", key="image_id"), batch_size=100, progress=False, execution=Execution())
    print("calls", vlm.accounting.calls)
""")


@pytest.mark.slow
def test_sigkill_mid_batch_then_resume_repeats_no_answered_call(tmp_path):
    manifest = make_manifest(tmp_path)
    manifest.to_parquet(tmp_path / "manifest.parquet")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # one batch of 7: the server answers 3, then holds the 4th until we SIGKILL the client
    with VLMServer(script=["ok", "ok", "ok", "hang"]) as server:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, server.openai_url, str(tmp_path)], env=env)
        deadline = time.time() + 60
        while server.calls < 4 and time.time() < deadline:
            time.sleep(0.05)
        assert server.calls == 4
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (tmp_path / "log.jsonl").exists() or (tmp_path / "log.jsonl").read_text() == ""  # batch unfinished
        out = subprocess.run([sys.executable, "-c", SCRIPT, server.openai_url, str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "calls 4" in out.stdout  # the 3 answered before the kill came from the cache
        assert sum(server.answered.values()) == 7 and max(server.answered.values()) == 1  # zero repeats
    labels = RecordLog(tmp_path / "log.jsonl", key="image_id").to_frame()
    assert (labels.status == "ok").sum() == 7


def test_run_classify_costs_batch_answers_at_the_discount_from_its_records(tmp_path, monkeypatch):
    """The stage's accounting is summed from the records (as under Ray, where the counters live in the
    actors): a Gemini batch-mode answer is billed at batch_discount, a cached one not at all."""
    from biasaudit.config import read_yaml, validate

    from .conftest import ROOT

    monkeypatch.chdir(tmp_path)
    img_dir = tmp_path / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    manifest = make_manifest(img_dir, n=4)
    manifest["path"] = [os.path.relpath(p, tmp_path) if isinstance(p, str) else None for p in manifest["path"]]
    manifest.to_parquet(img_dir / "manifest.parquet", index=False)
    with VLMServer(batch_state="succeed") as server:
        raw = read_yaml(ROOT / "params.yaml")
        raw["models"] = {"m": {"backend": "packaged-photos", "width": 64, "height": 64}}
        raw["classify"] = {**raw["classify"], "batch_size": 4, "prices": {
                               "g": {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "batch_discount": 0.5}},
                           "vlm": {**raw["classify"]["vlm"], "backend": "gemini", "model_id": "g",
                                   "base_url": server.gemini_url, "api_key_env": "NOPE", "batch_mode": True,
                                   "constrain": False}}
        cfg = validate(raw)
        first = cl.run_classify("m", cfg, progress=False)
        second = cl.run_classify("m", cfg.model_copy(update={"classify": cfg.classify.model_copy(
            update={"retry_failed": True})}), progress=False)
    acc = first["accounting"]
    # by hand from the server's usage (260 prompt + 1 answer token per image), 4 images, half price
    assert acc["batch_calls"] == 4 and acc["cost_usd"] == pytest.approx(0.5 * 4 * (260 * 1.0 + 1 * 2.0) / 1e6)
    assert acc["requests"] == 4 and first["table"].set_index("image_id").loc["m-p0-099", "status"] == "skipped"
    assert second["summary"].processed == 0 and second["accounting"]["cost_usd"] == 0
