"""OpenAI chat-completions backend (OpenAI, or any compatible server — vLLM, Ollama — via base_url).

One request per image set: the images go as base64 data URLs (downscaled to `image_max_side`), the
prompt as text. Temperature 0 by default; with `constrain` and options, the answer is restricted by a
JSON-schema `response_format` (an enum of the options), which OpenAI and vLLM both honour. Retries
are ours (the SDK's are switched off) so 429/5xx handling is the same for every backend.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from biasaudit.backends.vlm.base import (OK, REFUSED, RETRYABLE_STATUS, OnResult, RetryableError, TokenBucket,
                                         VLMBackend, VLMRequest, VLMResponse, call_with_retries, encode_image,
                                         failed)


def _retry_after(headers: Any) -> float | None:
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) * scale
            except ValueError:
                return None
    return None


class OpenAIChatVLM(VLMBackend):
    name = "openai"

    def __init__(self, spec: Any):
        super().__init__()
        import openai

        self.spec = spec
        self.model_id = spec.model_id
        self.revision = spec.revision
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if spec.api_key_env and not key and not spec.base_url:
            raise RuntimeError(f"environment variable {spec.api_key_env} is not set (classify.vlm.api_key_env)")
        self._openai = openai
        self.client = openai.OpenAI(api_key=key or "unused", base_url=spec.base_url or None,
                                    timeout=spec.timeout_s, max_retries=0)
        self.bucket = TokenBucket(spec.requests_per_minute, burst=spec.concurrency)

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        return {"temperature": s.temperature, "max_tokens": s.max_tokens, "constrain": s.constrain,
                "image_max_side": s.image_max_side, "image_format": s.image_format}

    def _messages(self, req: VLMRequest) -> tuple[list[dict[str, Any]] | None, str]:
        content: list[dict[str, Any]] = []
        for path in req.images:
            data, mime, reason = encode_image(path, self.spec.image_max_side, self.spec.image_format)
            if data is None:
                return None, reason
            url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
            content.append({"type": "image_url", "image_url": {"url": url}})
        content.append({"type": "text", "text": req.prompt})
        return [{"role": "user", "content": content}], ""

    def _once(self, req: VLMRequest, messages: list[dict[str, Any]]) -> VLMResponse:
        oa = self._openai
        kwargs: dict[str, Any] = {"model": self.model_id, "messages": messages, "temperature": self.spec.temperature,
                                  "max_tokens": min(req.max_tokens, self.spec.max_tokens) if req.options else req.max_tokens}
        if self.spec.constrain and req.options:
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "strict": True,
                "schema": {"type": "object", "properties": {"answer": {"type": "string", "enum": list(req.options)}},
                           "required": ["answer"], "additionalProperties": False}}}
            kwargs["max_tokens"] = max(kwargs["max_tokens"], 32)
        try:
            completion = self.client.chat.completions.create(**kwargs)
        except oa.APIStatusError as exc:
            if exc.status_code in RETRYABLE_STATUS:
                raise RetryableError(f"HTTP {exc.status_code}", _retry_after(exc.response.headers)) from None
            return failed(f"HTTP {exc.status_code}: {str(exc.message)[:200]}")
        except (oa.APITimeoutError, oa.APIConnectionError) as exc:
            raise RetryableError(type(exc).__name__) from None
        except (oa.APIResponseValidationError, json.JSONDecodeError, ValueError) as exc:
            return failed(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}")
        if not getattr(completion, "choices", None):
            return failed("malformed response: no choices")
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
        if "response_format" in kwargs:
            text = _unwrap_answer(text)
        return VLMResponse(text=text, status=OK, tokens_in=tin, tokens_out=tout,
                           meta={"finish_reason": choice.finish_reason})

    def _one(self, req: VLMRequest) -> VLMResponse:
        messages, reason = self._messages(req)
        if messages is None:
            return failed(reason)
        return call_with_retries(lambda: self._once(req, messages), self.spec.max_retries, self.spec.retry_backoff_s,
                                 self.bucket, on_attempt=lambda a: (self._count("attempts"), a and self._count("retries")))

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
