"""Local HTTP servers on 127.0.0.1 that speak real API wire formats, for testing API clients offline.

`LocalAPIServer` is the reusable part: a threaded server with routes (method + regex → handler),
a record of every request (path, headers, JSON body) and a queue of scripted replies that take
precedence over the handlers (429 with Retry-After, 500, malformed JSON, refusals, ...). API
flavours subclass it and add their routes and error formats:

* `ImagenServer`: Vertex `…/publishers/google/models/{model}:predict` as google-genai's
  `generate_images` sends it (`instances[0].prompt`, `parameters.sampleCount/aspectRatio/seed/…`),
  answering `predictions[].bytesBase64Encoded` or `raiFilteredReason`; errors as Google's
  `{"error": {"code", "message", "status"}}`.
* `OpenAIImagesServer`: `POST /v1/images/generations` (`model, prompt, n, size, response_format`),
  answering `{"created", "data": [{"b64_json" | "url", "revised_prompt"}]}` (gpt-image-* models reject
  `response_format` with a 400, as the API does); errors as OpenAI's
  `{"error": {"message", "type", "param", "code"}}`.

The images are deterministic functions of (prompt, seed): a flat colour plus a gradient, so tests can
check that bytes round-trip. Other engineers add e.g. Gemini generateContent or chat completions by
subclassing `LocalAPIServer` the same way.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    match: re.Match | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Reply:
    status: int = 200
    body: bytes | dict | list | str = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # sleep before answering (client timeouts)

    def encoded(self) -> tuple[bytes, dict[str, str]]:
        headers = dict(self.headers)
        if isinstance(self.body, (dict, list)):
            headers.setdefault("Content-Type", "application/json")
            return json.dumps(self.body).encode(), headers
        if isinstance(self.body, str):
            headers.setdefault("Content-Type", "application/json")
            return self.body.encode(), headers
        return self.body, headers


Handler = Callable[[Request], Reply]


class LocalAPIServer:
    """A scripted HTTP server in a background thread. Use as a context manager."""

    def __init__(self, port: int = 0):
        self.port = port  # 0: any free one (a quick start's fixed port otherwise)
        self.routes: list[tuple[str, re.Pattern, Handler]] = []
        self.requests: list[Request] = []
        self.script: deque[Reply | Callable[[Request], Reply]] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.unscripted: set[int] = set()  # routes the scripted replies never answer (the model probes)
        # who answers: the model asked (echoed as modelVersion where the API reports one), or `answers_as` (a
        # re-routed model); a model in `unserved` answers 404 NOT_FOUND to its probe and to every request
        self.answers_as = ""
        self.unserved: set[str] = set()
        self.probes: list[str] = []

    # --- configuration ---
    def route(self, method: str, pattern: str, handler: Handler, scripted: bool = True) -> None:
        if not scripted:
            self.unscripted.add(len(self.routes))
        self.routes.append((method.upper(), re.compile(pattern), handler))

    def model_routes(self, flavour: str) -> None:
        """The probe a stage sends before its first batch: Gemini's models.get (`gemini`), Vertex's
        publisher-model get (`vertex`), OpenAI's models.retrieve (`openai`)."""
        pattern = {"gemini": r"/v1(?:beta)?/models/(?P<model>[\w.-]+)",
                   "vertex": r"/v1(?:beta1)?/(?:projects/[^/]+/locations/[^/]+/)?publishers/google/models/(?P<model>[\w.-]+)",
                   "openai": r"/v1/models/(?P<model>[\w.%/-]+)"}[flavour]  # the SDK quotes a Hub id's '/'
        self.route("GET", pattern, lambda req: self._model_info(req, flavour), scripted=False)

    def _model_info(self, req: Request, flavour: str) -> Reply:
        model = urllib.parse.unquote(req.match.group("model")) if req.match else ""
        self.probes.append(model)
        if model in self.unserved:
            return self.not_found(model, flavour)
        if flavour == "openai":
            return Reply(200, {"id": model, "object": "model", "created": 0, "owned_by": "system"})
        return Reply(200, {"name": f"models/{model}", "baseModelId": model, "version": "001", "displayName": model})

    @staticmethod
    def not_found(model: str, flavour: str) -> Reply:
        if flavour == "openai":
            return openai_error(404, f"The model `{model}` does not exist or you do not have access to it.",
                                "invalid_request_error", "model_not_found")
        return google_error(404, "NOT_FOUND", f"models/{model} is not found for API version v1beta, or is not "
                                              "supported for generateContent.")

    def version_of(self, req: Request) -> str:
        """The modelVersion an API reports: the model asked, unless the server re-routes it."""
        return self.answers_as or (req.match.group("model") if req.match else "")

    def queue(self, *replies: Reply | Callable[[Request], Reply]) -> None:
        """Answer the next requests with these (in order) before falling back to the routes."""
        self.script.extend(replies)

    # --- lifecycle ---
    @property
    def url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> "LocalAPIServer":
        outer = self

        class _H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                reply = outer._dispatch(req)
                if reply.delay_s:
                    import time

                    time.sleep(reply.delay_s)
                data, headers = reply.encoded()
                try:
                    self.send_response(reply.status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _H)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _dispatch(self, req: Request) -> Reply:
        path = req.path.split("?", 1)[0]
        with self._lock:
            self.requests.append(req)
            scripted = self.script.popleft() if self.script else None
        for index, (method, pattern, handler) in enumerate(self.routes):
            m = pattern.fullmatch(path)
            if m and method == req.method:
                req.match = m
                if index in self.unscripted:
                    if scripted is not None:
                        with self._lock:
                            self.script.appendleft(scripted)  # not this request's: the next one's
                    return handler(req)
                model = m.groupdict().get("model") or _json_model(req)
                if model in self.unserved:
                    return self.not_found(model, "openai" if "/v1/" in path and "models/" not in path else "gemini")
                if scripted is not None:
                    return scripted(req) if callable(scripted) else scripted
                return handler(req)
        return Reply(404, {"error": {"code": 404, "message": f"no route for {req.method} {path}"}})


def _json_model(req: Request) -> str | None:
    try:
        body = req.json
    except ValueError:  # multipart (images/edits)
        return None
    return body.get("model") if isinstance(body, dict) else None


# --- deterministic test images ---

def pattern_image(prompt: str, seed: int | None, width: int, height: int, black: bool = False) -> np.ndarray:
    if black:
        return np.zeros((height, width, 3), dtype=np.uint8)
    digest = hashlib.sha256(f"{prompt}\x1f{seed}".encode()).digest()
    base = np.frombuffer(digest[:3], dtype=np.uint8).astype(np.int32)
    ramp = np.linspace(0, 60, width, dtype=np.int32)[None, :, None]
    return np.clip(base[None, None, :] // 2 + 40 + ramp, 0, 255).astype(np.uint8).repeat(height, axis=0)


def png_bytes(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


# --- Imagen (Vertex :predict, as google-genai sends it) ---

IMAGEN_ASPECT_SIZES = {"1:1": (1024, 1024), "3:4": (896, 1280), "4:3": (1280, 896), "9:16": (768, 1408),
                       "16:9": (1408, 768)}


def google_error(code: int, status: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(code, {"error": {"code": code, "message": message, "status": status}}, headers or {})


class ImagenServer(LocalAPIServer):
    """Answers `POST …/models/{model}:predict` (size scaled down by `scale` to keep tests light)."""

    def __init__(self, scale: int = 16):
        super().__init__()
        self.scale = scale
        self.route("POST", r"/v1(?:beta1)?/(?:projects/[^/]+/locations/[^/]+/)?publishers/google/models/"
                           r"(?P<model>[^/:]+):predict", self.predict)
        self.model_routes("vertex")

    def predict(self, req: Request) -> Reply:
        body = req.json
        prompt = body["instances"][0]["prompt"]
        params = body.get("parameters", {})
        w, h = IMAGEN_ASPECT_SIZES[params.get("aspectRatio", "1:1")]
        preds = []
        for _ in range(int(params.get("sampleCount", 1))):
            rgb = pattern_image(prompt, params.get("seed"), w // self.scale, h // self.scale)
            preds.append({"bytesBase64Encoded": base64.b64encode(png_bytes(rgb)).decode(), "mimeType": "image/png"})
        return Reply(200, {"predictions": preds})

    # scripted replies in Google's formats
    @staticmethod
    def rate_limited(retry_after: str | None = "0") -> Reply:
        return google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests",
                            {"Retry-After": retry_after} if retry_after is not None else None)

    @staticmethod
    def server_error() -> Reply:
        return google_error(500, "INTERNAL", "Internal error encountered.")

    @staticmethod
    def malformed() -> Reply:
        return Reply(200, '{"predictions": [{"bytesBase64Encoded": "iVBOR', {"Content-Type": "application/json"})

    @staticmethod
    def filtered(reason: str = "Your current safety filter threshold filtered out 1 generated image.") -> Reply:
        return Reply(200, {"predictions": [{"raiFilteredReason": reason}]})

    @staticmethod
    def prompt_blocked() -> Reply:
        return google_error(400, "INVALID_ARGUMENT", "Image generation failed with the following error: The prompt "
                            "could not be submitted. This prompt contains sensitive words that violate Google's "
                            "Responsible AI practices.")

    def black(self, req: Request) -> Reply:
        w, h = IMAGEN_ASPECT_SIZES[req.json.get("parameters", {}).get("aspectRatio", "1:1")]
        rgb = pattern_image("", None, w // self.scale, h // self.scale, black=True)
        return Reply(200, {"predictions": [{"bytesBase64Encoded": base64.b64encode(png_bytes(rgb)).decode(),
                                            "mimeType": "image/png"}]})


# --- OpenAI images ---

def openai_error(code: int, message: str, err_type: str, err_code: str | None,
                 headers: dict[str, str] | None = None) -> Reply:
    return Reply(code, {"error": {"message": message, "type": err_type, "param": None, "code": err_code}}, headers or {})


class OpenAIImagesServer(LocalAPIServer):
    """Answers `POST /v1/images/generations` and serves `url` results from `/files/<name>.png`."""

    def __init__(self, scale: int = 16):
        super().__init__()
        self.scale = scale
        self.files: dict[str, bytes] = {}
        self.route("POST", r"/v1/images/generations", self.generations)
        self.route("GET", r"/files/(?P<name>[\w.-]+)", self.file)
        self.model_routes("openai")

    def generations(self, req: Request) -> Reply:
        body = req.json
        if str(body.get("model", "")).startswith("gpt-image") and "response_format" in body:
            # what the API answers: GPT image models always return base64 and take no response_format
            return Reply(400, {"error": {"message": "Unknown parameter: 'response_format'.",
                                         "type": "invalid_request_error", "param": "response_format",
                                         "code": "unknown_parameter"}})
        w, h = (int(x) for x in body.get("size", "1024x1024").split("x"))
        data = []
        for i in range(int(body.get("n", 1))):
            raw = png_bytes(pattern_image(body["prompt"], i, w // self.scale, h // self.scale))
            item: dict[str, Any] = {"revised_prompt": body["prompt"]}
            if body.get("response_format") == "url":
                name = hashlib.sha256(raw).hexdigest()[:16] + ".png"
                self.files[name] = raw
                item["url"] = f"{self.url}/files/{name}"
            else:
                item["b64_json"] = base64.b64encode(raw).decode()
            data.append(item)
        return Reply(200, {"created": 1700000000, "data": data})

    def file(self, req: Request) -> Reply:
        name = req.match.group("name") if req.match else ""
        if name not in self.files:
            return Reply(404, b"not found", {"Content-Type": "text/plain"})
        return Reply(200, self.files[name], {"Content-Type": "image/png"})

    @staticmethod
    def rate_limited(retry_after: str | None = "0") -> Reply:
        return openai_error(429, "Rate limit reached for images per minute.", "requests", "rate_limit_exceeded",
                            {"Retry-After": retry_after, "x-should-retry": "true"} if retry_after is not None else None)

    @staticmethod
    def server_error() -> Reply:
        return openai_error(500, "The server had an error while processing your request.", "server_error", None)

    @staticmethod
    def malformed() -> Reply:
        return Reply(200, '{"created": 1700000000, "data": [{"b64_json": "iVBOR', {"Content-Type": "application/json"})

    @staticmethod
    def refusal() -> Reply:
        return openai_error(400, "Your request was rejected as a result of our safety system.",
                            "invalid_request_error", "content_policy_violation")


# --- Gemini image models (generateContent with responseModalities IMAGE) ---

GEMINI_IMAGE_SIZES = {("1:1", "1K"): (1024, 1024), ("3:4", "1K"): (864, 1184), ("4:3", "1K"): (1184, 864),
                      ("9:16", "1K"): (768, 1344), ("16:9", "1K"): (1344, 768), ("1:1", "2K"): (2048, 2048)}


class GeminiImageServer(LocalAPIServer):
    """Answers `POST /v1beta/models/{model}:generateContent` for a text prompt with
    `generationConfig.responseModalities: ["IMAGE"]` and `imageConfig {aspectRatio, imageSize}`: one candidate
    whose parts hold the PNG as `inlineData`, and `modelVersion` (size scaled down by `scale`)."""

    def __init__(self, scale: int = 16):
        super().__init__()
        self.scale = scale
        self.route("POST", r"/v1(?:beta)?/models/(?P<model>[\w.-]+):generateContent", self.generate)
        self.model_routes("gemini")

    def generate(self, req: Request) -> Reply:
        body = req.json
        prompt = "".join(p.get("text", "") for p in body["contents"][0]["parts"])
        config = body.get("generationConfig", {})
        image = config.get("imageConfig", {})
        w, h = GEMINI_IMAGE_SIZES[(image.get("aspectRatio", "1:1"), image.get("imageSize", "1K"))]
        raw = png_bytes(pattern_image(prompt, config.get("seed"), w // self.scale, h // self.scale))
        return Reply(200, {"candidates": [{"content": {"role": "model", "parts": [
            {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(raw).decode()}}]},
            "finishReason": "STOP", "index": 0}], "modelVersion": self.version_of(req),
            "responseId": f"r{len(self.requests)}", "usageMetadata": {"promptTokenCount": 12,
                                                                      "candidatesTokenCount": 1290}})

    @staticmethod
    def image_safety() -> Reply:
        return Reply(200, {"candidates": [{"content": {"role": "model", "parts": [{"text": "I can't make that."}]},
                                           "finishReason": "IMAGE_SAFETY", "index": 0}]})
