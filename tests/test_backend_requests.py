"""Request capture: what each hosted client puts on the wire, against the constraints the APIs document.

- gpt-5 (a reasoning model): no `max_tokens`, no `temperature`, `max_completion_tokens` covering the
  reasoning reserve plus the answer, `reasoning_effort`; a 400 naming a parameter is one clear reason.
- Gemini 2.5 Pro: thinking stays on, `maxOutputTokens` ≥ thinking budget + answer tokens.
- An empty MAX_TOKENS answer is failed, asked once more with a larger budget, and never cached.
- gpt-image-1: no `response_format`.
- 2AFC: "Image A:" / "Image B:" interleaved with the images in every backend, both orders × both modes.
- Gemini batch mode with 1,000 items: three jobs (API maximum 400), polled concurrently, a bounded
  number of polls, the items a job did not answer asked online one by one.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.backends.vlm import CachedVLM, VLMRequest, make_vlm_backend
from biasaudit.backends.vlm.openai_chat import REASONING_RESERVE, Capabilities, capabilities
from biasaudit.params import VLMSpec
from biasaudit.params.vlm import Reflect

from .servers_vlm import LABELS, VLMServer, grey_image, grey_pair

LEVELS = (25, 76, 127, 178, 229)  # bin centres: white, black, asian, hispanic, other


def _spec(**kw) -> VLMSpec:
    base = dict(max_retries=2, retry_backoff_s=0.0, timeout_s=5.0, concurrency=2, api_key_env="NOPE")
    return VLMSpec(**(base | kw))


@pytest.fixture
def images(tmp_path):
    paths = []
    for level, name in zip(LEVELS, LABELS):
        p = tmp_path / f"{name}.png"
        grey_image(p, level)
        paths.append(str(p))
    return paths


def _gen_config(body: dict) -> dict:
    return body.get("generationConfig") or body.get("generation_config") or {}


def _thinking_budget(cfg: dict) -> int:
    tc = cfg.get("thinkingConfig") or cfg.get("thinking_config") or {}
    return tc.get("thinkingBudget", tc.get("thinking_budget"))


# --- OpenAI reasoning models ---------------------------------------------------------------------

def test_capability_table():
    assert capabilities("gpt-5") == Capabilities(True, "max_completion_tokens", False, "minimal")
    assert capabilities("gpt-5-mini", "low").effort == "low"
    assert capabilities("o4-mini").reasoning and capabilities("o3").reasoning
    for model in ("gpt-5-chat-latest", "gpt-4o", "meta-llama/Llama-3.2-90B-Vision-Instruct", "qwen3-vl-plus"):
        assert capabilities(model) == Capabilities(False, "max_tokens", True, ""), model


def test_gpt5_request_has_no_max_tokens_and_no_temperature(images):
    with VLMServer(reasoning_tokens=300) as server:
        backend = make_vlm_backend(_spec(backend="openai", model_id="gpt-5", base_url=server.openai_url,
                                         max_tokens=64))
        out = backend.generate([VLMRequest(images=(images[1],), prompt="race?", options=LABELS, max_tokens=64),
                                VLMRequest(images=(images[2],), prompt="salary?", max_tokens=16)])
        assert [r.status for r in out] == ["ok", "ok"] and out[0].text == "black"
        for body in server.requests:  # (concurrent: in any order)
            answer = 64 if "response_format" in body else 16
            assert "max_tokens" not in body and "temperature" not in body
            assert body["reasoning_effort"] == "minimal"
            assert body["max_completion_tokens"] == answer + REASONING_RESERVE["minimal"]
            assert body["max_completion_tokens"] >= server.reasoning_tokens + 1


def test_a_400_naming_a_parameter_is_one_clear_failure(images):
    with VLMServer() as server:
        backend = make_vlm_backend(_spec(backend="openai", model_id="gpt-5", base_url=server.openai_url))
        backend.caps = Capabilities(False, "max_tokens", True, "")  # as the old client sent it
        [r] = backend.generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS)])
        assert r.status == "failed" and r.reason.startswith("unsupported parameter 'max_tokens'")
        assert server.calls == 1  # a 400 is not retried


def test_reasoning_budget_too_small_is_failed_then_retried_larger(images):
    with VLMServer(reasoning_tokens=REASONING_RESERVE["minimal"] + 100) as server:
        spec = _spec(backend="openai", model_id="gpt-5", base_url=server.openai_url, max_tokens=16)
        [r] = make_vlm_backend(spec).generate([VLMRequest(images=(images[0],), prompt="q", max_tokens=16)])
        first, second = (b["max_completion_tokens"] for b in server.requests)
        assert second == 4 * first and r.status == "ok" and r.meta["budget_retry"]


# --- Gemini thinking ------------------------------------------------------------------------------

def test_gemini_25_pro_budget_covers_thinking_and_answer(images):
    with VLMServer(thinking_tokens=120) as server:
        spec = _spec(backend="gemini", model_id="gemini-2.5-pro", base_url=server.gemini_url, max_tokens=64,
                     thinking_budget=128)
        out = make_vlm_backend(spec).generate([VLMRequest(images=(images[3],), prompt="race?", options=LABELS,
                                                          max_tokens=64),
                                               VLMRequest(images=(images[3],), prompt="salary?", max_tokens=16)])
        assert [r.text for r in out] == ["hispanic", "hispanic"] and all(r.status == "ok" for r in out)
        for body in server.requests:
            cfg = _gen_config(body)
            answer = 64 if "responseSchema" in cfg else 16
            assert _thinking_budget(cfg) == 128  # thinking stays on
            assert cfg["maxOutputTokens"] >= 128 + answer
        assert out[0].tokens_out == 1 + 120  # thoughts are billed as output
    with VLMServer() as server:  # 2.5 Pro cannot switch thinking off: 0 becomes its minimum, 128
        spec = _spec(backend="gemini", model_id="gemini-2.5-pro", base_url=server.gemini_url, thinking_budget=0)
        make_vlm_backend(spec).generate([VLMRequest(images=(images[0],), prompt="q", options=LABELS)])
        assert _thinking_budget(_gen_config(server.requests[0])) == 128


def test_empty_max_tokens_answer_is_failed_retried_once_and_never_cached(images, tmp_path):
    with VLMServer(script=["max-tokens", "max-tokens"]) as server:
        spec = _spec(backend="gemini", model_id="gemini-2.5-flash", base_url=server.gemini_url, max_tokens=16)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        [r] = vlm.generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS, max_tokens=16)])
        assert r.status == "failed" and "MAX_TOKENS" in r.reason and server.calls == 2
        first, second = (_gen_config(b)["maxOutputTokens"] for b in server.requests)
        assert second == 4 * first
        # not cached: a re-run asks again, and this time the answer arrives
        again = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        [r2] = again.generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS, max_tokens=16)])
        assert r2.status == "ok" and r2.text == "white" and not r2.from_cache and server.calls == 3
    with VLMServer(script=["max-tokens"]) as server:
        spec = _spec(backend="gemini", model_id="gemini-2.5-flash", base_url=server.gemini_url)
        [r] = make_vlm_backend(spec).generate([VLMRequest(images=(images[4],), prompt="q", options=LABELS)])
        assert r.status == "ok" and r.text == "other" and r.meta["budget_retry"]


def test_an_empty_ok_written_by_an_older_version_is_not_replayed(images, tmp_path):
    from biasaudit.backends.vlm import VLMResponse

    with VLMServer() as server:
        spec = _spec(backend="gemini", model_id="g", base_url=server.gemini_url)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        req = VLMRequest(images=(images[1],), prompt="race?", options=LABELS)
        vlm.cache.set(vlm.key(req), VLMResponse("", "ok").to_json())
        [r] = vlm.generate([req])
        assert r.status == "ok" and r.text == "black" and not r.from_cache and server.calls == 1


# --- gpt-image-1 ------------------------------------------------------------------------------

def test_gpt_image_1_sends_no_response_format(monkeypatch):
    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.openai_images import OpenAIImagesGenerator
    from biasaudit.params.generate import GeneratorSpec

    from .servers_images import OpenAIImagesServer

    monkeypatch.setenv("TEST_OPENAI_KEY", "k")
    with OpenAIImagesServer() as server:
        spec = GeneratorSpec(backend="openai", model_id="gpt-image-1", api_key_env="TEST_OPENAI_KEY",
                             base_url=server.url + "/v1", max_retries=0, timeout_s=5)
        gen = OpenAIImagesGenerator("gi", spec)
        [res] = gen.generate([GenRequest("gi-p-000", "p", "A nurse", 0, 1, 1024, 1024)])
        assert res.status == "ok", res.reason
        body = server.requests[-1].json
        assert "response_format" not in body and body["model"] == "gpt-image-1"
        assert gen.settings()["response_format"] == "(not sent)"
        # the server rejects it as the API does: sending it explicitly is a schema error
        with pytest.raises(ValueError, match="response_format"):
            GeneratorSpec(backend="openai", model_id="gpt-image-1", api_key_env="K", response_format="b64_json")


# --- 2AFC -----------------------------------------------------------------------------------

def _decode_grey(b64: str) -> np.ndarray:
    raw = base64.urlsafe_b64decode(b64.replace("+", "-").replace("/", "_") + "=" * (-len(b64) % 4))
    return np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=float)


@pytest.fixture
def pair(tmp_path):
    """One source photo with two variants: WM (grey 25) and BM (grey 229)."""
    return grey_pair(tmp_path, 64)


def _items(pair, params):
    from biasaudit.vlm import tasks

    items = tasks.two_afc_items(pair, ["income"], tasks.two_afc_prompts(params), both_orders=True)
    assert [(i["group_a"], i["group_b"]) for i in items] == [("BM", "WM"), ("WM", "BM")]
    return items


@pytest.mark.parametrize("backend", ["openai", "gemini"])
@pytest.mark.parametrize("mode", ["interleaved", "composite"])
def test_2afc_labels_in_both_orders_and_both_modes(backend, mode, pair, tmp_path):
    from biasaudit.vlm import tasks

    params = Reflect(composite_dir=str(tmp_path / "composites"))
    items = _items(pair, params)
    grey = {"WM": 25.0, "BM": 229.0}
    with VLMServer() as server:
        url = server.openai_url if backend == "openai" else server.gemini_url
        spec = _spec(backend=backend, model_id="m", base_url=url, image_format="PNG", two_afc_mode=mode,
                     concurrency=1)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        records = tasks.make_batch_fn(vlm, "m", params)(items)
        assert [r["two_afc_mode"] for r in records] == [mode, mode]
        assert all(r["status"] in ("ok", "failed") for r in records)
        for item, body in zip(items, server.requests):
            if backend == "openai":
                parts = body["messages"][0]["content"]
                seq = [("text", p["text"]) if p["type"] == "text" else ("image", p["image_url"]["url"].split(",", 1)[1])
                       for p in parts]
            else:
                parts = body["contents"][0]["parts"]
                seq = [("text", p["text"]) if "text" in p else ("image", (p.get("inlineData") or p["inline_data"])["data"])
                       for p in parts]
            kinds = [k for k, _ in seq]
            if mode == "interleaved":
                assert kinds == ["text", "image", "text", "image", "text"]
                assert seq[0][1] == "Image A:" and seq[2][1] == "Image B:"
                assert _decode_grey(seq[1][1]).mean() == pytest.approx(grey[item["group_a"]], abs=1)
                assert _decode_grey(seq[3][1]).mean() == pytest.approx(grey[item["group_b"]], abs=1)
                assert seq[4][1] == item["prompt"]
            else:
                assert kinds == ["image", "text"]
                assert seq[1][1].startswith(params.prompts.two_afc_composite_note) and seq[1][1].endswith(item["prompt"])
                img = _decode_grey(seq[0][1])
                h, w = img.shape
                assert h == 48 + 64  # the 64-px faces keep their resolution (never enlarged), below the label strip
                body_rows = img[48:]
                left, right = body_rows[:, : w // 2 - 10], body_rows[:, w // 2 + 10:]
                assert left.mean() == pytest.approx(grey[item["group_a"]], abs=2)
                assert right.mean() == pytest.approx(grey[item["group_b"]], abs=2)


def test_compose_pair_prints_both_labels():
    from biasaudit.vlm.tasks import compose_pair

    a = np.full((100, 80, 3), 200, np.uint8)
    b = np.full((50, 40, 3), 100, np.uint8)
    out = compose_pair(a, b, height=120, strip=40)
    assert out.shape == (160, 96 + 16 + 96, 3)
    assert (out[40:, :96] == 200).all() and (out[40:, 96 + 16:] == 100).all()  # tiles at equal height
    strip_left, strip_right = out[:40, :96], out[:40, 96 + 16:]
    assert (strip_left < 100).any() and (strip_right < 100).any()  # a printed label above each tile
    assert (out[:40, 96:112] == 255).all()


@pytest.mark.slow  # builds the tiny Qwen2-VL once (~10 s)
def test_transformers_prompt_interleaves_labels():
    from biasaudit.backends.vlm.tiny import make_tiny_qwen2_vl

    backend = make_tiny_qwen2_vl(VLMSpec(backend="tiny", model_id="tiny-qwen2-vl"))
    text = backend.prompt_text(VLMRequest(images=("a.png", "b.png"), prompt="Who?", image_labels=("Image A:", "Image B:")))
    a, b, q = text.index("Image A:"), text.index("Image B:"), text.index("Who?")
    pads = [i for i in range(len(text)) if text.startswith("<|vision_start|>", i)]
    assert len(pads) == 2 and a < pads[0] < b < pads[1] < q


# --- batch mode ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_gemini_batch_mode_1000_items_bounded_polls_and_per_item_fallback(tmp_path):
    """1,000 pending items → 3 jobs (≤ 400 each), polled concurrently until done (3 polls each),
    one item per job answered with an error → asked online; everything right and cached."""
    paths, truth = [], []
    for i in range(1000):
        level = LEVELS[i % 5]
        img = np.full((32, 32, 3), level, np.uint8)
        img[0, 0] = [i % 256, i // 256, 0]  # unique image (own cache key); the mean stays in its bin
        p = tmp_path / f"img{i:04d}.png"
        Image.fromarray(img).save(p)
        paths.append(str(p))
        truth.append(LABELS[i % 5])
    with VLMServer(batch_state="poll", polls_to_finish=3, batch_item_errors=frozenset({7})) as server:
        spec = _spec(backend="gemini", model_id="gemini-2.5-flash", base_url=server.gemini_url, batch_mode=True,
                     batch_max_requests=400, batch_poll_s=0.01, batch_stall_timeout_s=60, concurrency=4,
                     image_format="PNG")
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        requests = [VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in paths]
        stored = vlm.prefetch(requests)
        assert stored == 1000 - 3
        assert len(server.batches) == 3 and sorted(len(r) for r in server.batch_requests.values()) == [200, 400, 400]
        assert sum(server.polls.values()) == 3 * 3  # each job polled until done, no more
        # the stage's batches of 16 now come from the cache; the three errored items are asked online
        out = []
        for start in range(0, 1000, 16):
            out += vlm.generate(requests[start:start + 16])
        assert [r.text for r in out] == truth and all(r.status == "ok" for r in out)
        online = [b for b in server.requests]  # generateContent bodies (batch bodies are not recorded)
        assert len(online) == 3
        assert sum(r.meta.get("via") == "batch" for r in out) == 997
        assert vlm.backend.stats["batch_jobs"] == 3 and vlm.accounting.batch_calls == 997
        assert vlm.backend.batch_polls == 9


@pytest.mark.slow
def test_classify_stage_in_batch_mode_submits_the_whole_run_at_once(tmp_path, monkeypatch):
    """run_classify with batch_mode: 40 pending images → ceil(40 / 16) = 3 jobs for the whole run
    (not one per runner batch of 8), then the runner's batches come from the cache."""
    from pathlib import Path

    from biasaudit.config import read_yaml, validate
    from biasaudit.t2i.classify import run_classify

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    img_dir = tmp_path / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    rows = []
    for i in range(40):
        p = img_dir / f"m-p{i % 4}-{i:03d}.png"
        img = np.full((32, 32, 3), LEVELS[i % 5], np.uint8)
        img[0, 0] = [i, 0, 0]
        Image.fromarray(img).save(p)
        rows.append({"image_id": p.stem, "model": "m", "prompt_id": f"p{i % 4}", "path": str(p), "status": "ok",
                     "reason": ""})
    pd.DataFrame(rows).to_parquet(img_dir / "manifest.parquet")
    with VLMServer(batch_state="poll", polls_to_finish=2) as server:
        raw = read_yaml(root / "params.yaml")
        raw["models"] = {"m": {"backend": "packaged-photos", "width": 512, "height": 512}}
        raw["benchmarks"]["gender_set"] = ""  # the race question alone (gender is a second question of its own)
        raw["classify"] |= {"batch_size": 8, "cache_path": str(tmp_path / "cache.sqlite"),
                            "vlm": {"backend": "gemini", "model_id": "gemini-2.5-flash", "base_url": server.gemini_url,
                                    "api_key_env": "NOPE", "batch_mode": True, "batch_max_requests": 16,
                                    "batch_poll_s": 0.01, "image_format": "PNG", "max_retries": 0}}
        cfg = validate(raw)
        out = run_classify("m", cfg, progress=False)
        table = out["table"].set_index("image_id")
        assert [table.loc[r["image_id"], "label"] for r in rows] == [LABELS[i % 5] for i in range(40)]
        assert len(server.batches) == 3 and not server.requests  # no online call, 3 jobs for the run
        assert out["accounting"]["batch_calls"] == 40 and out["accounting"]["cache_hits"] == 0
