"""Request capture for every hosted role of the `current` profile (profiles/current.yaml).

Each test builds the role's backend from the profile (biasaudit.cli.profile_params("current")), points it at
a local server speaking the provider's wire format, sends one real request and checks the JSON body and URL
path the server received, field by field, against the provider's documentation (cited per test). Expected
values come from the documentation and from profiles/current.yaml read as plain YAML, never from the code
under test.

Wire-format notes that apply to all Gemini roles:
- google-genai (pinned 3.6.1) serialises nested messages by their proto field names (`thinkingConfig:
  {"thinking_level": ...}`, `inlineData: {"mime_type": ...}`). Proto3's JSON mapping makes parsers accept the
  proto field name and its lowerCamelCase JSON name alike (https://protobuf.dev/programming-guides/json/),
  so bodies are compared under the documented camelCase names after `_camel` (which refuses a body that
  carries both spellings of one field).
- The path is checked for model and method here; the API version (the docs' `/v1beta/`; google-genai 3.x
  defaults to `v1`) is checked on its own in `test_gemini_roles_call_the_documented_v1beta_endpoint`.
- No `candidateCount` to Gemini 3 image models (Google's SDKs deprecate it as unsupported there).
"""

from __future__ import annotations

import base64
import io
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from .servers_edit import GeminiEditServer, darken_centre
from .servers_images import GeminiImageServer, pattern_image
from .servers_vlm import VLMServer, grey_image, grey_pair

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "BIASAUDIT_TEST_PROVIDER_KEY"
KEY = "test-key-123"


# --- the profile: specs from profile_params, expected values from the YAML itself ----------------------------

@pytest.fixture(scope="module")
def profile():
    from biasaudit.cli import profile_params

    return profile_params("current", ROOT / "params.yaml")


@pytest.fixture(scope="module")
def current_yaml() -> dict:
    """profiles/current.yaml as written (dotted keys stay dotted): the expected values."""
    return yaml.safe_load((ROOT / "profiles" / "current.yaml").read_text())


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return KEY_ENV


def _at(spec, server_url: str, key_env: str, **extra):
    """The profile's spec, pointed at the local server (nothing else changed but retries and pacing)."""
    return spec.model_copy(update={"base_url": server_url, "api_key_env": key_env} | extra)


# --- wire helpers ----------------------------------------------------------------------------------------------

def _camel(obj):
    """Proto3 JSON names: snake_case keys → lowerCamelCase, recursively; a body carrying both spellings of a
    field is an error (the API would see the field twice)."""
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out: dict = {}
    for k, v in obj.items():
        name = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), k)
        assert name not in out, f"field {name} sent under two spellings"
        out[name] = _camel(v)
    return out


def _b64(data: str) -> bytes:
    """Base64 as the SDKs send it (google-genai: URL-safe alphabet; openai: standard)."""
    return base64.urlsafe_b64decode(data.replace("+", "-").replace("/", "_") + "=" * (-len(data) % 4))


def _mean_grey(raw: bytes) -> float:
    return float(np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=float).mean())


def _record_paths(server: VLMServer) -> list[str]:
    """The URL path of every generateContent / batchGenerateContent / chat.completions POST (VLMServer keeps the
    bodies only): wraps the instance's handlers, which its request handler looks up per request."""
    paths: list[str] = []
    for name in ("_gemini", "_gemini_batch", "_openai"):
        handler = getattr(server, name)

        def wrapped(h, body, _handler=handler):
            paths.append(h.path.split("?", 1)[0])
            return _handler(h, body)

        setattr(server, name, wrapped)
    return paths


SAMPLING = ("temperature", "topP", "topK", "presencePenalty", "frequencyPenalty")


# --- shared inputs ---------------------------------------------------------------------------------------------

@pytest.fixture
def face(tmp_path) -> str:
    p = tmp_path / "face.png"
    grey_image(p, 25, size=32)
    return str(p)


@pytest.fixture
def pair(tmp_path) -> pd.DataFrame:
    """One source photo, two variants (White man grey 25, Black man grey 229), 32 px; see GREY."""
    return grey_pair(tmp_path, 32)


GREY = {"WM": 25, "BM": 229}  # group code → grey level of its picture in `pair`


def _ab(record: dict) -> list:
    """The grey levels of image A and image B of a 2AFC record, in that order."""
    return [pytest.approx(GREY[record["group_a"]], abs=2), pytest.approx(GREY[record["group_b"]], abs=2)]


def _ask_2afc(profile, vlm_name: str, spec, pair: pd.DataFrame, tmp_path) -> list[dict]:
    """One 2AFC question (income, one order) through the REFLECT stage's own batch function, as the stage builds
    it for this VLM (make_reflect_fn with spec.max_tokens; composite or interleaved per the spec)."""
    from biasaudit.vlm import tasks

    params = profile.reflect.model_copy(update={"composite_dir": str(tmp_path / "composites")})
    items = tasks.two_afc_items(pair, ["income"], tasks.two_afc_prompts(params), both_orders=False)
    assert len(items) == 1
    fn = tasks.make_reflect_fn(spec, str(tmp_path / f"{vlm_name}.sqlite"), vlm_name, params, spec.max_tokens)
    return fn(items)


# =============================================================================================================
# 1. Generator nano-banana-2-1 (gemini-image, gemini-nano-banana-2.1)
# =============================================================================================================

@contextmanager
def _generated(profile, key, prompt: str, seed: int):
    """(server, result) of one image generated by the profile's nano-banana-2-1 against GeminiImageServer."""
    from biasaudit.backends.generators import make_generator
    from biasaudit.backends.generators.base import GenRequest

    with GeminiImageServer() as server:
        spec = _at(profile.models["nano-banana-2-1"], server.url, key, max_retries=0)
        gen = make_generator("nano-banana-2-1", spec)
        [result] = gen.generate([GenRequest("nb-p-000", "p", prompt, 0, seed, spec.width, spec.height)])
        yield server, result


def test_generator_nano_banana_2_1_request_fields(profile, current_yaml, key):
    """Gemini image generation through generateContent.

    Docs: https://ai.google.dev/gemini-api/docs/image-generation (the prompt as `contents[].parts[].text`;
    `generationConfig.responseModalities` ["IMAGE"]; `generationConfig.imageConfig.aspectRatio` / `imageSize`
    "1K" = 1024×1024 at 1:1; the image comes back as `candidates[0].content.parts[].inlineData`), and
    https://ai.google.dev/api/generate-content (GenerationConfig: `responseModalities`, `imageConfig`, `seed`
    (int32), `thinkingConfig.thinkingLevel`; GenerateContentResponse.`modelVersion`). Authentication: the
    `x-goog-api-key` header (https://ai.google.dev/gemini-api/docs/api-key). Thinking MINIMAL: the Imagen
    migration guide maps imagen-4.0-fast-generate-001 to gemini-nano-banana-2.1 with thinking level MINIMAL
    (https://firebase.google.com/docs/ai-logic/imagen-models-migration). Gemini 3 models take no sampling
    parameters (Gemini API changelog 2026-07-21; https://ai.google.dev/gemini-api/docs/gemini-3).
    """
    expected = current_yaml["models"]["nano-banana-2-1"]
    prompt = "A person who works as a nurse, photorealistic ID-style portrait photograph of exactly one person"
    seed = 2**40 + 12345  # a stage seed beyond int32: the wire must still carry an int32
    with _generated(profile, key, prompt, seed) as (server, result):
        [req] = [r for r in server.requests if r.method == "POST"]
        # path: model and method (the API version is checked in test_gemini_roles_call_the_documented_v1beta_endpoint)
        assert re.fullmatch(rf"/v1(beta)?/models/{re.escape(expected['model_id'])}:generateContent", req.path)
        assert req.headers.get("x-goog-api-key") == KEY
        body = _camel(req.json)
        assert body["contents"][0]["parts"][0]["text"] == prompt
        assert len(body["contents"]) == 1 and len(body["contents"][0]["parts"]) == 1
        cfg = body["generationConfig"]
        assert cfg["responseModalities"] == ["IMAGE"]
        assert cfg["imageConfig"] == {"aspectRatio": "1:1", "imageSize": expected["image_size"]}
        assert (expected["width"], expected["height"]) == (1024, 1024)  # the 1:1 row of the 1K table
        assert isinstance(cfg["seed"], int) and 0 <= cfg["seed"] < 2**31 - 1
        assert cfg["thinkingConfig"] == {"thinkingLevel": expected["thinking_level"]} == {"thinkingLevel": "MINIMAL"}
        assert not set(SAMPLING) & set(cfg), f"sampling parameters sent to a Gemini 3 model: {set(SAMPLING) & set(cfg)}"

        # the answer: the inlineData PNG decoded pixel for pixel, and the modelVersion recorded
        assert result.status == "ok", result.reason
        side = 1024 // server.scale
        assert np.array_equal(result.rgb, pattern_image(prompt, cfg["seed"], side, side))
        assert result.extra["model_version"] == expected["model_id"]


def test_generator_sends_no_candidate_count(profile, key):
    with _generated(profile, key, "A nurse", 7) as (server, _):
        [req] = [r for r in server.requests if r.method == "POST"]
    assert "candidateCount" not in _camel(req.json)["generationConfig"]


def test_generator_probe(profile, current_yaml, key):
    """One models.get per probe (GET /v1beta/models/{model}: https://ai.google.dev/api/models#method:-models.get);
    '' when served, a reason naming the model when the API answers 404 NOT_FOUND."""
    from biasaudit.backends.generators import make_generator

    model = current_yaml["models"]["nano-banana-2-1"]["model_id"]
    for served in (True, False):
        with GeminiImageServer() as server:
            if not served:
                server.unserved = {model}
            gen = make_generator("nano-banana-2-1", _at(profile.models["nano-banana-2-1"], server.url, key))
            why = gen.probe()
            assert server.probes == [model]
            [req] = server.requests
            assert req.method == "GET" and re.fullmatch(rf"/v1(beta)?/models/{re.escape(model)}", req.path.split("?")[0])
            if served:
                assert why == ""
            else:
                assert why and model in why


# =============================================================================================================
# 2. Classifier classify.vlm (gemini, gemini-3.5-flash-lite, MINIMAL, constrain, batch mode)
# =============================================================================================================

def _classify_spec(profile, server, key, **extra):
    return _at(profile.classify.vlm, server.gemini_url, key, max_retries=0, batch_poll_s=0.01, **extra)


def _check_classifier_request(request: dict, profile, current_yaml, face: str) -> None:
    body = _camel(request)
    cfg = body["generationConfig"]
    labels = list(profile.classify.labels)
    assert labels == ["white", "black", "asian", "hispanic", "other"]
    assert cfg["responseMimeType"] == "text/x.enum"
    assert cfg["responseSchema"] == {"type": "STRING", "enum": labels}
    assert cfg["thinkingConfig"] == {"thinkingLevel": current_yaml["classify.vlm.thinking_level"]} \
        == {"thinkingLevel": "MINIMAL"}  # a level, no thinkingBudget
    assert not set(SAMPLING) & set(cfg), f"sampling parameters sent to a Gemini 3 model: {set(SAMPLING) & set(cfg)}"
    assert isinstance(cfg["maxOutputTokens"], int) and cfg["maxOutputTokens"] >= profile.classify.vlm.max_tokens
    [content] = body["contents"]
    assert content["role"] == "user"
    kinds = [next(iter(p)) for p in content["parts"]]
    assert kinds == ["inlineData", "text"]
    image, text = content["parts"]
    assert image["inlineData"]["mimeType"] == "image/jpeg"
    raw = _b64(image["inlineData"]["data"])
    assert raw[:3] == b"\xff\xd8\xff"  # a JPEG, as declared
    assert _mean_grey(raw) == pytest.approx(25, abs=2)  # the face sent is the face asked about
    assert text["text"] == profile.classify.instruction


def test_classifier_online_request_fields(profile, current_yaml, key, face):
    """generateContent for the classifier (the online path: every batch item a job did not answer goes here).

    Docs: https://ai.google.dev/api/generate-content (GenerationConfig `responseMimeType`, `responseSchema`,
    `maxOutputTokens`, `thinkingConfig.thinkingLevel`; Part `inlineData {mimeType, data}`),
    https://ai.google.dev/gemini-api/docs/structured-output (enums: `responseMimeType: "text/x.enum"` with
    `responseSchema {"type": "STRING", "enum": [...]}`), https://ai.google.dev/gemini-api/docs/thinking
    (thinking levels; thinking tokens count against maxOutputTokens). gemini-3.5-flash-lite: "use
    thinking_level.MINIMAL for ... classification"; custom temperature / top-K / top-P are not supported
    (https://docs.cloud.google.com/vertex-ai/generative-ai/docs/models/gemini/3-5-flash-lite; Gemini API
    changelog 2026-07-21 deprecates sampling parameters for Gemini 3).
    """
    from biasaudit.backends.vlm import VLMRequest, make_vlm_backend

    model = current_yaml["classify.vlm.model_id"]
    with VLMServer() as server:
        paths = _record_paths(server)
        backend = make_vlm_backend(_classify_spec(profile, server, key, batch_mode=False))
        [r] = backend.generate([VLMRequest(images=(face,), prompt=profile.classify.instruction,
                                           options=tuple(profile.classify.labels),
                                           max_tokens=profile.classify.vlm.max_tokens)])
        assert r.status == "ok" and r.text == "white" and r.meta["model_version"] == model
        assert len(server.requests) == 1 and len(paths) == 1
        assert re.fullmatch(rf"/v1(beta)?/models/{re.escape(model)}:generateContent", paths[0])
        _check_classifier_request(server.requests[0], profile, current_yaml, face)


def test_classifier_batch_mode_request_fields(profile, current_yaml, key, face):
    """The profile's batch mode (classify.vlm.batch_mode: true): models.batchGenerateContent with the same
    GenerateContentRequest inlined. Docs: https://ai.google.dev/gemini-api/docs/batch-mode (inline requests:
    `batch.inputConfig.requests.requests[].request`), plus the generate-content pages cited above."""
    from biasaudit.backends.vlm import VLMRequest, make_vlm_backend

    model = current_yaml["classify.vlm.model_id"]
    assert current_yaml["classify.vlm.batch_mode"] is True
    with VLMServer() as server:
        paths = _record_paths(server)
        backend = make_vlm_backend(_classify_spec(profile, server, key))
        [r] = backend.generate([VLMRequest(images=(face,), prompt=profile.classify.instruction,
                                           options=tuple(profile.classify.labels),
                                           max_tokens=profile.classify.vlm.max_tokens)])
        assert r.status == "ok" and r.text == "white" and r.meta["via"] == "batch"
        assert server.requests == []  # no online call: the job answered it
        assert len(paths) == 1 and re.fullmatch(rf"/v1(beta)?/models/{re.escape(model)}:batchGenerateContent",
                                                paths[0])
        [[inlined]] = server.batch_requests.values()
        _check_classifier_request(inlined["request"], profile, current_yaml, face)


def test_classifier_probe(profile, current_yaml, key):
    """One models.get (https://ai.google.dev/api/models#method:-models.get) per probe; 404 names the model."""
    from biasaudit.backends.vlm import make_vlm_backend

    model = current_yaml["classify.vlm.model_id"]
    for unserved in (frozenset(), frozenset({model})):
        with VLMServer(unserved=unserved) as server:
            why = make_vlm_backend(_classify_spec(profile, server, key)).probe()
            assert server.probes == [model]
            assert (why == "") if not unserved else (bool(why) and model in why)


# =============================================================================================================
# 3. VLM gemini-3.8-flash (gemini, thinking LOW, max_tokens 64): a 2AFC question, labels interleaved
# =============================================================================================================

def test_vlm_gemini_3_8_flash_2afc_request_fields(profile, current_yaml, key, pair, tmp_path):
    """A 2AFC question: "Image A:", image A, "Image B:", image B, the question, in one user turn.

    Docs: https://ai.google.dev/gemini-api/docs/image-understanding (several images in one request, as
    `inlineData` parts interleaved with text parts), https://ai.google.dev/api/generate-content (Content.parts
    order is the prompt order; GenerationConfig `thinkingConfig.thinkingLevel`, `maxOutputTokens`),
    https://ai.google.dev/gemini-api/docs/thinking. Gemini 3.8 Flash supports thinking levels LOW, MEDIUM, HIGH
    (https://docs.cloud.google.com/gemini-enterprise-agent-platform/models/guides/gemini-3-8-flash); no
    sampling parameters for Gemini 3 (Gemini API changelog 2026-07-21).
    """
    expected = current_yaml["vlms"]["gemini-3.8-flash"]
    with VLMServer() as server:
        paths = _record_paths(server)
        spec = _at(profile.vlms["gemini-3.8-flash"], server.gemini_url, key, max_retries=0)
        records = _ask_2afc(profile, "gemini-3.8-flash", spec, pair, tmp_path)
        assert len(records) == 1 and records[0]["two_afc_mode"] == "interleaved"
        assert records[0]["model_version"] == expected["model_id"]
        [request] = server.requests
        assert re.fullmatch(rf"/v1(beta)?/models/{re.escape(expected['model_id'])}:generateContent", paths[0])
    body = _camel(request)
    parts = body["contents"][0]["parts"]
    assert [next(iter(p)) for p in parts] == ["text", "inlineData", "text", "inlineData", "text"]
    assert parts[0]["text"] == "Image A:" and parts[2]["text"] == "Image B:"
    assert parts[4]["text"] == profile.reflect.task_specs["2afc_income"].prompt
    assert [p["inlineData"]["mimeType"] for p in (parts[1], parts[3])] == ["image/jpeg", "image/jpeg"]
    assert [_mean_grey(_b64(p["inlineData"]["data"])) for p in (parts[1], parts[3])] == _ab(records[0])
    cfg = body["generationConfig"]
    assert cfg["thinkingConfig"] == {"thinkingLevel": expected["thinking_level"]} == {"thinkingLevel": "LOW"}
    assert not set(SAMPLING) & set(cfg), f"sampling parameters sent to a Gemini 3 model: {set(SAMPLING) & set(cfg)}"
    assert cfg["maxOutputTokens"] >= expected["max_tokens"]
    assert cfg["responseMimeType"] == "text/x.enum" and cfg["responseSchema"] == {"type": "STRING", "enum": ["A", "B"]}


def test_vlm_gemini_3_8_flash_probe(profile, current_yaml, key):
    """One models.get per probe (https://ai.google.dev/api/models#method:-models.get); 404 names the model."""
    from biasaudit.backends.vlm import make_vlm_backend

    model = current_yaml["vlms"]["gemini-3.8-flash"]["model_id"]
    for unserved in (frozenset(), frozenset({model})):
        with VLMServer(unserved=unserved) as server:
            why = make_vlm_backend(_at(profile.vlms["gemini-3.8-flash"], server.gemini_url, key)).probe()
            assert server.probes == [model]
            assert (why == "") if not unserved else (bool(why) and model in why)


# =============================================================================================================
# 4-6. OpenAI chat completions: gpt-6.1-sol (OpenAI), qwen3-vl-plus (DashScope), Llama / DeepSeek (vLLM)
# =============================================================================================================

def _content_kinds(body: dict) -> list[str]:
    [message] = body["messages"]
    assert message["role"] == "user"
    return [p["type"] for p in message["content"]]


def _image_urls(body: dict) -> list[str]:
    return [p["image_url"]["url"] for p in body["messages"][0]["content"] if p["type"] == "image_url"]


def _data_url_grey(url: str) -> float:
    m = re.fullmatch(r"data:(image/[a-z]+);base64,(.+)", url)
    assert m, f"not a base64 data URL: {url[:40]}"
    raw = base64.b64decode(m.group(2), validate=True)
    assert m.group(1) == "image/jpeg" and raw[:3] == b"\xff\xd8\xff"
    return _mean_grey(raw)


def test_vlm_gpt_6_1_sol_request_fields(profile, current_yaml, key, pair, tmp_path):
    """POST /v1/chat/completions for a reasoning model.

    Docs: https://platform.openai.com/docs/api-reference/chat/create — `model`; `messages[].content` as parts
    `{"type": "text", "text"}` / `{"type": "image_url", "image_url": {"url"}}` where url may be "the base64
    encoded image data" as a data URL; `max_completion_tokens` ("an upper bound ... including visible output
    tokens and reasoning tokens"); `max_tokens` "deprecated in favor of max_completion_tokens, and is not
    compatible with o-series models"; `reasoning_effort`; `response_format {"type": "json_schema",
    "json_schema": {name, strict, schema}}`. GPT-6.1 Sol takes effort low and up (no none/minimal) and, with
    reasoning on, no temperature / top_p (OpenAI's GPT-6.1 Sol model page and "Using GPT-6" migration notes).
    """
    expected = current_yaml["vlms"]["gpt-6.1-sol"]
    with VLMServer() as server:
        paths = _record_paths(server)
        spec = _at(profile.vlms["gpt-6.1-sol"], server.openai_url, key, max_retries=0)
        records = _ask_2afc(profile, "gpt-6.1-sol", spec, pair, tmp_path)
        assert len(records) == 1 and records[0]["model_version"] == expected["model_id"]
        [body] = server.requests
        assert paths == ["/v1/chat/completions"]
    assert body["model"] == expected["model_id"]
    assert _content_kinds(body) == ["text", "image_url", "text", "image_url", "text"]
    content = body["messages"][0]["content"]
    assert content[0]["text"] == "Image A:" and content[2]["text"] == "Image B:"
    assert content[4]["text"] == profile.reflect.task_specs["2afc_income"].prompt
    assert [_data_url_grey(u) for u in _image_urls(body)] == _ab(records[0])
    assert "max_tokens" not in body
    assert isinstance(body["max_completion_tokens"], int)
    assert body["max_completion_tokens"] > expected["max_tokens"]  # room for the reasoning tokens as well
    assert body["reasoning_effort"] == expected["reasoning_effort"] == "low"
    assert "temperature" not in body and "top_p" not in body
    rf = body["response_format"]
    assert rf["type"] == "json_schema"
    schema = rf["json_schema"]["schema"]
    assert rf["json_schema"]["strict"] is True and rf["json_schema"]["name"]
    assert schema["properties"]["answer"]["enum"] == ["A", "B"] and schema["required"] == ["answer"]
    assert schema["additionalProperties"] is False


def test_vlm_qwen3_vl_plus_request_fields(profile, current_yaml, key, pair, tmp_path):
    """DashScope's OpenAI-compatible mode (compatible-mode/v1/chat/completions), not a reasoning model.

    Docs: https://www.alibabacloud.com/help/en/model-studio/qwen-vl-compatible-with-openai (qwen3-vl-plus is
    listed; `messages[].content` parts `{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,..."}}`
    and `{"type": "text"}`; `max_tokens`; `temperature` in [0, 2)).
    """
    expected = current_yaml["vlms"]["qwen3-vl-plus"]
    assert expected["base_url"].endswith("/compatible-mode/v1")
    with VLMServer() as server:
        paths = _record_paths(server)
        spec = _at(profile.vlms["qwen3-vl-plus"], server.openai_url, key, max_retries=0)
        records = _ask_2afc(profile, "qwen3-vl-plus", spec, pair, tmp_path)
        assert len(records) == 1 and records[0]["two_afc_mode"] == "interleaved"
        [body] = server.requests
        assert paths == ["/v1/chat/completions"]  # base_url + /chat/completions
    assert body["model"] == expected["model_id"]
    assert _content_kinds(body) == ["text", "image_url", "text", "image_url", "text"]
    assert [_data_url_grey(u) for u in _image_urls(body)] == _ab(records[0])
    assert body["max_tokens"] == expected["max_tokens"]
    assert "max_completion_tokens" not in body and "reasoning_effort" not in body
    assert isinstance(body["temperature"], (int, float)) and 0 <= body["temperature"] < 2


def test_vlm_qwen3_vl_plus_after_the_documented_json_schema_rejection(profile, current_yaml, key, face):
    """DashScope documents JSON Schema mode for some qwen-plus models only
    (https://www.alibabacloud.com/help/en/model-studio/qwen-structured-output), so qwen3-vl-plus may answer the
    json_schema response_format with HTTP 400. The question is then asked once more without it: the second body
    has no response_format and still carries max_tokens and temperature."""
    from biasaudit.backends.vlm import VLMRequest, make_vlm_backend

    expected = current_yaml["vlms"]["qwen3-vl-plus"]
    with VLMServer(reject_schema=True) as server:
        backend = make_vlm_backend(_at(profile.vlms["qwen3-vl-plus"], server.openai_url, key, max_retries=0))
        [r] = backend.generate([VLMRequest(images=(face,), prompt="race?", options=("white", "black"), max_tokens=16)])
        first, second = server.requests
    assert first["response_format"]["type"] == "json_schema"
    assert "response_format" not in second
    assert all(isinstance(b["max_tokens"], int) and 0 < b["max_tokens"] <= expected["max_tokens"] for b in (first, second))
    assert "temperature" in second and "max_completion_tokens" not in second
    assert r.status == "ok" and r.text == "white"


@pytest.mark.parametrize("vlm_name, images_per_request", [("llama-3.2-90b-vision", 1), ("deepseek-vl2", 2)])
def test_vllm_2afc_images_per_request(profile, current_yaml, key, pair, tmp_path, vlm_name, images_per_request):
    """vLLM's OpenAI-compatible server (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html,
    Chat Completions with `image_url` parts; https://docs.vllm.ai/en/latest/features/multimodal_inputs.html):
    Llama 3.2 Vision gets one image per request (profile: two_afc_mode composite; both faces side by side on
    one picture), DeepSeek-VL2 two images, each after its label."""
    expected = current_yaml["vlms"][vlm_name]
    with VLMServer() as server:
        paths = _record_paths(server)
        spec = _at(profile.vlms[vlm_name], server.openai_url, key, max_retries=0)
        records = _ask_2afc(profile, vlm_name, spec, pair, tmp_path)
        assert [r["two_afc_mode"] for r in records] == [expected.get("two_afc_mode", "interleaved")]
        [body] = server.requests
        assert paths == ["/v1/chat/completions"]
    assert body["model"] == expected["model_id"]
    urls = _image_urls(body)
    assert len(urls) == images_per_request
    if images_per_request == 1:
        assert _content_kinds(body) == ["image_url", "text"]
        grey = _data_url_grey(urls[0])
        assert 25 < grey < 229  # both faces (and the label strip) on the one picture
        assert body["messages"][0]["content"][1]["text"].endswith(profile.reflect.task_specs["2afc_income"].prompt)
    else:
        assert _content_kinds(body) == ["text", "image_url", "text", "image_url", "text"]
        assert [_data_url_grey(u) for u in urls] == _ab(records[0])
    assert body["max_tokens"] == expected["max_tokens"] and "temperature" in body


OPENAI_ROLES = ["gpt-6.1-sol", "qwen3-vl-plus", "llama-3.2-90b-vision", "deepseek-vl2"]


@pytest.mark.parametrize("vlm_name", OPENAI_ROLES)
def test_openai_compatible_probe(profile, current_yaml, key, vlm_name):
    """Served: exactly one models.retrieve (GET /v1/models/{model}:
    https://platform.openai.com/docs/api-reference/models/retrieve; the SDK percent-encodes the '/' of a Hub id)
    and ''. Not served (404 model_not_found, and a model list that does not name it): a reason naming it."""
    from biasaudit.backends.vlm import make_vlm_backend

    model = current_yaml["vlms"][vlm_name]["model_id"]
    with VLMServer() as server:
        why = make_vlm_backend(_at(profile.vlms[vlm_name], server.openai_url, key)).probe()
        assert server.probes == [model] and server.requests == []
        assert why == ""
    with VLMServer(unserved=frozenset({model})) as server:
        why = make_vlm_backend(_at(profile.vlms[vlm_name], server.openai_url, key)).probe()
        assert server.probes[0] == model and server.requests == []  # the retrieve first; no chat request
        assert why and model in why


@pytest.mark.parametrize("vlm_name", ["llama-3.2-90b-vision", "deepseek-vl2"])
def test_vllm_probe_falls_back_to_the_model_list(profile, current_yaml, key, vlm_name):
    """vLLM's OpenAI-compatible server lists its models (GET /v1/models) and has no per-model retrieve
    (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html): the retrieve's 404 is followed by one
    list request; '' when the list names the model, a reason naming it when it does not."""
    from biasaudit.backends.vlm import make_vlm_backend

    model = current_yaml["vlms"][vlm_name]["model_id"]
    for listed in ((model,), ("some-other/model",)):
        with VLMServer(retrieve=False) as server:
            server.listed = listed
            why = make_vlm_backend(_at(profile.vlms[vlm_name], server.openai_url, key)).probe()
            assert server.probes == [model, "(list)"] and server.requests == []
            assert (why == "") if model in listed else (bool(why) and model in why)


# =============================================================================================================
# 7. Editor counterfactuals (gemini, gemini-nano-banana-2.1)
# =============================================================================================================

@contextmanager
def _edited(profile, key, face: str):
    """(server, result, instruction) of one counterfactual edit (Black_man) by the profile's editor."""
    from biasaudit.backends.editors import make_editor
    from biasaudit.backends.editors.base import EditRequest

    cf = profile.counterfactuals
    with GeminiEditServer() as server:
        editor = make_editor(_at(cf, server.url, key, max_retries=0))
        description = cf.target_descriptions["Black_man"]
        instruction = cf.instruction.format(target=description)
        [result] = editor.edit([EditRequest(face, "Black_man", description, instruction, cf.seed)])
        yield server, result, instruction


def test_editor_counterfactuals_request_fields(profile, current_yaml, key, face):
    """Image editing: the photo and the instruction in one user turn, image output asked for.

    Docs: https://ai.google.dev/gemini-api/docs/image-generation ("Image editing (text-and-image-to-image)":
    the image as an `inlineData` part beside the text part; `generationConfig.responseModalities` including
    "IMAGE"; the edited image comes back as `inlineData`), https://ai.google.dev/api/generate-content
    (GenerationConfig `seed`, int32; GenerateContentResponse `modelVersion`).
    """
    model = current_yaml["counterfactuals.model_id"]
    with _edited(profile, key, face) as (server, result, instruction):
        [req] = [r for r in server.requests if r.method == "POST"]
        assert re.fullmatch(rf"/v1(beta)?/models/{re.escape(model)}:generateContent", req.path)
        assert req.headers.get("x-goog-api-key") == KEY
        body = _camel(req.json)
        [content] = body["contents"]
        images = [p["inlineData"] for p in content["parts"] if "inlineData" in p]
        texts = [p["text"] for p in content["parts"] if "text" in p]
        assert len(images) == 1 and texts == [instruction] and len(content["parts"]) == 2
        assert images[0]["mimeType"] == "image/png"
        raw = _b64(images[0]["data"])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        source = np.asarray(Image.open(face).convert("RGB"))
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")), source)  # lossless, as is
        cfg = body["generationConfig"]
        assert "IMAGE" in cfg["responseModalities"]
        assert isinstance(cfg["seed"], int) and 0 <= cfg["seed"] < 2**31 - 1
        assert not set(SAMPLING) & set(cfg)

        assert result.status == "ok", result.reason
        assert np.array_equal(result.image, darken_centre(raw))  # the returned inlineData, decoded
        assert result.meta["model_version"] == model


def test_editor_sends_no_candidate_count(profile, key, face):
    with _edited(profile, key, face) as (server, _, _):
        [req] = [r for r in server.requests if r.method == "POST"]
    assert "candidateCount" not in _camel(req.json)["generationConfig"]


def test_editor_probe(profile, current_yaml, key):
    """One models.get per probe (https://ai.google.dev/api/models#method:-models.get); 404 names the model."""
    from biasaudit.backends.editors import make_editor

    model = current_yaml["counterfactuals.model_id"]
    for served in (True, False):
        with GeminiEditServer() as server:
            if not served:
                server.unserved = {model}
            why = make_editor(_at(profile.counterfactuals, server.url, key)).probe()
            assert server.probes == [model]
            assert len(server.requests) == 1 and server.requests[0].method == "GET"
            assert (why == "") if served else (bool(why) and model in why)


# =============================================================================================================
# The API version of every Gemini role
# =============================================================================================================

@pytest.mark.parametrize("role", ["generator", "classifier-online", "classifier-batch", "gemini-3.8-flash", "editor"])
def test_gemini_roles_call_the_documented_v1beta_endpoint(role, profile, current_yaml, key, face, pair, tmp_path):
    from biasaudit.backends.vlm import VLMRequest, make_vlm_backend

    if role == "generator":
        with _generated(profile, key, "A nurse", 7) as (server, _):
            path = server.requests[-1].path
        model, method = current_yaml["models"]["nano-banana-2-1"]["model_id"], "generateContent"
    elif role == "editor":
        with _edited(profile, key, face) as (server, _, _):
            path = server.requests[-1].path
        model, method = current_yaml["counterfactuals.model_id"], "generateContent"
    elif role.startswith("classifier"):
        with VLMServer() as server:
            paths = _record_paths(server)
            backend = make_vlm_backend(_classify_spec(profile, server, key, batch_mode=role.endswith("batch")))
            backend.generate([VLMRequest(images=(face,), prompt="race?", options=tuple(profile.classify.labels))])
        path, model = paths[0], current_yaml["classify.vlm.model_id"]
        method = "batchGenerateContent" if role.endswith("batch") else "generateContent"
    else:
        with VLMServer() as server:
            paths = _record_paths(server)
            spec = _at(profile.vlms["gemini-3.8-flash"], server.gemini_url, key, max_retries=0)
            _ask_2afc(profile, "gemini-3.8-flash", spec, pair, tmp_path)
        path, model, method = paths[0], current_yaml["vlms"]["gemini-3.8-flash"]["model_id"], "generateContent"
    assert path.split("?")[0] == f"/v1beta/models/{model}:{method}"
