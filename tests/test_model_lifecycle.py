"""Today's models: the lifecycle file, who answered, and the stops that keep a retired or re-routed model from
costing thousands of failed requests.

- The snapshot rule of `answered_as_asked` against names the providers publish (OpenAI's dated snapshots,
  Google's -001 versions) and against near misses that are other models (gpt-5-mini, gemini-3.8-flash).
- A server that answers as another model version: the stage stops with a reason naming both, nothing of that
  answer is logged or cached, and the next run asks again.
- A server that answers 404 for the model: the stage stops after the probe, with 0 item rows written and no
  item request sent.
- The first N items failing with one non-transient error stop the stage (execution.stop_after_same_failures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from biasaudit import lifecycle
from biasaudit.config import read_yaml, validate
from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import Stage, StageStopped, run_stage

from .conftest import ROOT
from .servers_images import GeminiImageServer
from .servers_vlm import VLMServer, classify_config, grey_manifest


@pytest.mark.parametrize("asked,reported,same", [
    ("gpt-5", "gpt-5-2025-08-07", True),            # OpenAI's dated snapshot of the alias asked
    ("gpt-5", "gpt-5-mini-2025-08-07", False),      # another model that shares the prefix
    ("gemini-2.0-flash", "gemini-2.0-flash-001", True),  # Google's stable version of the alias
    ("gemini-2.5-pro", "gemini-3.8-flash", False),  # the re-routing of 2026-12-01
    ("gemini-2.5-flash", "gemini-2.5-flash-lite", False),
    ("qwen3-vl-plus", "qwen3-vl-plus-2025-09-23", True),
    ("models/gemini-3.8-flash", "gemini-3.8-flash", True),
    ("deepseek-ai/deepseek-vl2", "deepseek-ai/deepseek-vl2", True),
    ("gemini-3.8-flash", None, True),                # no name reported: nothing to check
])
def test_answered_as_asked(asked, reported, same):
    assert lifecycle.answered_as_asked(asked, reported) is same


def test_declared_aliases_widen_the_rule_and_nothing_else():
    assert not lifecycle.answered_as_asked("my-model", "my-model-v2")
    assert lifecycle.answered_as_asked("my-model", "my-model-v2", aliases=("my-model-v*",))


def test_the_lifecycle_file_parses_and_refuses_an_entry_without_its_evidence():
    table = lifecycle.table(ROOT / lifecycle.LIFECYCLE_FILE)
    claimed_retired = {k for k, v in table.items() if "retired" in (v.status, v.claimed)}
    assert claimed_retired == {"gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.5-flash-image"}
    # deprecated on a quoted provider page, with a shutdown date: Imagen 4 Fast's has passed, gpt-5's has not
    from datetime import date
    assert table["imagen-4.0-fast-generate-001"].effective(date(2026, 12, 4)) == "retired"
    assert table["gpt-5"].effective(date(2026, 12, 4)) == "deprecated"
    assert all(v.source.startswith("https://") and v.evidence for v in table.values())
    with pytest.raises(ValueError, match="models.m.status"):
        lifecycle.parse({"providers": {"p": ["p.example"]},
                         "models": {"m": {"provider": "p", "status": "gone",
                                          "evidence": [{"url": "https://p.example/x", "says": "s"}]}}})


# --- the engine's stops ----------------------------------------------------------------------------------

def _stage(tmp_path, fn, probe=None, n=30):
    items = [{"id": f"i{k:02d}"} for k in range(n)]
    return Stage("demo", items, "id", "s", lambda: fn, tmp_path / "log.jsonl", batch_size=5, probe=probe)


def test_a_failed_probe_stops_before_any_item(tmp_path):
    calls = []

    def fn(batch):
        calls.append(len(batch))
        return [{"id": b["id"], "status": "ok"} for b in batch]

    with pytest.raises(StageStopped, match="no item sent or recorded: model m is not served"):
        run_stage(_stage(tmp_path, fn, probe=lambda: "model m is not served"), Execution(), progress=False)
    assert calls == []
    assert not (tmp_path / "log.jsonl").exists() or not (tmp_path / "log.jsonl").read_text()


def test_the_first_n_identical_final_failures_stop_the_stage(tmp_path):
    def fn(batch):
        return [{"id": b["id"], "status": "failed", "reason": "HTTP 403: key revoked"} for b in batch]

    with pytest.raises(StageStopped, match="first 10 items all failed with the same error"):
        run_stage(_stage(tmp_path, fn, probe=lambda: ""), Execution(stop_after_same_failures=10), progress=False)
    logged = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(logged) == 10  # two batches of 5, then it stopped: not 30


def test_errors_that_differ_only_by_a_request_id_count_as_one(tmp_path):
    ids = iter(range(1000, 2000))

    def fn(batch):
        return [{"id": b["id"], "status": "failed", "reason": f"HTTP 403: key revoked (request {next(ids)})"}
                for b in batch]

    with pytest.raises(StageStopped, match="first 10 items"):
        run_stage(_stage(tmp_path, fn, probe=lambda: ""), Execution(stop_after_same_failures=10), progress=False)


def test_a_local_stage_whose_items_fail_alike_runs_to_the_end(tmp_path):
    """One source photo without a face fails its ten edits with one reason: data, not a dead model."""
    def fn(batch):
        return [{"id": b["id"], "status": "failed", "reason": "source: no face detected"} for b in batch]

    run = run_stage(_stage(tmp_path, fn), Execution(stop_after_same_failures=10), progress=False)
    assert run.summary.processed == 30


@pytest.mark.parametrize("reasons", [
    ["HTTP 403: key revoked"] * 9 + ["HTTP 400: bad image"],  # two reasons: a data problem, not a dead model
    ["gave up after 4 attempts: HTTP 503"] * 10,              # transient: the service may come back
])
def test_mixed_or_transient_failures_do_not_stop(tmp_path, reasons):
    it = iter(reasons * 3)

    def fn(batch):
        return [{"id": b["id"], "status": "failed", "reason": next(it)} for b in batch]

    run = run_stage(_stage(tmp_path, fn, probe=lambda: ""), Execution(stop_after_same_failures=10), progress=False)
    assert run.summary.processed == 30


@pytest.mark.parametrize("spelled", ["Gemini-2.5-Pro", " gemini-2.5-pro ", "models/gemini-2.5-pro", "gemini-2.5-pro-001",
                                     "gemini-2.5-pro-preview-06-05", "gemini-2.5-pro-latest"])
def test_a_retired_model_is_found_however_it_is_spelled(spelled):
    found = lifecycle.status_of(spelled, ROOT / lifecycle.LIFECYCLE_FILE)
    assert found is not None and found.model_id == "gemini-2.5-pro" and found.claimed == "retired"


def test_another_model_sharing_the_prefix_is_not_taken_for_the_retired_one():
    found = lifecycle.status_of("gemini-2.5-flash-image", ROOT / lifecycle.LIFECYCLE_FILE)
    assert found.model_id == "gemini-2.5-flash-image"
    assert lifecycle.status_of("gemini-2.5-flash-lite", ROOT / lifecycle.LIFECYCLE_FILE) is None


# --- stages against servers that speak the real wire formats --------------------------------------------

def _classify_cfg(server: VLMServer, model: str, tmp_path: Path):
    return classify_config(tmp_path, {"backend": "gemini", "model_id": model, "base_url": server.gemini_url},
                           batch_size=2)


def test_classify_stops_on_an_answer_from_another_model_and_keeps_none_of_it(tmp_path, monkeypatch):
    from biasaudit.t2i import classify

    monkeypatch.chdir(tmp_path)
    grey_manifest(tmp_path, range(30, 230, 50))
    with VLMServer(answers_as="gemini-3.8-flash") as server:  # gemini-2.5-pro re-routed, as since 2026-12-01
        cfg = _classify_cfg(server, "gemini-2.5-pro", tmp_path)
        with pytest.raises(StageStopped) as stopped:
            classify.run_classify("m", cfg, progress=False)
        assert "asked gemini-2.5-pro, answered by gemini-3.8-flash" in str(stopped.value)
        assert server.probes == ["gemini-2.5-pro"]  # the probe passed: models.get answers for the name
        log = Path(classify.C.CLASSIFY_LOGS) / "m.jsonl"
        assert not log.exists() or not log.read_text().strip()  # no label of the wrong model is logged
        from biasaudit.pipeline.io import Cache

        assert len(Cache(tmp_path / "cache.sqlite")) == 0  # nor cached as an answer of the model asked
        # the server answers as itself again: the same stage runs and records who answered
        server.answers_as = ""
        out = classify.run_classify("m", cfg, progress=False)
    table = out["table"]
    assert (table["status"] == "ok").all() and (table["model_version"] == "gemini-2.5-pro").all()


def test_classify_against_a_404_model_stops_after_the_probe_with_no_item_row(tmp_path, monkeypatch):
    from biasaudit.t2i import classify

    monkeypatch.chdir(tmp_path)
    grey_manifest(tmp_path, range(30, 230, 50))
    with VLMServer(unserved=frozenset({"gemini-2.5-flash"})) as server:
        with pytest.raises(StageStopped, match="no item sent or recorded: model gemini-2.5-flash is not served .*404"):
            classify.run_classify("m", _classify_cfg(server, "gemini-2.5-flash", tmp_path), progress=False)
        assert server.probes == ["gemini-2.5-flash"] and server.requests == []  # one probe, no item request
    log = Path(classify.C.CLASSIFY_LOGS) / "m.jsonl"
    assert not log.exists() or not log.read_text().strip()


def _generate_cfg(server, model_id: str):
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = {"g": {"backend": "gemini-image", "model_id": model_id, "api_key_env": "TEST_GEMINI_KEY",
                           "base_url": server.url, "width": 1024, "height": 1024, "thinking_level": "MINIMAL",
                           "max_retries": 0}}
    raw["generate"] = {**raw["generate"], "images_per_prompt": 2}
    return validate(raw)


def _prompts(tmp_path: Path, n: int = 3) -> None:
    (tmp_path / "data/t2i").mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"prompt_id": [f"occ_p{i}" for i in range(n)], "prompt": [f"A person who works as job {i}"
                                                                            for i in range(n)],
                  "template_version": "v1"}).to_csv(tmp_path / "data/t2i/prompts.csv", index=False)


def test_generate_on_the_current_google_model_records_its_version(tmp_path, monkeypatch):
    from biasaudit.t2i.generate import run_generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_GEMINI_KEY", "k")
    _prompts(tmp_path)
    with GeminiImageServer() as server:
        res = run_generate("g", _generate_cfg(server, "gemini-nano-banana-2.1"), progress=False)
    m = res.manifest
    assert len(m) == 6 and (m["status"] == "ok").all() and (m["model_version"] == "gemini-nano-banana-2.1").all()
    assert server.probes == ["gemini-nano-banana-2.1"]


def test_generate_stops_after_the_probe_when_the_model_is_gone(tmp_path, monkeypatch):
    from biasaudit.t2i.generate import run_generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_GEMINI_KEY", "k")
    _prompts(tmp_path)
    with GeminiImageServer() as server:
        server.unserved = {"gemini-2.5-flash-image"}
        with pytest.raises(StageStopped, match="gemini-2.5-flash-image is not served.*404"):
            run_generate("g", _generate_cfg(server, "gemini-2.5-flash-image"), progress=False)
        assert [r.method for r in server.requests] == ["GET"]  # the probe only: not one generateContent
    log = tmp_path / "data/t2i/images/g/log.jsonl"
    assert not log.exists() or not log.read_text().strip()


def test_generate_stops_on_a_re_routed_image_naming_both(tmp_path, monkeypatch):
    from biasaudit.t2i.generate import run_generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_GEMINI_KEY", "k")
    _prompts(tmp_path)
    with GeminiImageServer() as server:
        server.answers_as = "gemini-3.1-flash-image"
        with pytest.raises(StageStopped, match="asked gemini-nano-banana-2.1, answered by gemini-3.1-flash-image"):
            run_generate("g", _generate_cfg(server, "gemini-nano-banana-2.1"), progress=False)
        assert sum(r.method == "POST" for r in server.requests) == 1  # it stopped at the first such image
    log = tmp_path / "data/t2i/images/g/log.jsonl"
    assert not log.exists() or not log.read_text().strip()
    assert not list((tmp_path / "data/t2i/images/g").glob("*.png"))  # the other model's image is not kept


def test_run_records_hold_the_lifecycle_of_the_model_used(tmp_path, monkeypatch):
    from biasaudit.t2i.generate import run_generate

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_GEMINI_KEY", "k")
    _prompts(tmp_path, n=1)
    with GeminiImageServer() as server:
        run_generate("g", _generate_cfg(server, "gemini-nano-banana-2.1"), progress=False)
    summary = json.loads((tmp_path / "data/t2i/images/g/summary.json").read_text())
    status = summary["model_lifecycle"]
    assert status["status"] == "unconfirmed" and status["claimed"] == "served"  # no quote of its page kept
    assert status["source"].startswith("https://ai.google.dev/") and status["missing"]


@pytest.mark.parametrize("listed,expected", [(("deepseek-ai/deepseek-vl2",), ""),
                                             (("Qwen/Qwen2.5-VL-7B-Instruct",), "it serves: Qwen/Qwen2.5-VL-7B-Instruct")])
def test_a_vllm_server_is_probed_through_its_model_list(listed, expected):
    """vLLM implements GET /v1/models (list) but not GET /v1/models/{id}: the probe falls back to the list."""
    from biasaudit.backends.vlm import make_vlm_backend
    from biasaudit.params import VLMSpec

    with VLMServer(retrieve=False) as server:
        server.listed = listed
        backend = make_vlm_backend(VLMSpec(backend="openai", model_id="deepseek-ai/deepseek-vl2",
                                           base_url=server.openai_url, api_key_env="NOPE"))
        why = backend.probe()
        assert server.probes == ["deepseek-ai/deepseek-vl2", "(list)"] and server.requests == []
    assert (why == "") if not expected else (expected in why and "deepseek-ai/deepseek-vl2" in why)


def test_an_openai_model_retired_on_the_server_stops_reflect_after_the_probe(tmp_path):
    from biasaudit.backends.vlm import make_vlm_backend
    from biasaudit.params import VLMSpec

    with VLMServer(unserved=frozenset({"gpt-5"})) as server:
        backend = make_vlm_backend(VLMSpec(backend="openai", model_id="gpt-5", base_url=server.openai_url,
                                           api_key_env="NOPE"))
        why = backend.probe()
    assert "gpt-5" in why and "404" in why and "does not exist" in why


def test_batch_mode_answered_by_another_model_sends_no_online_request(tmp_path, monkeypatch):
    from biasaudit.t2i import classify

    monkeypatch.chdir(tmp_path)
    grey_manifest(tmp_path, range(30, 230, 50))
    with VLMServer(answers_as="gemini-3.8-flash", batch_state="succeed") as server:
        cfg = _classify_cfg(server, "gemini-2.5-pro", tmp_path)
        cfg = cfg.model_copy(update={"classify": cfg.classify.model_copy(
            update={"vlm": cfg.classify.vlm.model_copy(update={"batch_mode": True})})})
        with pytest.raises(StageStopped, match="asked gemini-2.5-pro, answered by gemini-3.8-flash"):
            classify.run_classify("m", cfg, progress=False)
        online = [b for b in server.requests if "contents" in b]
        assert len(server.batches) == 1 and online == []  # the batch job, then no online question
