"""OpenAI images (`POST /v1/images/generations`) and any OpenAI-compatible image server (base_url).

The official `openai` SDK sends the request; its own retries are off so that this module counts
retries (429, 5xx, timeouts; Retry-After honoured) the same way for every backend. Content-policy
refusals (400 `content_policy_violation` / `moderation_blocked`) are recorded as `refused`.
OpenAI's image API takes no seed: the derived seed is recorded with `seed_used = False`.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import httpx

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult, api_key_problems, decode_image
from biasaudit.backends.transport import (
    RetryableError,
    TokenBucket,
    api_failure_reason,
    call_with_retries,
    http_client,
    openai_client,
    openai_errors,
)
from biasaudit.params.generate import GeneratorSpec
from biasaudit.registry import register

REFUSAL_CODES = {"content_policy_violation", "moderation_blocked", "safety_violation"}


def sends_response_format(model_id: str, response_format: str) -> str | None:
    """The `response_format` to send: none for GPT image models (they always return base64 and
    reject the parameter), b64_json for DALL·E and compatible servers under 'auto'."""
    if response_format == "omit" or (response_format == "auto" and is_gpt_image(model_id)):
        return None
    return "b64_json" if response_format == "auto" else response_format


def is_gpt_image(model_id: str) -> bool:
    return model_id.split("/")[-1].startswith("gpt-image")


@register("generator", "openai")
class OpenAIImagesGenerator(Generator):
    backend = "openai"
    needs = (("hosted",),)  # an API key, or the local server at base_url
    requires_all = ("model_id", "api_key_env")
    # sizes the official models accept (other, OpenAI-compatible model names accept any size)
    sizes_by = "model_id"
    sizes = {"gpt-image-1": ((1024, 1024), (1536, 1024), (1024, 1536)),
             "gpt-image-1-mini": ((1024, 1024), (1536, 1024), (1024, 1536)),
             "dall-e-3": ((1024, 1024), (1792, 1024), (1024, 1792)),
             "dall-e-2": ((256, 256), (512, 512), (1024, 1024))}
    no_response_format = ("gpt-image",)  # model-id prefixes that reject response_format (always base64)


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        return spec.revision or spec.model_id, api_key_problems(spec, key)

    def __init__(self, name: str, spec: GeneratorSpec, sleep=None):
        import openai

        super().__init__(name, spec.model_id, spec.revision or spec.model_id)
        api_key = os.environ.get(spec.api_key_env or "")
        if not api_key:
            raise RuntimeError(f"environment variable {spec.api_key_env} is not set")
        self.spec, self.openai = spec, openai
        self.client = openai_client(api_key, spec.base_url, spec.timeout_s)
        self.bucket = TokenBucket(spec.requests_per_minute)
        self._sleep = sleep

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_openai

        return probe_openai(self.client, self.spec.model_id, self.spec.base_url or "api.openai.com", sleep=self._sleep)

    def settings(self) -> dict[str, Any]:
        s = self.spec
        sent = sends_response_format(s.model_id, s.response_format)
        return {"size": f"{s.width}x{s.height}", "quality": s.quality, "response_format": sent or "(not sent)",
                "n": 1, "sdk": "openai images.generate"}

    def _call(self, req: GenRequest):
        s = self.spec
        kw: dict[str, Any] = {"model": s.model_id, "prompt": req.prompt, "n": 1, "size": f"{s.width}x{s.height}"}
        if s.quality:
            kw["quality"] = s.quality
        fmt = sends_response_format(s.model_id, s.response_format)
        if fmt is not None:
            kw["response_format"] = fmt
        with openai_errors():
            return self.client.images.generate(**kw)

    def _fetch(self, url: str) -> bytes:
        with http_client(self.spec.timeout_s) as client:  # the download under the same total deadline
            resp = client.get(url)
            resp.raise_for_status()
            return resp.content

    def _one(self, req: GenRequest) -> GenResult:
        s, oa = self.spec, self.openai
        try:
            kw = {"sleep": self._sleep} if self._sleep else {}
            response, retries = call_with_retries(lambda: self._call(req), s.max_retries, s.backoff_s,
                                                  s.max_backoff_s, bucket=self.bucket, **kw)
        except RetryableError as exc:
            n = getattr(exc, "retries", s.max_retries)
            return GenResult.failed(f"gave up after {n} retries: {exc}", n)
        except oa.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            err = body.get("error", body) if isinstance(body, dict) else {}
            code = (err or {}).get("code") if isinstance(err, dict) else None
            message = (err or {}).get("message", "") if isinstance(err, dict) else str(exc)
            text = f"HTTP {exc.status_code} {code or ''}: {message}".strip()
            if code in REFUSAL_CODES or "safety system" in str(message).lower():
                return GenResult.refused(f"content policy: {text}"[:500])
            return GenResult.failed(api_failure_reason(exc)[:500])
        except Exception as exc:
            return GenResult.failed(f"{type(exc).__name__}: {exc}"[:500])
        data = list(getattr(response, "data", None) or [])
        if not data:
            return GenResult.refused("no image returned", retries)
        item = data[0]
        try:
            if getattr(item, "b64_json", None):
                raw = base64.b64decode(item.b64_json, validate=True)
            elif getattr(item, "url", None):
                raw = self._fetch(item.url)
            else:
                return GenResult.failed("response has neither b64_json nor url", retries)
            rgb = decode_image(raw)
        except (ValueError, httpx.HTTPError) as exc:
            return GenResult.failed(f"bad image payload: {exc}"[:500], retries)
        extra = {"revised_prompt": item.revised_prompt} if getattr(item, "revised_prompt", None) else {}
        return GenResult(rgb, retries=retries, seed_used=False, extra=extra)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]
