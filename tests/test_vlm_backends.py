"""VLM backends: strict parsing, the cache, and the API clients against local servers speaking the
real Gemini / OpenAI wire formats (429, 500, malformed bodies, refusals, batch stall fallback)."""

from __future__ import annotations

import json

import pytest

from biasaudit.backends.vlm import CachedVLM, Price, TokenBucket, VLMRequest, make_vlm_backend
from biasaudit.backends.vlm.parse import parse_choice, parse_usd
from biasaudit.params.classify import VLMSpec

from .servers_vlm import LABELS, VLMServer, grey_image


@pytest.mark.parametrize("text,expected", [
    ("White", ("white", "")), ("**Black**", ("black", "")), ("Answer: hispanic/latino.", ("hispanic", "")),
    ("Caucasian", ("white", "")), ("asian - the person appears East Asian", ("asian", "")),
    ("  other\n", ("other", "")),
])
def test_parse_choice_accepts_one_label(text, expected):
    assert parse_choice(text, LABELS) == expected


@pytest.mark.parametrize("text,reason", [
    ("", "empty answer"), (None, "empty answer"), ("white or hispanic", "several options: white, hispanic"),
    ("purple", "off-list answer: purple"), ("I cannot determine race from a photo.", "refusal"),
    ("Sorry, I won't classify people by race", "refusal"),
])
def test_parse_choice_rejects_with_reason(text, reason):
    label, why = parse_choice(text, LABELS)
    assert label is None and why.startswith(reason)


@pytest.mark.parametrize("text,expected", [
    ("A.", "A"), ("**B**", "B"), ("Answer: c", "C"), ("(d) because", "D"), ("b", "B"),
    ("A and B", None), ("a person", None),
])
def test_parse_choice_letters(text, expected):
    assert parse_choice(text, ("A", "B", "C", "D"))[0] == expected


@pytest.mark.parametrize("text,value,reason", [
    ("$85,000", 85000, ""), ("85k", 85000, ""), ("USD 85000 per year", 85000, ""),
    ("$80,000-$90,000", 85000, "range: 80000-90000"), ("80k to 90k", 85000, "range: 80000-90000"),
    ("about $1.2 million", 1200000, ""), ("I can't guess a salary", None, "refusal"),
    ("$50,000 or $60,000", None, "several amounts"), ("no idea", None, "no amount"),
])
def test_parse_usd(text, value, reason):
    got, why = parse_usd(text)
    assert got == value and why.startswith(reason)


def test_token_bucket_spaces_calls():
    now = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        now[0] += s

    bucket = TokenBucket(per_minute=60, burst=1, clock=lambda: now[0], sleep=sleep)
    for _ in range(3):
        bucket.acquire()
    assert sleeps == pytest.approx([1.0, 1.0])  # 60/min → one per second after the first


@pytest.fixture
def images(tmp_path):
    paths = []
    for i, level in enumerate([10, 70, 120, 170, 230]):  # → white, black, asian, hispanic, other
        p = tmp_path / f"img{i}.png"
        grey_image(p, level)
        paths.append(str(p))
    return paths


def _spec(**kw):
    base = dict(temperature=0.0, max_retries=2, retry_backoff_s=0.01, concurrency=2, timeout_s=10.0)
    return VLMSpec(**{**base, **kw})


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_api_backend_answers_and_retries(kind, images, tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "secret-not-written")
    with VLMServer(script=["429", "500"]) as server:
        url = server.openai_url if kind == "openai" else server.gemini_url
        spec = _spec(backend=kind, model_id="m-test", base_url=url, api_key_env="TEST_KEY", concurrency=1)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite",
                        Price(input_per_mtok=1.0, output_per_mtok=10.0))
        reqs = [VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in images]
        out = vlm.generate(reqs)
        assert [r.text for r in out] == list(LABELS)
        assert all(r.status == "ok" and not r.from_cache for r in out)
        assert server.calls == len(images) + 2  # the 429 and the 500 were retried once each
        assert vlm.backend.stats["retries"] == 2
        acc = vlm.accounting
        assert acc.calls == 5 and acc.cache_hits == 0 and acc.tokens_in > 0
        assert acc.cost_usd == pytest.approx((acc.tokens_in * 1.0 + acc.tokens_out * 10.0) / 1e6)
        # second pass: all from the cache, no request reaches the server
        again = vlm.generate(reqs)
        assert server.calls == len(images) + 2 and all(r.from_cache for r in again)
        assert vlm.accounting.cache_hits == 5
        sent = str(server.requests)
        assert "secret-not-written" not in sent


def test_openai_constrains_to_labels_and_downscales(images, tmp_path, monkeypatch):
    from PIL import Image
    big = tmp_path / "big.png"
    Image.new("RGB", (900, 600), (10, 10, 10)).save(big)
    with VLMServer() as server:
        spec = _spec(backend="openai", model_id="m", base_url=server.openai_url, api_key_env="NOPE", image_max_side=128)
        backend = make_vlm_backend(spec)
        out = backend.generate([VLMRequest(images=(str(big),), prompt="race?", options=LABELS)])
        assert out[0].text == "white"
        body = server.requests[0]
        assert body["temperature"] == 0.0
        assert body["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"] == list(LABELS)
        import base64
        import io
        data = body["messages"][0]["content"][0]["image_url"]["url"].split(",", 1)[1]
        assert max(Image.open(io.BytesIO(base64.b64decode(data))).size) == 128


def test_gemini_request_is_constrained_and_thinking_off(images, tmp_path):
    with VLMServer() as server:
        spec = _spec(backend="gemini", model_id="gemini-2.5-flash", base_url=server.gemini_url, api_key_env="NOPE")
        make_vlm_backend(spec).generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS)])
        cfg = server.requests[0]["generationConfig"]
        assert cfg["temperature"] == 0.0
        thinking = cfg["thinkingConfig"]  # proto JSON accepts either spelling; this SDK sends snake_case
        assert thinking.get("thinkingBudget", thinking.get("thinking_budget")) == 0
        assert cfg["responseMimeType"] == "text/x.enum"
        assert cfg["responseSchema"]["enum"] == list(LABELS)


@pytest.mark.parametrize("kind", ["openai", "gemini"])
@pytest.mark.parametrize("behaviour,status,reason", [
    ("malformed", "failed", "malformed"), ("refuse", "refused", ""), ("text-refuse", "ok", ""),
    ("offlist", "ok", ""),
])
def test_api_backend_bad_answers_are_statuses(kind, behaviour, status, reason, images, tmp_path):
    with VLMServer(script=[behaviour]) as server:
        url = server.openai_url if kind == "openai" else server.gemini_url
        spec = _spec(backend=kind, model_id="m", base_url=url, api_key_env="NOPE", max_retries=0, constrain=False)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        r = vlm.generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS)])[0]
        assert r.status == status and reason in r.reason
        if status == "failed":  # failures are not cached: the next run asks again
            assert vlm.generate([VLMRequest(images=(images[0],), prompt="race?", options=LABELS)])[0].status == "ok"


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_persistent_errors_give_up_with_reason(kind, images, tmp_path):
    with VLMServer(script=["500"] * 3) as server:
        url = server.openai_url if kind == "openai" else server.gemini_url
        spec = _spec(backend=kind, model_id="m", base_url=url, api_key_env="NOPE", max_retries=2, concurrency=1)
        r = make_vlm_backend(spec).generate([VLMRequest(images=(images[0],), prompt="q", options=LABELS),
                                             VLMRequest(images=(images[1],), prompt="q", options=LABELS)])
        assert r[0].status == "failed" and "gave up after 3 attempts" in r[0].reason
        assert r[1].status == "ok" and r[1].text == "black"


def test_unreadable_image_is_a_failed_response(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    with VLMServer() as server:
        spec = _spec(backend="openai", model_id="m", base_url=server.openai_url, api_key_env="NOPE")
        r = make_vlm_backend(spec).generate([VLMRequest(images=(str(bad),), prompt="q")])[0]
        assert r.status == "failed" and "not an image" in r.reason and server.calls == 0


def test_gemini_batch_mode_half_price_and_stall_fallback(images, tmp_path):
    price = Price(input_per_mtok=1.0, output_per_mtok=1.0, batch_discount=0.5)
    reqs = [VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in images]
    with VLMServer(batch_state="succeed") as server:
        spec = _spec(backend="gemini", model_id="g", base_url=server.gemini_url, api_key_env="NOPE", batch_mode=True)
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "a.sqlite", price)
        out = vlm.generate(reqs)
        assert [r.text for r in out] == list(LABELS) and all(r.meta.get("via") == "batch" for r in out)
        assert server.calls == 1 and vlm.accounting.batch_calls == 5
        assert vlm.accounting.cost_usd == pytest.approx(0.5 * 5 * 261 / 1e6)
    with VLMServer(batch_state="stall") as server:
        spec = _spec(backend="gemini", model_id="g", base_url=server.gemini_url, api_key_env="NOPE", batch_mode=True,
                     batch_stall_timeout_s=0.2, batch_poll_s=0.05)
        backend = make_vlm_backend(spec)
        out = backend.generate(reqs)
        assert [r.text for r in out] == list(LABELS) and not any(r.meta.get("via") == "batch" for r in out)
        assert server.cancelled == ["batches/job1"] and backend.stats["batch_fallbacks"] == 1
        assert "stalled" in backend.batch_note


def test_missing_api_key_stops_before_any_work(monkeypatch):
    monkeypatch.delenv("SURELY_UNSET_KEY", raising=False)
    with pytest.raises(RuntimeError, match="SURELY_UNSET_KEY"):
        make_vlm_backend(VLMSpec(backend="gemini", model_id="g", api_key_env="SURELY_UNSET_KEY"))


def test_file_backend(images, tmp_path):
    csv = tmp_path / "labels.csv"
    csv.write_text("image_id,label\nimg0,White\nimg1,not sure\n")
    backend = make_vlm_backend(VLMSpec(backend="file", model_id=str(csv)))
    out = backend.generate([VLMRequest(images=(p,), prompt="", options=LABELS) for p in images[:3]])
    assert [r.text for r in out[:2]] == ["White", "not sure"]
    assert out[2].status == "failed" and "no row for img2" in out[2].reason


@pytest.mark.slow
def test_tiny_clip_backend_zero_shot(images, tmp_path, monkeypatch):
    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(tmp_path / "tiny"))
    backend = make_vlm_backend(VLMSpec(backend="tiny", model_id="tiny-open-clip", local_batch_size=2))
    assert backend.stand_in
    out = backend.generate([VLMRequest(images=(p,), prompt="", options=LABELS) for p in images])
    for r in out:
        assert r.status == "ok" and r.text in LABELS
        assert sum(r.option_probs.values()) == pytest.approx(1.0, abs=1e-5)
        assert r.text == max(r.option_probs, key=r.option_probs.get)
    # the same seeded weights give the same answers
    again = make_vlm_backend(VLMSpec(backend="tiny", model_id="tiny-open-clip")).generate(
        [VLMRequest(images=(images[0],), prompt="", options=LABELS)])
    assert again[0].option_probs == pytest.approx(out[0].option_probs, abs=1e-6)


def test_gemini_batch_job_of_a_killed_run_is_picked_up_not_resubmitted(images, tmp_path):
    reqs = [VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in images]
    with VLMServer(batch_state="stall") as server:
        spec = _spec(backend="gemini", model_id="g", base_url=server.gemini_url, api_key_env="NOPE", batch_mode=True,
                     batch_poll_s=0.01)

        def killed(_seconds):
            raise KeyboardInterrupt  # the process dies while its job waits in the queue

        first = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        first.backend._sleep = killed
        with pytest.raises(KeyboardInterrupt):
            first.generate(reqs)
        assert server.calls == 1 and "batches/job1" in (tmp_path / "c.batches.json").read_text()
        server.complete_batch("batches/job1")
        second = CachedVLM(make_vlm_backend(spec), tmp_path / "c.sqlite")
        out = second.generate(reqs)
        assert [r.text for r in out] == list(LABELS)
        assert all(r.meta.get("batch_job") == "batches/job1" for r in out)
        assert server.calls == 1  # no second job was paid for
        assert second.backend.stats["batch_resumed"] == 1
        assert json.loads((tmp_path / "c.batches.json").read_text()) == {}


def test_load_pil_serves_repeats_from_memory_and_rereads_a_changed_file(tmp_path):
    import os

    import numpy as np
    from PIL import Image

    from biasaudit.backends.vlm import base

    path = tmp_path / "a.png"
    Image.fromarray(np.full((64, 96, 3), 10, np.uint8)).save(path)
    first, _ = base.load_pil(str(path), max_side=48)
    hits = base._cached_pil.cache_info().hits
    second, _ = base.load_pil(str(path), max_side=48)
    assert base._cached_pil.cache_info().hits == hits + 1
    assert first.size == second.size == (48, 32) and first is not second  # each caller its own copy
    second.paste((255, 0, 0), (0, 0, 8, 8))
    assert np.asarray(base.load_pil(str(path), max_side=48)[0])[0, 0].tolist() == [10, 10, 10]
    Image.fromarray(np.full((64, 96, 3), 200, np.uint8)).save(path)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert np.asarray(base.load_pil(str(path))[0])[0, 0].tolist() == [200, 200, 200]
    img, reason = base.load_pil(str(tmp_path / "missing.png"))
    assert img is None and "missing file" in reason
