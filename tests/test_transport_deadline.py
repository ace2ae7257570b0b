"""timeout_s is a total deadline per request: a server trickling its answer a byte at a time (each byte
well within any per-read timeout) is cut off, for both SDKs our clients use (openai, google-genai)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from biasaudit.backends.vlm import VLMRequest, make_vlm_backend
from biasaudit.params.classify import VLMSpec
from biasaudit.pipeline.work import is_transient

from .servers_vlm import grey_image

OPENAI_BODY = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "white", "refusal": None},
                            "logprobs": None, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
GEMINI_BODY = {"candidates": [{"content": {"role": "model", "parts": [{"text": "white"}]}, "finishReason": "STOP"}],
               "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}}


class TrickleServer:
    """Answers every POST with a valid body (`body`), headers at once, then one byte every `gap_s`;
    `sent` counts the body bytes that reached the client (a closed connection stops the trickle)."""

    def __init__(self, body: dict, gap_s: float, pad: int = 0):
        self.data = json.dumps(body).encode() + b" " * pad
        self.gap_s, self.sent, self.complete = gap_s, 0, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(outer.data)))
                self.end_headers()
                try:
                    for i in range(len(outer.data)):
                        self.wfile.write(outer.data[i:i + 1])
                        self.wfile.flush()
                        outer.sent += 1
                        time.sleep(outer.gap_s)
                    outer.complete += 1
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.mark.parametrize("backend", ["openai", "gemini"])
def test_a_trickling_answer_is_cut_at_timeout_s(backend, tmp_path):
    """Each byte comes 0.1 s after the last (far within the 1 s timeout per read), the whole body takes
    over 30 s: the request fails as a transient timeout and the server sent only part of the body."""
    grey_image(tmp_path / "a.png", 10)
    body = OPENAI_BODY if backend == "openai" else GEMINI_BODY
    with TrickleServer(body, gap_s=0.1, pad=300) as server:
        url = server.url + ("/v1" if backend == "openai" else "")
        spec = VLMSpec(backend=backend, model_id="m", base_url=url, api_key_env="NOPE", timeout_s=1.0,
                       max_retries=0, constrain=False)
        response = make_vlm_backend(spec).generate([VLMRequest(images=(str(tmp_path / "a.png"),), prompt="race?")])[0]
        time.sleep(0.3)  # the server notices the closed connection at its next byte
    assert response.status == "failed" and ("deadline" in response.reason or "Timeout" in response.reason), response.reason
    assert is_transient({"status": response.status, "reason": response.reason})
    assert server.complete == 0 and 0 < server.sent < len(server.data) // 2, (server.sent, len(server.data))


def test_a_prompt_answer_is_unaffected(tmp_path):
    grey_image(tmp_path / "a.png", 10)
    with TrickleServer(OPENAI_BODY, gap_s=0.0) as server:
        spec = VLMSpec(backend="openai", model_id="m", base_url=server.url + "/v1", api_key_env="NOPE", timeout_s=5.0,
                       max_retries=0, constrain=False)
        response = make_vlm_backend(spec).generate([VLMRequest(images=(str(tmp_path / "a.png"),), prompt="race?")])[0]
    assert response.status == "ok" and response.text == "white" and server.complete == 1
