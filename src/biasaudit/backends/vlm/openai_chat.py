"""OpenAI chat-completions backend (OpenAI, or any compatible server — vLLM, Ollama, DashScope — via base_url).

One request per image set: the user turn follows `VLMRequest.parts()` (2AFC: "Image A:", image,
"Image B:", image, question), images as base64 data URLs downscaled to `image_max_side`. With
`constrain` and options the answer is restricted by a JSON-schema `response_format` (an enum of the
options), which OpenAI and vLLM both honour.

Capabilities (`capabilities`): OpenAI reasoning models (gpt-5*, o1/o3/o4*) reject `max_tokens` and
any `temperature` but the default, and count reasoning tokens against `max_completion_tokens`; they get
`max_completion_tokens` = answer + a reserve for the `reasoning_effort` (param; default minimal)
and no temperature. Every other model, and every non-OpenAI server, keeps `max_tokens` + `temperature`.
A 400 naming a parameter is one clear failure reason ("unsupported parameter 'x' ..."); an answer
cut off by the token limit with no text is failed and asked once more with 4× the budget.
Structured-output fallback: any HTTP 400 to a request carrying the JSON-schema `response_format`, whatever
its message (DashScope documents the mode for only some qwen-plus models, and its 400s need not name it),
unless it names another rejected parameter, gets the same question once more without it, and the
plain-text answer goes to the same strict parser; when that plain question is answered, this backend asks
without the schema from then on (a 400 to the plain question too is a failure, and the schema stays).
Every answer records which mode produced it (`meta.answer_mode`: json_schema | plain | plain (server
rejected json_schema)) and, after a fallback, the first 400's reason (`meta.schema_rejection`).
Retries are the transport layer's (the SDK's are off).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from biasaudit.backends.transport import (
    RetryableError,
    TokenBucket,
    api_failure_reason,
    openai_client,
    openai_errors,
    unsupported_parameter,
)
from biasaudit.backends.vlm.base import (
    FAILED,
    OK,
    REFUSED,
    OnResult,
    VLMBackend,
    VLMRequest,
    VLMResponse,
    encode_image,
    failed,
    retried,
)
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec

# Output tokens reserved for reasoning per effort (reasoning tokens count against max_completion_tokens).
REASONING_RESERVE = {"minimal": 1024, "low": 4096, "medium": 16384, "high": 32768}
REASONING_PREFIXES = ("gpt-5", "gpt-6", "o1", "o3", "o4")  # gpt-6.1-sol takes effort low and up (no minimal)
NON_REASONING = ("gpt-5-chat",)  # the chat-tuned gpt-5 snapshot takes temperature and no effort
EMPTY_RETRY_FACTOR = 4
SCHEMA_MARKERS = ("response_format", "json_schema")  # a rejected parameter named so is the schema itself
PLAIN, SCHEMA, PLAIN_AFTER_REJECTION = "plain", "json_schema", "plain (server rejected json_schema)"


def rejects_schema(exc: Any) -> bool:
    """Whether an API error to a request carrying the JSON-schema response_format is taken as the schema's
    rejection: any HTTP 400, whatever its message says (DashScope answers some models' json_schema with
    "InternalError.Algo.InvalidParameter: Range of input length ...", or a bare "Invalid value"), except
    one that names another rejected parameter (`param: max_tokens`): that one fails as it is, since the
    plain question would carry the same parameter. The request is asked once more without the schema; a
    400 to that plain request stays a failure."""
    if getattr(exc, "status_code", None) != 400:
        return False
    param = unsupported_parameter(exc)
    return not param or any(m in param.lower() for m in SCHEMA_MARKERS)


@dataclass(frozen=True)
class Capabilities:
    reasoning: bool
    token_param: str  # max_tokens | max_completion_tokens
    temperature: bool
    effort: str  # '' unless reasoning


def capabilities(model_id: str, effort: str = "") -> Capabilities:
    """What a request to `model_id` may carry, by model family. Models served by vLLM, Ollama or
    DashScope (Llama, Qwen, ...) are not in the reasoning families and keep the classic parameters."""
    name = model_id.split("/")[-1].lower()
    reasoning = name.startswith(REASONING_PREFIXES) and not name.startswith(NON_REASONING)
    if reasoning:
        return Capabilities(True, "max_completion_tokens", False, effort or ("low" if name.startswith("gpt-6") else "minimal"))
    return Capabilities(False, "max_tokens", True, "")


@register("vlm", "openai")
class OpenAIChatVLM(VLMBackend):
    name = "openai"
    needs = (("hosted",),)  # an API key, or the local server at base_url
    requires_any = ("api_key_env", "base_url")

    def __init__(self, spec: VLMSpec):
        super().__init__()
        import openai

        self.spec = spec
        self.model_id = spec.model_id
        self.revision = spec.revision
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if spec.api_key_env and not key and not spec.base_url:
            raise RuntimeError(f"environment variable {spec.api_key_env} is not set (classify.vlm.api_key_env)")
        self._openai = openai
        self.client = openai_client(key, spec.base_url, spec.timeout_s)
        self.bucket = TokenBucket(spec.requests_per_minute, burst=spec.concurrency)
        self.caps = capabilities(spec.model_id, spec.reasoning_effort)
        self.schema_rejected = False  # set once the server has refused the JSON-schema response_format

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        out = {"temperature": s.temperature if self.caps.temperature else "model default",
               "max_tokens": s.max_tokens, "constrain": s.constrain, "image_max_side": s.image_max_side,
               "image_format": s.image_format}
        if self.caps.reasoning:
            out |= {"token_param": self.caps.token_param, "reasoning_effort": self.caps.effort}
        return out

    def _messages(self, req: VLMRequest) -> tuple[list[dict[str, Any]] | None, str]:
        content: list[dict[str, Any]] = []
        for kind, value in req.parts():
            if kind == "text":
                content.append({"type": "text", "text": value})
                continue
            data, mime, reason = encode_image(value, req.max_side(self.spec.image_max_side), self.spec.image_format)
            if data is None:
                return None, reason
            url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
            content.append({"type": "image_url", "image_url": {"url": url}})
        return [{"role": "user", "content": content}], ""

    def request_body(self, req: VLMRequest, messages: list[dict[str, Any]], factor: int = 1) -> dict[str, Any]:
        """The keyword arguments of chat.completions.create for this request (pure; tested)."""
        caps = self.caps
        answer = min(req.max_tokens, self.spec.max_tokens) if req.options else req.max_tokens
        constrained = bool(self.spec.constrain and req.options and not self.schema_rejected)
        if constrained:
            answer = max(answer, 32)  # the JSON wrapper {"answer": "..."} needs room
        kwargs: dict[str, Any] = {"model": self.model_id, "messages": messages}
        if caps.reasoning:
            kwargs["max_completion_tokens"] = (answer + REASONING_RESERVE[caps.effort]) * factor
            kwargs["reasoning_effort"] = caps.effort
        else:
            kwargs["max_tokens"] = answer * factor
            kwargs["temperature"] = self.spec.temperature
        if constrained:
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "strict": True,
                "schema": {"type": "object", "properties": {"answer": {"type": "string", "enum": list(req.options)}},
                           "required": ["answer"], "additionalProperties": False}}}
        return kwargs

    def _once(self, req: VLMRequest, messages: list[dict[str, Any]], factor: int = 1) -> VLMResponse:
        oa = self._openai
        kwargs = self.request_body(req, messages, factor)
        try:
            with openai_errors():
                completion = self.client.chat.completions.create(**kwargs)
        except RetryableError:
            raise
        except oa.APIStatusError as exc:
            response = failed(api_failure_reason(exc))
            response.meta["http_status"] = getattr(exc, "status_code", None)
            if "response_format" in kwargs and rejects_schema(exc):
                response.meta["schema_rejected"] = True
            return response
        except (json.JSONDecodeError, ValueError) as exc:
            return failed(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}")
        if not getattr(completion, "choices", None):
            return failed("malformed response: no choices")
        return self.answered_by(self._read(completion, kwargs, req), getattr(completion, "model", None))

    def _read(self, completion: Any, kwargs: dict[str, Any], req: VLMRequest) -> VLMResponse:
        choice = completion.choices[0]
        usage = getattr(completion, "usage", None)
        tin = getattr(usage, "prompt_tokens", None)
        tout = getattr(usage, "completion_tokens", None)
        message = choice.message
        refusal = getattr(message, "refusal", None)
        if refusal:
            return VLMResponse(text=refusal, status=REFUSED, reason="model refusal", tokens_in=tin, tokens_out=tout)
        if choice.finish_reason == "content_filter":
            return VLMResponse(text=message.content or "", status=REFUSED, reason="content filter",
                               tokens_in=tin, tokens_out=tout)
        text = message.content or ""
        meta = {"finish_reason": choice.finish_reason,
                "answer_mode": SCHEMA if "response_format" in kwargs else
                PLAIN_AFTER_REJECTION if self.schema_rejected and req.options and self.spec.constrain else PLAIN}
        if not text.strip():
            why = "cut off by the token limit (finish_reason length)" if choice.finish_reason == "length" else "empty answer"
            return VLMResponse("", FAILED, why, tin, tout, meta=meta | {"empty_answer": True})
        if "response_format" in kwargs:
            text = _unwrap_answer(text)
        return VLMResponse(text=text, status=OK, tokens_in=tin, tokens_out=tout, meta=meta)

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_openai

        return probe_openai(self.client, self.model_id, self.spec.base_url or "api.openai.com")

    def _ask(self, req: VLMRequest, messages: list[dict[str, Any]], factor: int) -> VLMResponse:
        return retried(lambda: self._once(req, messages, factor), self.spec, self.bucket,
                       on_attempt=lambda a: (self._count("attempts"), a and self._count("retries")))

    def _one(self, req: VLMRequest) -> VLMResponse:
        messages, reason = self._messages(req)
        if messages is None:
            return failed(reason)
        response = self._ask(req, messages, 1)
        if response.meta.get("schema_rejected"):  # the same question once more, as plain text
            rejection = response.reason
            self.schema_rejected = True
            self._count("schema_fallbacks")
            response = self._ask(req, messages, 1)
            response.meta["answer_mode"] = response.meta.get("answer_mode") or PLAIN_AFTER_REJECTION
            response.meta["schema_rejection"] = rejection  # the reason of the first (schema) 400
            if response.meta.get("http_status") == 400:  # plain was rejected too: not the schema's fault,
                self.schema_rejected = False  # later questions keep asking with it
        if response.meta.get("empty_answer"):
            self._count("empty_retries")
            response = self._ask(req, messages, EMPTY_RETRY_FACTOR)
            response.meta["budget_retry"] = True
        return response

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        return self._each(requests, self._one, on_result, self.spec.concurrency)


def _unwrap_answer(text: str) -> str:
    """`{"answer": "white"}` → `white`; anything else is returned unchanged for the strict parser."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    if isinstance(data, dict) and isinstance(data.get("answer"), str):
        return data["answer"]
    return text
