"""Imagen (e.g. Imagen 4 Fast) through the official `google-genai` SDK, Vertex mode.

`generate_images` runs in the SDK's Vertex mode only: with an API key (express mode, key read from
the environment variable named by `api_key_env`) or with `vertex_project` + `vertex_location` and
application default credentials. `base_url` points the SDK at another endpoint (a proxy, or the local
test server in tests/servers_images.py that speaks the same `:predict` wire format).

Seeds: Imagen takes a seed (1..2^31−1) only with the SynthID watermark off (`add_watermark: false`);
otherwise the derived seed is recorded but not sent (`seed_used = False`).
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult, api_key_problems, decode_image
from biasaudit.backends.transport import (
    RetryableError,
    TokenBucket,
    call_with_retries,
    genai_errors,
    genai_http_options,
    is_policy_refusal,
)
from biasaudit.params.generate import GeneratorSpec
from biasaudit.registry import register


def imagen_seed(seed: int) -> int:
    """Map a 63-bit derived seed into Imagen's accepted range 1..2^31−1."""
    return seed % (2**31 - 1) + 1


@register("generator", "imagen")
class ImagenGenerator(Generator):
    backend = "imagen"
    needs = (("hosted",),)  # an API key, or the local server at base_url
    requires_all = ("model_id",)
    requires_any = ("api_key_env", "vertex_project")  # a key, or Vertex AI's application default credentials
    # Imagen 4's output sizes (width, height) → aspect ratio, per image_size (2K doubles each side)
    sizes_by = "image_size"
    sizes = {"1K": {(1024, 1024): "1:1", (896, 1280): "3:4", (1280, 896): "4:3", (768, 1408): "9:16", (1408, 768): "16:9"},
             "2K": {(2048, 2048): "1:1", (1792, 2560): "3:4", (2560, 1792): "4:3", (1536, 2816): "9:16",
                    (2816, 1536): "16:9"}}


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        return spec.revision or spec.model_id, api_key_problems(spec, key)

    def __init__(self, name: str, spec: GeneratorSpec, sleep=None):
        from google import genai
        from google.genai import types

        super().__init__(name, spec.model_id, spec.revision or spec.model_id)
        self.spec, self.types = spec, types
        http = genai_http_options(spec.base_url, spec.timeout_s, api_version=None)  # Vertex AI
        api_key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        if spec.vertex_project:
            self.client = genai.Client(vertexai=True, project=spec.vertex_project, location=spec.vertex_location,
                                       http_options=http)
        else:
            if not api_key:
                raise RuntimeError(f"environment variable {spec.api_key_env} is not set")
            self.client = genai.Client(vertexai=True, api_key=api_key, http_options=http)
        self.aspect_ratio = self.sizes[spec.image_size][(spec.width, spec.height)]
        self.bucket = TokenBucket(spec.requests_per_minute)
        self._sleep = sleep

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_gemini

        return probe_gemini(self.client, self.spec.model_id, self.spec.base_url or "Vertex AI", sleep=self._sleep)

    def settings(self) -> dict[str, Any]:
        s = self.spec
        return {"aspect_ratio": self.aspect_ratio, "image_size": s.image_size, "person_generation": s.person_generation,
                "add_watermark": s.add_watermark, "enhance_prompt": s.enhance_prompt, "width": s.width,
                "height": s.height, "sdk": "google-genai generate_images (Vertex :predict)"}

    def _config(self, req: GenRequest):
        s = self.spec
        kw: dict[str, Any] = dict(number_of_images=1, aspect_ratio=self.aspect_ratio, include_rai_reason=True,
                                  person_generation=s.person_generation, add_watermark=s.add_watermark,
                                  enhance_prompt=s.enhance_prompt, output_mime_type="image/png")
        if s.image_size != "1K":
            kw["image_size"] = s.image_size
        if not s.add_watermark:
            kw["seed"] = imagen_seed(req.seed)
        return self.types.GenerateImagesConfig(**kw)

    def _call(self, req: GenRequest):
        try:
            with genai_errors(), warnings.catch_warnings():
                # google-genai 3.x flags generate_images as deprecated (removal not before 2027); the
                # Imagen :predict endpoint is what the published audit used.
                warnings.simplefilter("ignore", category=Warning)
                return self.client.models.generate_images(model=self.spec.model_id, prompt=req.prompt,
                                                          config=self._config(req))
        except (json.JSONDecodeError, ValueError) as exc:
            if isinstance(exc, json.JSONDecodeError) or "JSON" in str(exc):
                raise RetryableError(f"malformed response: {exc}") from None
            raise

    def _one(self, req: GenRequest) -> GenResult:
        from google.genai import errors

        s = self.spec
        extra = {"seed_sent": None if s.add_watermark else imagen_seed(req.seed)}
        try:
            kw = {"sleep": self._sleep} if self._sleep else {}
            response, retries = call_with_retries(lambda: self._call(req), s.max_retries, s.backoff_s,
                                                  s.max_backoff_s, bucket=self.bucket, **kw)
        except RetryableError as exc:
            return GenResult.failed(f"gave up after {getattr(exc, 'retries', s.max_retries)} retries: {exc}",
                                    getattr(exc, "retries", s.max_retries), **extra)
        except errors.APIError as exc:
            text = f"HTTP {exc.code} {exc.status or ''}: {exc.message or ''}".strip()
            if is_policy_refusal(exc.message):
                return GenResult.refused(f"content policy: {text}"[:500], **extra)
            return GenResult.failed(text[:500], **extra)
        except Exception as exc:
            return GenResult.failed(f"{type(exc).__name__}: {exc}"[:500], **extra)
        images = list(response.generated_images or [])
        if not images:
            return GenResult.refused("content policy: no image returned (filtered)", retries, **extra)
        first = images[0]
        if first.image is None or not first.image.image_bytes:
            reason = first.rai_filtered_reason or "no image bytes returned"
            return GenResult.refused(f"content policy: {reason}"[:500], retries, **extra)
        try:
            rgb = decode_image(first.image.image_bytes)
        except ValueError as exc:
            return GenResult.failed(str(exc), retries, **extra)
        if first.enhanced_prompt:
            extra["enhanced_prompt"] = first.enhanced_prompt
        return GenResult(rgb, retries=retries, seed_used=not s.add_watermark, extra=extra)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]
