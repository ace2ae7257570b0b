"""Gemini image models (e.g. gemini-nano-banana-2.1, the successor Google names for the retired Imagen 4
Fast) through google-genai `generate_content`: the prompt as text, `responseModalities: ["IMAGE"]`, the
size as `imageConfig` (aspectRatio, imageSize), the seed in the generation config, and the answer's
image as an `inlineData` part of the first candidate (Gemini API docs, "Image generation",
https://ai.google.dev/gemini-api/docs/image-generation).

The response's `modelVersion` is recorded per image; an image from another model than the one asked
(lifecycle.answered_as_asked) is failed with both names and stops the stage. `thinking_level` sets the
model's thinking (the Imagen migration guide maps Imagen 4 Fast to MINIMAL). `base_url` points the SDK at
another endpoint (a proxy, or tests/servers_images.py, which speaks the same wire format).
"""

from __future__ import annotations

import os
from typing import Any

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult, api_key_problems, decode_image
from biasaudit.backends.transport import (
    GEMINI_BLOCKED,
    RetryableError,
    TokenBucket,
    api_failure_reason,
    call_with_retries,
    enum_name,
    genai_errors,
    genai_http_options,
    is_policy_refusal,
    probe_gemini,
)
from biasaudit.params.generate import GeneratorSpec
from biasaudit.registry import register


@register("generator", "gemini-image")
class GeminiImageGenerator(Generator):
    backend = "gemini-image"
    needs = (("hosted",),)  # an API key, or the local server at base_url
    requires_all = ("model_id",)
    requires_any = ("api_key_env", "base_url")
    # output sizes (width, height) → aspectRatio, per imageSize (the image generation page's 1K and 2K tables)
    sizes_by = "image_size"
    sizes = {"1K": {(1024, 1024): "1:1", (864, 1184): "3:4", (1184, 864): "4:3", (768, 1344): "9:16",
                    (1344, 768): "16:9"},
             "2K": {(2048, 2048): "1:1", (1728, 2368): "3:4", (2368, 1728): "4:3", (1536, 2688): "9:16",
                    (2688, 1536): "16:9"}}

    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        return spec.revision or spec.model_id, [] if spec.base_url else api_key_problems(spec, key)

    def __init__(self, name: str, spec: GeneratorSpec, sleep=None):
        from google import genai
        from google.genai import types

        super().__init__(name, spec.model_id, spec.revision or spec.model_id)
        self.spec, self.types = spec, types
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if not key and not spec.base_url:
            raise RuntimeError(f"environment variable {spec.api_key_env or '(api_key_env)'} is not set")
        self.client = genai.Client(api_key=key or "unused", http_options=genai_http_options(spec.base_url, spec.timeout_s))
        self.aspect_ratio = self.sizes[spec.image_size][(spec.width, spec.height)]
        self.bucket = TokenBucket(spec.requests_per_minute)
        self._sleep = sleep

    def settings(self) -> dict[str, Any]:
        s = self.spec
        return {"aspect_ratio": self.aspect_ratio, "image_size": s.image_size, "thinking_level": s.thinking_level,
                "width": s.width, "height": s.height, "sdk": "google-genai generate_content (responseModalities IMAGE)"}

    def probe(self) -> str:
        return probe_gemini(self.client, self.model_id, self.spec.base_url or "the Gemini API",
                            sleep=self._sleep)

    def _config(self, req: GenRequest):
        t, s = self.types, self.spec
        # no candidateCount: Gemini 3 models take none (Google's SDKs deprecate it as unsupported there)
        kw: dict[str, Any] = dict(response_modalities=["IMAGE"], seed=req.seed % (2**31 - 1),
                                  image_config=t.ImageConfig(aspect_ratio=self.aspect_ratio, image_size=s.image_size))
        if s.thinking_level:
            kw["thinking_config"] = t.ThinkingConfig(thinking_level=s.thinking_level)
        return t.GenerateContentConfig(**kw)

    def _call(self, req: GenRequest):
        with genai_errors():
            return self.client.models.generate_content(model=self.model_id, contents=req.prompt,
                                                       config=self._config(req))

    def _one(self, req: GenRequest) -> GenResult:
        from google.genai import errors

        from biasaudit.lifecycle import mismatch, version_of

        s = self.spec
        extra: dict[str, Any] = {"seed_sent": req.seed % (2**31 - 1)}
        try:
            kw = {"sleep": self._sleep} if self._sleep else {}
            resp, retries = call_with_retries(lambda: self._call(req), s.max_retries, s.backoff_s, s.max_backoff_s,
                                              bucket=self.bucket, **kw)
        except RetryableError as exc:
            return GenResult.failed(f"gave up after {getattr(exc, 'retries', s.max_retries)} retries: {exc}",
                                    getattr(exc, "retries", s.max_retries), **extra)
        except errors.APIError as exc:
            text = api_failure_reason(exc)
            if is_policy_refusal(getattr(exc, "message", "") or ""):
                return GenResult.refused(f"content policy: {text}"[:500], **extra)
            return GenResult.failed(text[:500], **extra)
        except Exception as exc:
            return GenResult.failed(f"{type(exc).__name__}: {exc}"[:500], **extra)
        reported = getattr(resp, "model_version", None)
        extra["model_version"] = version_of(reported)  # UNVERIFIED when the API named no model
        extra["response_id"] = getattr(resp, "response_id", None) or ""
        why = mismatch(self.model_id, reported)
        if why:
            return GenResult.failed(why, retries, **extra, model_mismatch=True)
        block = enum_name(getattr(getattr(resp, "prompt_feedback", None), "block_reason", None))
        if block and block != "BLOCKED_REASON_UNSPECIFIED":
            return GenResult.refused(f"content policy: prompt blocked ({block})", retries, **extra)
        texts = []
        for cand in getattr(resp, "candidates", None) or []:
            for part in (cand.content.parts if cand.content and cand.content.parts else []):
                data = getattr(getattr(part, "inline_data", None), "data", None)
                if data and not getattr(part, "thought", False):
                    try:
                        return GenResult(decode_image(data), retries=retries, seed_used=True, extra=extra)
                    except ValueError as exc:
                        return GenResult.failed(f"unreadable image returned: {exc}", retries, **extra)
                if getattr(part, "text", None):
                    texts.append(part.text)
            finish = enum_name(getattr(cand, "finish_reason", None))
            if finish in GEMINI_BLOCKED:
                return GenResult.refused(f"content policy: finish_reason {finish}", retries, **extra)
        said = f": {' '.join(texts)[:200]}" if texts else ""
        return GenResult.refused(f"no image returned{said}", retries, **extra) if texts and is_policy_refusal(said) \
            else GenResult.failed(f"no image in the response{said}", retries, **extra)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]
