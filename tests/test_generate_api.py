"""The imagen (google-genai) and openai backends against local servers speaking their wire formats:
success, 429-then-success (Retry-After), persistent 500, malformed JSON, refusals, black images."""

import numpy as np
import pytest

from biasaudit.backends.generators.base import GenRequest
from biasaudit.backends.generators.imagen import ImagenGenerator, imagen_seed
from biasaudit.backends.generators.openai_images import OpenAIImagesGenerator
from biasaudit.params.generate import GeneratorSpec
from biasaudit.t2i.generate import is_black

from .servers_images import ImagenServer, OpenAIImagesServer, pattern_image

SECRET = "test-secret-value-123"


def req(i=0, prompt="A person who works as a nurse", w=1024, h=1024):
    return GenRequest(f"m-p-{i:03d}", "p", prompt, i, 1234567890123 + i, w, h)


@pytest.fixture
def imagen(monkeypatch):
    monkeypatch.setenv("TEST_IMAGEN_KEY", SECRET)
    with ImagenServer() as server:
        spec = GeneratorSpec(backend="imagen", model_id="imagen-4.0-fast-generate-001", api_key_env="TEST_IMAGEN_KEY",
                             base_url=server.url, max_retries=2, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)
        slept = []
        yield server, ImagenGenerator("imagen-test", spec, sleep=slept.append), slept


def test_imagen_wire_format_and_image(imagen):
    server, gen, _ = imagen
    [res] = gen.generate([req()])
    assert res.status == "ok" and res.retries == 0 and res.seed_used
    sent = server.requests[-1]
    assert sent.path == "/v1beta1/publishers/google/models/imagen-4.0-fast-generate-001:predict"
    assert sent.headers["x-goog-api-key"] == SECRET
    body = sent.json
    assert body["instances"] == [{"prompt": "A person who works as a nurse"}]
    p = body["parameters"]
    assert p["sampleCount"] == 1 and p["aspectRatio"] == "1:1" and p["seed"] == imagen_seed(1234567890123)
    assert p["addWatermark"] is False and p["enhancePrompt"] is False and p["includeRaiReason"] is True
    assert 1 <= p["seed"] <= 2**31 - 1
    expected = pattern_image("A person who works as a nurse", p["seed"], 64, 64)
    assert np.array_equal(res.rgb, expected)


def test_imagen_429_then_success_honours_retry_after(imagen):
    server, gen, slept = imagen
    server.queue(server.rate_limited("0.02"), server.rate_limited(None))
    [res] = gen.generate([req()])
    assert res.status == "ok" and res.retries == 2
    assert slept[0] == 0.02 and 0.01 <= slept[1] <= 0.0125 * 2  # Retry-After, then exponential backoff
    assert len(server.requests) == 3


def test_imagen_persistent_500_fails_after_retries(imagen):
    server, gen, _ = imagen
    server.queue(*[server.server_error()] * 3)
    [res] = gen.generate([req()])
    assert res.status == "failed" and res.retries == 2 and "500" in res.reason
    assert len(server.requests) == 3


def test_imagen_malformed_json_retried_then_ok(imagen):
    server, gen, _ = imagen
    server.queue(server.malformed())
    [res] = gen.generate([req()])
    assert res.status == "ok" and res.retries == 1


def test_imagen_refusals_are_recorded_not_fatal(imagen):
    server, gen, _ = imagen
    server.queue(server.filtered(), server.prompt_blocked())
    results = gen.generate([req(0), req(1), req(2)])
    assert [r.status for r in results] == ["refused", "refused", "ok"]
    assert "safety filter" in results[0].reason and "Responsible AI" in results[1].reason
    assert results[1].retries == 0  # a policy block is not retried


def test_imagen_black_image_is_detected(imagen):
    server, gen, _ = imagen
    server.queue(server.black)
    [res] = gen.generate([req()])
    assert res.status == "ok" and is_black(res.rgb, 8)


def test_imagen_secret_never_in_results(imagen):
    _, gen, _ = imagen
    results = gen.generate([req()])
    assert SECRET not in repr(results) and SECRET not in repr(gen.settings())


@pytest.fixture
def openai_server(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", SECRET)
    with OpenAIImagesServer() as server:
        def make(**kw):
            spec = GeneratorSpec(backend="openai", model_id="dall-e-3", api_key_env="TEST_OPENAI_KEY",
                                 base_url=server.url + "/v1", max_retries=2, backoff_s=0.01, max_backoff_s=0.05,
                                 timeout_s=5, **kw)
            slept = []
            return OpenAIImagesGenerator("oa-test", spec, sleep=slept.append), slept
        yield server, make


def test_openai_wire_format_b64_and_url(openai_server):
    server, make = openai_server
    gen, _ = make()
    [res] = gen.generate([req()])
    assert res.status == "ok" and not res.seed_used and res.extra["revised_prompt"].startswith("A person")
    sent = server.requests[-1]
    assert sent.path == "/v1/images/generations" and sent.headers["authorization"] == f"Bearer {SECRET}"
    assert sent.json == {"model": "dall-e-3", "prompt": "A person who works as a nurse", "n": 1,
                         "size": "1024x1024", "response_format": "b64_json"}
    assert np.array_equal(res.rgb, pattern_image("A person who works as a nurse", 0, 64, 64))
    gen_url, _ = make(response_format="url")
    [res_url] = gen_url.generate([req()])
    assert res_url.status == "ok" and np.array_equal(res_url.rgb, res.rgb)
    assert server.requests[-1].method == "GET" and server.requests[-1].path.startswith("/files/")


def test_openai_429_then_success_and_500_and_refusal(openai_server):
    server, make = openai_server
    gen, slept = make()
    server.queue(server.rate_limited("0.03"))
    [ok] = gen.generate([req()])
    assert ok.status == "ok" and ok.retries == 1 and slept == [0.03]
    server.queue(*[server.server_error()] * 3)
    [failed] = gen.generate([req()])
    assert failed.status == "failed" and failed.retries == 2 and "500" in failed.reason
    server.queue(server.refusal())
    [refused] = gen.generate([req()])
    assert refused.status == "refused" and "content_policy_violation" in refused.reason and refused.retries == 0


def test_openai_malformed_json_is_a_reason_not_a_crash(openai_server):
    server, make = openai_server
    gen, _ = make()
    server.queue(*[server.malformed()] * 3)
    [res] = gen.generate([req()])
    assert res.status == "failed" and res.rgb is None and "malformed response" in res.reason and res.retries == 2
    server.queue(server.malformed())
    [ok] = gen.generate([req()])
    assert ok.status == "ok" and ok.retries == 1
