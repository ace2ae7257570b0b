"""Local HTTP servers on 127.0.0.1 speaking the real wire formats of the Gemini API
(generateContent, batchGenerateContent, batches.get/cancel) and OpenAI chat completions.

The answer to a request is a pure function of the image it carries (its mean grey level picks a
label), so tests know the right label. `script` is a FIFO of behaviours consumed one per request:
'ok', '429', '500', 'malformed' (invalid JSON body), 'refuse' (API-level refusal), 'text-refuse'
(a refusal sentence), 'offlist', 'hang' (hold the request until the server stops), '400' (OpenAI: a 400
"Invalid value" body that names no parameter, to whatever request it meets). `answered`
counts, per image, the answers actually sent, so a kill-and-resume test can prove zero repeats.
Model constraints as the APIs document them: Gemini thinking tokens count against maxOutputTokens
(`thinking_tokens`; 'max-tokens' forces an empty MAX_TOKENS answer); OpenAI reasoning models reject
`max_tokens` and a non-default `temperature` with the real 400 bodies (`reasoning_tokens` count
against max_completion_tokens). Batch jobs can finish after `polls_to_finish` gets ('poll').
The probes (`probes`): models.get / models.retrieve / the model list, and an OpenAI server that neither
retrieves nor lists (`retrieve=False, lists=False`) gets the one-token chat request, answered with `chat_probe`
(status, body); `omit_model` answers without the model's name (an unverifiable answer).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

LABELS = ("white", "black", "asian", "hispanic", "other")


def label_for_pixels(img: Image.Image) -> str:
    """The server's 'truth': mean grey level in 5 bins of 51 (0–50 white, 51–101 black, …)."""
    return LABELS[min(int(np.asarray(img.convert("L"), dtype=float).mean()) // 51, 4)]


def grey_image(path, level: int, size: int = 64) -> None:
    Image.fromarray(np.full((size, size, 3), level, np.uint8)).save(path)


def grey_manifest(root, levels) -> None:
    """Model m's generate manifest under `root`: one flat grey image per level (prompts p0, p1, …), as classify reads it."""
    import os
    from pathlib import Path

    import pandas as pd

    img_dir = Path(root) / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    rows = []
    for i, level in enumerate(levels):
        p = img_dir / f"m-p{i}-000.png"
        grey_image(p, level)
        rows.append({"image_id": p.stem, "model": "m", "prompt_id": f"p{i}", "path": os.path.relpath(p, root),
                     "status": "ok", "reason": ""})
    pd.DataFrame(rows).to_parquet(img_dir / "manifest.parquet", index=False)


def classify_config(root, vlm: dict, batch_size: int = 4, **execution):
    """params.yaml with model m and a classify section whose VLM is the default one updated by `vlm` (no key, no
    retries), its cache under `root`; `execution` over the execution section."""
    from biasaudit.config import read_yaml, validate

    from .conftest import ROOT

    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = {"m": {"backend": "packaged-photos", "width": 64, "height": 64}}
    raw["execution"] = {**(raw.get("execution") or {}), **execution}
    raw["classify"] = {**raw["classify"], "batch_size": batch_size, "cache_path": str(root / "cache.sqlite"),
                       "vlm": {**raw["classify"]["vlm"], "api_key_env": "NOPE", "max_retries": 0, **vlm}}
    return validate(raw)


def grey_pair(directory, size: int):
    """One source photo's two variants as the reflect stage reads them: White man (grey 25), Black man (grey 229)."""
    import pandas as pd

    rows = []
    for race, level in (("White", 25), ("Black", 229)):
        p = directory / f"{race}_man.png"
        grey_image(p, level, size=size)
        rows.append({"occupation": "doctor", "base_id": "d1", "race": race, "gender": "man", "path": str(p)})
    return pd.DataFrame(rows)


class VLMServer:
    def __init__(self, script: list[str] | None = None, delay_s: float = 0.0, batch_state: str = "succeed",
                 thinking_tokens: int = 0, reasoning_tokens: int = 0, polls_to_finish: int = 0,
                 batch_item_errors: frozenset[int] = frozenset(), reject_schema: bool = False,
                 answers_as: str = "", unserved: frozenset[str] = frozenset(), retrieve: bool = True,
                 schema_error: dict | None = None, lists: bool = True, chat_probe: tuple[int, dict] | None = None,
                 omit_model: bool = False, port: int = 0):
        self.script = list(script or [])
        # who answers: the model asked (the APIs echo it, or a dated snapshot of it, as modelVersion / model),
        # or `answers_as` (a re-routed model); `unserved` models answer 404 NOT_FOUND, as a shut-down one does
        self.answers_as, self.unserved = answers_as, unserved
        self.retrieve = retrieve  # GET /v1/models/{id} (OpenAI); vLLM lists (GET /v1/models) and never retrieves
        self.lists = lists  # GET /v1/models; a server without either gets the probe's one-token chat request ...
        self.chat_probe = chat_probe  # ... answered with this (status, body), or a one-token answer when None
        self.omit_model = omit_model  # answers without `model` (OpenAI) / `modelVersion` (Gemini): unverifiable
        self.probes: list[str] = []
        self.listed: tuple[str, ...] = ("served-model",)  # what GET /v1/models lists (a vLLM server: its one model)
        # a server without JSON-schema mode (DashScope for some qwen-plus models): a json_schema
        # response_format gets a 400 invalid_parameter_error
        self.reject_schema = reject_schema
        # or a 400 with this `error` object (one whose message names neither response_format nor json_schema)
        self.schema_error = schema_error
        self.delay_s = delay_s
        self.batch_state = batch_state  # 'succeed' | 'stall' | 'poll' (done after `polls_to_finish` gets)
        # Gemini thinking models: tokens of thought per answer, counted against maxOutputTokens (as the
        # real API does); an answer that does not fit after them comes back empty with MAX_TOKENS.
        self.thinking_tokens = thinking_tokens
        # OpenAI reasoning models (gpt-5*, o*): reject max_tokens / a non-default temperature with the
        # real 400 bodies; reasoning tokens count against max_completion_tokens (finish 'length', empty).
        self.reasoning_tokens = reasoning_tokens
        self.polls_to_finish = polls_to_finish
        self.polls: Counter[str] = Counter()
        self.batch_item_errors = batch_item_errors  # indices (per job) answered with an item error
        self.calls = 0
        self.requests: list[dict] = []
        self.answered: Counter[str] = Counter()
        self.batches: dict[str, dict] = {}
        self.batch_requests: dict[str, list] = {}
        self.cancelled: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes, headers: dict | None = None):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _json(self, code: int, obj, headers=None):
                self._send(code, json.dumps(obj).encode(), headers)

            def do_GET(self):
                found = server._models_get(self.path.split("?")[0])
                if found is not None:
                    return self._json(*found)
                m = re.search(r"(batches/[^/?:]+)", self.path)
                if m and m.group(1) in server.batches:
                    name = m.group(1)
                    with server._lock:
                        server.polls[name] += 1
                        due = (server.batch_state == "poll" and server.polls[name] >= server.polls_to_finish
                               and not server.batches[name]["done"])
                    if due:
                        server.complete_batch(name)
                    return self._json(200, server.batches[name])
                self._json(404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                path = self.path.split("?")[0]
                asked = body.get("model") or (re.search(r"models/([^/:]+):", path) or [None, ""])[1]
                if asked in server.unserved:
                    server.requests.append(body)
                    return self._json(404, server._not_found(asked, path))
                if path.endswith("/chat/completions"):
                    return server._openai(self, body)
                if path.endswith(":generateContent"):
                    return server._gemini(self, body)
                if path.endswith(":batchGenerateContent"):
                    return server._gemini_batch(self, body)
                if path.endswith(":cancel"):
                    name = re.search(r"(batches/[^/:]+):cancel", path).group(1)  # /v1beta/batches/x:cancel
                    server.cancelled.append(name)
                    if name in server.batches:
                        server.batches[name]["metadata"]["state"] = "BATCH_STATE_CANCELLED"
                    return self._json(200, {})
                self._json(404, {"error": {"code": 404, "message": f"no route {path}", "status": "NOT_FOUND"}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port 0: any free one
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # --- lifecycle ---
    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _not_found(self, model: str, path: str) -> dict:
        if "/v1beta/" in path or ":generateContent" in path:
            return {"error": {"code": 404, "message": f"models/{model} is not found for API version v1beta, or is "
                              "not supported for generateContent.", "status": "NOT_FOUND"}}
        return {"error": {"message": f"The model `{model}` does not exist or you do not have access to it.",
                          "type": "invalid_request_error", "param": None, "code": "model_not_found"}}

    def _models_get(self, path: str):
        """Gemini models.get (GET /v1beta/models/{m}), OpenAI models.retrieve (GET /v1/models/{id}) and list
        (GET /v1/models): (status, body), or None for another path."""
        m = re.fullmatch(r"/v1beta/models/([^/:]+)", path)
        if m:
            self.probes.append(m.group(1))
            if m.group(1) in self.unserved:
                return 404, self._not_found(m.group(1), path)
            return 200, {"name": f"models/{m.group(1)}", "baseModelId": m.group(1), "version": "001",
                         "displayName": m.group(1), "supportedGenerationMethods": ["generateContent"]}
        if path == "/v1/models":
            self.probes.append("(list)")
            if not self.lists:
                return 404, {"error": {"message": "Not Found", "type": "invalid_request_error", "code": None}}
            return 200, {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "vllm"}
                                                    for m in self.listed]}
        m = re.fullmatch(r"/v1/models/(.+)", path)
        if m:
            model = urllib.parse.unquote(m.group(1))  # the SDK quotes the '/' of a Hub id
            self.probes.append(model)
            if model in self.unserved or not self.retrieve:
                return 404, self._not_found(model, path)
            return 200, {"id": model, "object": "model", "created": 0, "owned_by": "system", "shutdown_date": None}
        return None

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def gemini_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _next(self) -> str:
        with self._lock:
            self.calls += 1
            return self.script.pop(0) if self.script else "ok"

    def _hang(self):
        self._stop.wait()

    @staticmethod
    def _image_of(b64: str) -> tuple[str, str]:
        raw = base64.urlsafe_b64decode(b64.replace("+", "-").replace("/", "_") + "=" * (-len(b64) % 4))
        img = Image.open(io.BytesIO(raw))
        return hashlib.sha256(img.convert("RGB").tobytes()).hexdigest()[:16], label_for_pixels(img)

    # --- OpenAI chat completions ---
    def _openai(self, h, body):
        content = body["messages"][0]["content"]
        if isinstance(content, str) or not any(p.get("type") == "image_url" for p in content):  # the probe's
            self.probes.append("(chat)")  # one-token request (transport.probe_openai): not an item request
            if self.chat_probe is not None:
                return h._json(*self.chat_probe)
            return h._json(200, {"id": "probe", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"},
                                              "logprobs": None, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})
        behaviour = self._next()
        self.requests.append(body)
        if self.delay_s:
            time.sleep(self.delay_s)
        content = body["messages"][0]["content"]
        url = next(p["image_url"]["url"] for p in content if p["type"] == "image_url")
        key, label = self._image_of(url.split(",", 1)[1])
        if behaviour == "hang":
            return self._hang()
        if behaviour == "400":
            return h._json(400, {"error": {"message": "Invalid value", "type": "invalid_request_error",
                                           "param": None, "code": None}})
        if self.schema_error and (body.get("response_format") or {}).get("type") == "json_schema":
            return h._json(400, {"error": self.schema_error})
        if self.reject_schema and (body.get("response_format") or {}).get("type") == "json_schema":
            return h._json(400, {"error": {
                "message": "<400> InternalError.Algo.InvalidParameter: The value of response_format.type "
                           "json_schema is not supported by this model",
                "type": "invalid_request_error", "param": None, "code": "invalid_parameter_error"}})
        if body["model"].startswith(("gpt-5", "o1", "o3", "o4")) and not body["model"].startswith("gpt-5-chat"):
            if "max_tokens" in body:  # the API's own error body for reasoning models
                return h._json(400, {"error": {
                    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                               "Use 'max_completion_tokens' instead.",
                    "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})
            if "temperature" in body and body["temperature"] != 1:
                return h._json(400, {"error": {
                    "message": f"Unsupported value: 'temperature' does not support {body['temperature']} with "
                               "this model. Only the default (1) value is supported.",
                    "type": "invalid_request_error", "param": "temperature", "code": "unsupported_value"}})
            limit = body.get("max_completion_tokens")
            if limit is not None and limit < self.reasoning_tokens + 1:
                return h._json(200, {"id": "x", "object": "chat.completion", "created": 0, "model": self.answers_as or body["model"],
                                     "choices": [{"index": 0, "finish_reason": "length", "logprobs": None,
                                                  "message": {"role": "assistant", "content": "", "refusal": None}}],
                                     "usage": {"prompt_tokens": 100, "completion_tokens": limit,
                                               "total_tokens": 100 + limit,
                                               "completion_tokens_details": {"reasoning_tokens": limit}}})
        if behaviour == "429":
            return h._json(429, {"error": {"message": "Rate limit reached", "type": "rate_limit_error", "code": None}},
                           {"retry-after-ms": "10"})
        if behaviour == "500":
            return h._json(500, {"error": {"message": "internal error", "type": "server_error"}})
        if behaviour == "malformed":
            return h._send(200, b'{"id": "x", "choices": [')
        text, refusal, finish = label, None, "stop"
        if behaviour == "refuse":
            text, refusal = None, "I'm sorry, I can't help with identifying race."
        elif behaviour == "text-refuse":
            text = "I cannot determine someone's race from a photo."
        elif behaviour == "offlist":
            text = "purple"
        elif "response_format" in body:
            text = json.dumps({"answer": label})
        with self._lock:
            self.answered[key] += 1
        answer = {"id": f"chatcmpl-{self.calls}", "object": "chat.completion", "created": 0,
                  "model": self.answers_as or body["model"],
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": refusal},
                               "logprobs": None, "finish_reason": finish}],
                  "usage": {"prompt_tokens": 100, "completion_tokens": 2, "total_tokens": 102}}
        if self.omit_model:
            del answer["model"]
        h._json(200, answer)

    # --- Gemini generateContent ---
    def _gemini_answer(self, body, behaviour, model: str = ""):
        parts = body["contents"][0]["parts"]
        data = next(p.get("inlineData", p.get("inline_data"))["data"] for p in parts if "inlineData" in p or "inline_data" in p)
        key, label = self._image_of(data)
        usage = {"promptTokenCount": 260, "candidatesTokenCount": 1, "totalTokenCount": 261}
        if behaviour == "refuse":
            return key, {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage}
        gen = body.get("generationConfig", body.get("generation_config")) or {}
        limit = gen.get("maxOutputTokens", gen.get("max_output_tokens"))
        tc = gen.get("thinkingConfig") or gen.get("thinking_config") or {}
        budget = tc.get("thinkingBudget", tc.get("thinking_budget", 0))  # proto JSON takes either spelling
        thought = self.thinking_tokens if budget != 0 else 0
        if behaviour == "max-tokens" or (limit is not None and thought and limit < thought + 1):
            used = limit if limit is not None else thought
            return key, {"candidates": [{"content": {"role": "model"}, "finishReason": "MAX_TOKENS", "index": 0}],
                         "usageMetadata": {"promptTokenCount": 260, "thoughtsTokenCount": used,
                                           "totalTokenCount": 260 + used}, "modelVersion": self.answers_as or model}
        text = {"text-refuse": "I cannot determine race.", "offlist": "purple"}.get(behaviour, label)
        parts = ([{"text": "Looking at the face...", "thought": True}] if thought else []) + [{"text": text}]
        if thought:
            usage = usage | {"thoughtsTokenCount": thought, "totalTokenCount": 261 + thought}
        answer = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                  "usageMetadata": usage, "modelVersion": self.answers_as or model}
        if self.omit_model:
            del answer["modelVersion"]
        return key, answer

    def _gemini(self, h, body):
        behaviour = self._next()
        self.requests.append(body)
        if self.delay_s:
            time.sleep(self.delay_s)
        if behaviour == "hang":
            return self._hang()
        if behaviour in ("429", "500"):
            status = {"429": "RESOURCE_EXHAUSTED", "500": "INTERNAL"}[behaviour]
            return h._json(int(behaviour), {"error": {"code": int(behaviour), "message": "try later", "status": status}})
        if behaviour == "malformed":
            return h._send(200, b'{"candidates": [{"content": ')
        key, resp = self._gemini_answer(body, behaviour, re.search(r"models/([^/:]+):", h.path).group(1))
        with self._lock:
            self.answered[key] += 1
        h._json(200, resp)

    def _gemini_batch(self, h, body):
        with self._lock:
            self.calls += 1
        name = f"batches/job{len(self.batches) + 1}"
        reqs = body["batch"]["inputConfig"]["requests"]["requests"]
        meta = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
                "name": name, "model": body["batch"].get("model", ""), "state": "BATCH_STATE_PENDING"}
        if self.batch_state == "succeed":
            answers = []
            for r in reqs:
                key, resp = self._gemini_answer(r["request"], "ok", r["request"].get("model", "").split("/")[-1])
                with self._lock:
                    self.answered[key] += 1
                answers.append({"response": resp})
            meta["state"] = "BATCH_STATE_SUCCEEDED"
            meta["output"] = {"inlinedResponses": {"inlinedResponses": answers}}
        self.batches[name] = {"name": name, "metadata": meta, "done": meta["state"] != "BATCH_STATE_PENDING"}
        self.batch_requests[name] = reqs
        h._json(200, self.batches[name])

    def complete_batch(self, name: str) -> None:
        """Finish a pending batch job (the queue moved while its client was dead)."""
        answers = []
        for i, r in enumerate(self.batch_requests[name]):
            if i in self.batch_item_errors:
                answers.append({"error": {"code": 500, "message": "internal error in batch item"}})
                continue
            key, resp = self._gemini_answer(r["request"], "ok", r["request"].get("model", "").split("/")[-1])
            with self._lock:
                self.answered[key] += 1
            answers.append({"response": resp})
        meta = self.batches[name]["metadata"]
        meta["state"] = "BATCH_STATE_SUCCEEDED"
        meta["output"] = {"inlinedResponses": {"inlinedResponses": answers}}
        self.batches[name]["done"] = True
