"""Defects of the real (non-stand-in) paths, each against what the API, protocol or library documents:

- structured-output fallback: any HTTP 400 to a request carrying the JSON-schema response_format is asked
  once more as plain text (DashScope's 400s need not name the schema); a 400 to a plain request fails;
- content-policy refusals are matched on whole words or field names ("constraint" holds "rai");
- the InsightFace download resumes a response that ended before its Content-Length (a clean short read)
  with a Range request from where it stopped, and only then checks the sha256;
- the vLLM commands install vLLM into a venv of their own; DeepSeek-VL2 is served with interleaved
  text/image placeholders and no source-checkout template path; its 2AFC request, as the reflect stage
  builds it, puts each label right before its image;
- InsightFace records the device its ONNX sessions run on, and onnxruntime.preload_dlls() is called.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shlex
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.backends.vlm import CachedVLM, VLMRequest, make_vlm_backend
from biasaudit.backends.vlm.openai_chat import PLAIN_AFTER_REJECTION, SCHEMA
from biasaudit.params import VLMSpec

from .servers_vlm import LABELS, VLMServer, grey_image

ROOT = Path(__file__).resolve().parents[1]

# DashScope's answer to a json_schema request for a model without that mode, as seen in the field: it
# names neither response_format nor json_schema
DASHSCOPE_400 = {"message": "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 30720]",
                 "type": "invalid_request_error", "param": None, "code": "invalid_parameter_error"}


# --- 1. structured-output fallback on any 400 ---------------------------------------------------------

def _spec(url: str, **kw) -> VLMSpec:
    return VLMSpec(**({"backend": "openai", "model_id": "qwen3-vl-plus", "base_url": url, "api_key_env": "NOPE",
                       "max_retries": 1, "retry_backoff_s": 0.0, "timeout_s": 5.0, "concurrency": 1,
                       "max_tokens": 32, "image_format": "PNG"} | kw))


@pytest.fixture
def greys(tmp_path):
    paths = []
    for level, name in ((25, "white"), (76, "black")):  # the server's label bins: 0-50 white, 51-101 black
        grey_image(tmp_path / f"{name}.png", level)
        paths.append(str(tmp_path / f"{name}.png"))
    return paths


def _formats(server: VLMServer) -> list:
    return [(b.get("response_format") or {}).get("type") for b in server.requests]


def test_a_400_naming_neither_response_format_nor_json_schema_falls_back_to_plain(greys):
    with VLMServer(schema_error=DASHSCOPE_400) as server:
        backend = make_vlm_backend(_spec(server.openai_url))
        out = backend.generate([VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in greys])
        formats = _formats(server)
    # question 1: with the schema (400), then once without it; question 2: without it (the server said no)
    assert formats == ["json_schema", None, None]
    assert [r.status for r in out] == ["ok", "ok"] and [r.text for r in out] == ["white", "black"]
    assert [r.meta["answer_mode"] for r in out] == [PLAIN_AFTER_REJECTION] * 2
    assert "Range of input length should be [1, 30720]" in out[0].meta["schema_rejection"]
    assert backend.stats["schema_fallbacks"] == 1


def test_an_invalid_value_400_to_a_schema_request_is_asked_once_more_as_plain_text(greys):
    with VLMServer(script=["400"]) as server:  # {"error": {"message": "Invalid value", ...}}
        backend = make_vlm_backend(_spec(server.openai_url))
        [r] = backend.generate([VLMRequest(images=(greys[0],), prompt="race?", options=LABELS)])
        formats = _formats(server)
    assert formats == ["json_schema", None]
    assert r.status == "ok" and r.text == "white" and r.meta["answer_mode"] == PLAIN_AFTER_REJECTION
    assert "Invalid value" in r.meta["schema_rejection"]


def test_a_400_to_a_plain_request_stays_a_failure(greys):
    with VLMServer(script=["400"]) as server:
        backend = make_vlm_backend(_spec(server.openai_url, constrain=False))
        [r] = backend.generate([VLMRequest(images=(greys[0],), prompt="race?", options=LABELS)])
        formats = _formats(server)
    assert formats == [None]  # asked once, never again
    assert r.status == "failed" and "400" in r.reason and "schema_rejection" not in r.meta
    assert not backend.schema_rejected and backend.stats.get("schema_fallbacks", 0) == 0


def test_a_400_that_the_plain_question_gets_too_fails_and_the_schema_stays(greys):
    with VLMServer(script=["400", "400"]) as server:  # the request itself is at fault, not the schema
        backend = make_vlm_backend(_spec(server.openai_url))
        out = backend.generate([VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in greys])
        formats = _formats(server)
    assert formats == ["json_schema", None, "json_schema"]  # question 2 is asked with the schema again
    assert out[0].status == "failed" and "Invalid value" in out[0].meta["schema_rejection"]
    assert out[1].status == "ok" and out[1].text == "black" and out[1].meta["answer_mode"] == SCHEMA


# --- 2. policy refusals on whole words ----------------------------------------------------------------

@pytest.mark.parametrize("text", ["constraint", "brain", "terrain", "training",
                                  "Invalid argument: the aspect ratio must satisfy the constraint 1:1|3:4",
                                  "The request was unblocked", "Raise the limit", "", None])
def test_words_that_merely_contain_a_policy_word_are_not_refusals(text):
    from biasaudit.backends.transport import is_policy_refusal

    assert not is_policy_refusal(text)


@pytest.mark.parametrize("text", [
    "The prompt could not be submitted. This prompt contains sensitive words that violate Google's "
    "Responsible AI practices.",
    "Image generation failed: blocked by safety filters",
    "RAI", "filtered by the RAI filter", "raiFilteredReason", "rai_filtered_reason", "raiMediaFilteredReasons",
    "content_policy_violation", "moderation_blocked", "finish_reason IMAGE_SAFETY", "PROHIBITED_CONTENT",
    "Your request may violate our usage policies.", "Flagged by moderation"])
def test_policy_words_and_codes_are_refusals(text):
    from biasaudit.backends.transport import is_policy_refusal

    assert is_policy_refusal(text)


def test_imagen_a_400_about_a_constraint_is_a_failure_not_a_refusal(monkeypatch):
    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.imagen import ImagenGenerator
    from biasaudit.params.generate import GeneratorSpec

    from .servers_images import ImagenServer, google_error

    monkeypatch.setenv("TEST_IMAGEN_KEY", "k-not-real")
    with ImagenServer() as server:
        spec = GeneratorSpec(backend="imagen", model_id="imagen-4.0-fast-generate-001", api_key_env="TEST_IMAGEN_KEY",
                             base_url=server.url, max_retries=0, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5)
        gen = ImagenGenerator("imagen-test", spec, sleep=lambda s: None)
        server.queue(google_error(400, "INVALID_ARGUMENT", "The aspect ratio must satisfy the constraint "
                                                           "1:1|3:4|4:3|9:16|16:9."),
                     ImagenServer.prompt_blocked())
        results = gen.generate([GenRequest(f"m-p-{i}", "p", "A nurse", i, 7 + i, 1024, 1024) for i in range(2)])
    assert [r.status for r in results] == ["failed", "refused"]
    assert "constraint" in results[0].reason and "Responsible AI" in results[1].reason


def test_openai_editor_a_400_about_usage_policies_is_a_refusal(tmp_path, monkeypatch):
    from biasaudit.backends.editors import EditRequest, make_editor
    from biasaudit.params.vlm import Counterfactuals

    from .servers_edit import OpenAIEditServer
    from .servers_images import openai_error

    grey_image(tmp_path / "src.png", 120)
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-not-real")
    with OpenAIEditServer() as server:
        spec = Counterfactuals(backend="openai", model_id="gpt-image-1", base_url=server.url + "/v1",
                               api_key_env="TEST_OPENAI_KEY", max_retries=0)
        editor = make_editor(spec)
        editor._sleep = lambda s: None
        server.queue(openai_error(400, "Your request may violate our usage policies.", "invalid_request_error", None),
                     openai_error(400, "Invalid 'size': must satisfy the constraint 1024x1024.",
                                  "invalid_request_error", None))
        reqs = [EditRequest(str(tmp_path / "src.png"), "Black_woman", "a Black woman", "Edit.", s, None)
                for s in (1, 2)]
        refused, failed = editor.edit(reqs)
    assert refused.status == "refused" and "usage policies" in refused.reason
    assert failed.status == "failed" and "constraint" in failed.reason


# --- 3. a short read resumes with a Range request -----------------------------------------------------

class _FileServer:
    """Serves `payload` at any path, honouring `Range: bytes=N-` (206 + Content-Range). The first
    `truncate` responses announce their full length but the connection closes after half of it."""

    def __init__(self, payload: bytes, truncate: int = 1):
        self.payload, self.truncate, self.ranges = payload, truncate, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.ranges.append(rng)
                start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                body = outer.payload[start:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(outer.payload) - 1}/{len(outer.payload)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if len(outer.ranges) <= outer.truncate:
                    body = body[: len(body) // 2]  # the server closes early: a clean short read
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/buffalo_l.zip"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


PAYLOAD = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes


def test_a_response_cut_short_is_resumed_from_where_it_stopped(tmp_path):
    from biasaudit import weights

    pinned = hashlib.sha256(PAYLOAD).hexdigest()
    dest = tmp_path / "buffalo_l.zip"
    with _FileServer(PAYLOAD, truncate=1) as server:
        digest = weights.download_resumable(server.url, dest, pinned, chunk=4096)
        ranges = list(server.ranges)
    half = len(PAYLOAD) // 2
    assert ranges == [None, f"bytes={half}-"]  # the second request asked for exactly the missing bytes
    assert digest == pinned and dest.read_bytes() == PAYLOAD
    assert not (tmp_path / "buffalo_l.zip.part").exists()


def test_still_short_after_the_attempts_keeps_the_part_for_the_next_fetch(tmp_path):
    from biasaudit import weights

    pinned = hashlib.sha256(PAYLOAD).hexdigest()
    dest, part = tmp_path / "buffalo_l.zip", tmp_path / "buffalo_l.zip.part"
    with _FileServer(PAYLOAD, truncate=100) as server:  # every response stops halfway
        with pytest.raises(OSError, match="partial download is kept"):
            weights.download_resumable(server.url, dest, pinned, chunk=4096, attempts=3)
        ranges = list(server.ranges)
    # each request receives half of what is left: n/2, then n/2 + n/4, then n/2 + n/4 + n/8 (floors)
    n = len(PAYLOAD)
    got = [0]
    for _ in range(3):
        got.append(got[-1] + (n - got[-1]) // 2)
    assert ranges == [None, f"bytes={got[1]}-", f"bytes={got[2]}-"]
    assert part.read_bytes() == PAYLOAD[: got[3]] and not dest.exists()
    with _FileServer(PAYLOAD, truncate=0) as server:  # the next fetch picks up the kept part
        assert weights.download_resumable(server.url, dest, pinned) == pinned
        assert server.ranges == [f"bytes={got[3]}-"]
    assert dest.read_bytes() == PAYLOAD


# --- 4. vLLM in its own venv; DeepSeek-VL2 interleaved ------------------------------------------------

def _steps(command: str) -> list[list[str]]:
    return [shlex.split(step) for step in command.split("&&")]


@pytest.mark.parametrize("name", ["llama-3.2-90b-vision", "deepseek-vl2"])
def test_every_vllm_command_installs_into_and_runs_from_a_venv_of_its_own(name):
    from biasaudit.weights import VLLM_SERVE

    steps = _steps(VLLM_SERVE[name])
    venv_step = next(s for s in steps if s[1:3] == ["-m", "venv"])
    venv = venv_step[3]
    assert Path(venv).name != ".venv" and ".venv" not in Path(venv).parts and not venv.startswith(".")
    pip = next(s for s in steps if "install" in s)
    assert pip[0] == f"{venv}/bin/pip" and re.fullmatch(r"vllm==[\d.]+", pip[pip.index("install") + 1])
    serve = next(s for s in steps if "serve" in s)
    exe = next(tok for tok in serve if not re.fullmatch(r"[A-Z_0-9]+=\S*", tok))  # after VAR=value
    assert exe == f"{venv}/bin/vllm" and serve[serve.index(exe) + 1] == "serve"
    assert steps.index(venv_step) < steps.index(pip) < steps.index(serve)
    # no bare pip / vllm (the project's .venv, when it is active)
    assert not any(s[0] in ("pip", "pip3", "vllm") for s in steps)


def test_deepseek_vl2_is_served_interleaved_and_without_a_source_checkout_path():
    from biasaudit.weights import VLLM_SERVE

    command = VLLM_SERVE["deepseek-vl2"]
    tokens = shlex.split(command.replace("&&", " "))
    assert "--interleave-mm-strings" in tokens
    assert "--chat-template" not in tokens and "examples/" not in command
    assert "VLLM_USE_V1=0" in VLLM_SERVE["llama-3.2-90b-vision"]
    assert "vllm==0.10.1.1" in VLLM_SERVE["llama-3.2-90b-vision"]  # the last release with the V0 engine


def _decode_grey(url: str) -> float:
    b64 = url.split(",", 1)[1]
    raw = base64.b64decode(b64 + "=" * (-len(b64) % 4))
    return float(np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=float).mean())


def test_deepseek_vl2_2afc_request_puts_each_label_right_before_its_image(tmp_path, monkeypatch):
    """The paper profile's deepseek-vl2 entry (backend openai) against a local server: the JSON body it
    receives for one 2AFC item, built as the reflect stage builds it (biasaudit.vlm.tasks)."""
    from biasaudit.cli import profile_params
    from biasaudit.vlm import tasks

    monkeypatch.setenv("VLLM_API_KEY", "not-a-real-key")
    paper = profile_params("paper", ROOT / "params.yaml")
    spec = paper.vlms["deepseek-vl2"]
    assert (spec.backend, spec.model_id) == ("openai", "deepseek-ai/deepseek-vl2")
    params = paper.reflect.model_copy(update={"composite_dir": str(tmp_path / "composites")})
    grey = {"White": 25, "Black": 229}
    rows = []
    for race, level in grey.items():
        grey_image(tmp_path / f"{race}_man.png", level, size=64)
        rows.append({"occupation": "doctor", "base_id": "d1", "race": race, "gender": "man",
                     "path": str(tmp_path / f"{race}_man.png")})
    items = tasks.two_afc_items(pd.DataFrame(rows), ["income"], tasks.two_afc_prompts(params), both_orders=False)
    assert len(items) == 1
    with VLMServer() as server:
        spec = spec.model_copy(update={"base_url": server.openai_url, "max_retries": 0, "timeout_s": 5.0})
        vlm = CachedVLM(make_vlm_backend(spec), tmp_path / "deepseek.sqlite")
        [record] = tasks.make_batch_fn(vlm, "deepseek-vl2", params)(items)
        [body] = server.requests
    assert record["two_afc_mode"] == "interleaved"
    assert body["model"] == "deepseek-ai/deepseek-vl2"
    [message] = body["messages"]
    content = message["content"]
    assert [p["type"] for p in content] == ["text", "image_url", "text", "image_url", "text"]
    assert content[0] == {"type": "text", "text": "Image A:"} and content[2] == {"type": "text", "text": "Image B:"}
    # each image is the face its label names: A = the item's group_a, B = its group_b (flat greys)
    level = {"WM": 25, "BM": 229}
    assert _decode_grey(content[1]["image_url"]["url"]) == pytest.approx(level[items[0]["group_a"]], abs=1)
    assert _decode_grey(content[3]["image_url"]["url"]) == pytest.approx(level[items[0]["group_b"]], abs=1)
    assert content[4] == {"type": "text", "text": params.task_specs["2afc_income"].prompt}  # the question, last


# --- 5. InsightFace: the device its sessions run on; preload_dlls ------------------------------------

@pytest.fixture(scope="module")
def tiny_insightface(tmp_path_factory):
    from biasaudit.tiny.insightface import build_tiny_insightface

    return build_tiny_insightface(tmp_path_factory.mktemp("insightface"))


def _no_preload_yet(monkeypatch):
    """insightface >= 2.1 preloads once per process (a module flag): start each test from 'not yet'."""
    try:
        from insightface.model_zoo import onnxruntime_utils
    except ImportError:
        return
    monkeypatch.setattr(onnxruntime_utils, "_CUDA_PRELOAD_COMPLETE", False, raising=False)


@pytest.mark.slow
def test_requested_cuda_on_a_cpu_only_onnxruntime_records_cpu(tiny_insightface, monkeypatch):
    import onnxruntime as ort

    from biasaudit.faces import detect

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    _no_preload_yet(monkeypatch)
    det = detect.InsightFaceDetector(name="tiny_buffalo", root=str(tiny_insightface), det_size=256,
                                     stand_in=True, device="cuda")
    assert det.device == "cpu"
    # an onnxruntime that lists the CUDA provider but cannot run it (no GPU here): the sessions fall back
    # to the CPU, and the recorded device is where they run, not the cuda:0 that was asked for
    calls = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append((a, k)), raising=False)
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        det = detect.InsightFaceDetector(name="tiny_buffalo", root=str(tiny_insightface), det_size=256,
                                         stand_in=True, device="cuda")
    sessions = [m.session.get_providers() for m in det.app.models.values()]
    assert sessions and all("CUDAExecutionProvider" not in s for s in sessions)
    assert det.device == "cpu"
    assert len(calls) == 1  # preloaded once for the detector's sessions, not once per session


def test_onnx_providers_preloads_the_cuda_libraries_when_cuda_is_listed_and_asked_for(monkeypatch):
    import onnxruntime as ort

    from biasaudit.faces import detect

    _no_preload_yet(monkeypatch)
    calls = []
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda *a, **k: calls.append(1), raising=False)
    providers, ctx = detect.onnx_providers("cpu")
    assert (providers, ctx, calls) == (["CPUExecutionProvider"], -1, [])  # not asked for: not loaded
    providers, ctx = detect.onnx_providers("cuda:1")
    assert providers[0] == ("CUDAExecutionProvider", {"device_id": 1}) and ctx == 1 and calls == [1]
    # an onnxruntime older than 1.21 has no preload_dlls: nothing to call, no error
    monkeypatch.delattr(ort, "preload_dlls")
    _no_preload_yet(monkeypatch)
    assert detect.onnx_providers("cuda")[1] == 0
