"""Hosted image editing: Gemini (google-genai `generate_content` with an image part and the instruction,
image output) and any OpenAI-compatible `images/edits` endpoint (openai SDK, multipart upload).

Keys come only from the environment variable named by `api_key_env`; `base_url` points the SDKs at
another endpoint (a proxy, or the local test server in tests/servers_edit.py speaking the same wire
format). Transient failures (429, 5xx, timeouts) are retried with backoff; content-policy blocks are
recorded as `refused`, other errors as `failed`.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

from biasaudit.backends.editors.base import EditRequest, EditResult, ImageEditor
from biasaudit.backends.generators.base import decode_image
from biasaudit.backends.transport import (
    RetryableError,
    TokenBucket,
    call_with_retries,
    genai_errors,
    genai_http_options,
    is_policy_refusal,
    openai_client,
    openai_errors,
)
from biasaudit.backends.vlm.base import encode_image
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import Counterfactuals

GEMINI_BLOCK_REASONS = {"SAFETY", "PROHIBITED_CONTENT", "IMAGE_SAFETY", "BLOCKLIST", "SPII", "RECITATION",
                        "IMAGE_PROHIBITED_CONTENT", "OTHER"}


def source_png(path: str, max_side: int) -> tuple[bytes | None, str]:
    data, _, reason = encode_image(path, max_side, fmt="PNG")
    return data, (f"source: {reason}" if data is None else "")


def _api_key(spec: Counterfactuals) -> str:
    if not spec.api_key_env:
        raise RuntimeError("counterfactuals.api_key_env: name the environment variable holding the API key")
    key = os.environ.get(spec.api_key_env)
    if not key:
        raise RuntimeError(f"environment variable {spec.api_key_env} is not set")
    return key


class _Hosted(ImageEditor):
    def __init__(self, spec: Counterfactuals, sleep=None):
        self.spec = spec
        self.model_id, self.revision = spec.model_id, spec.revision or spec.model_id
        self.bucket = TokenBucket(spec.requests_per_minute)
        self._sleep = sleep

    def _retrying(self, fn):
        kw = {"sleep": self._sleep} if self._sleep else {}
        return call_with_retries(fn, self.spec.max_retries, 2.0, 60.0, bucket=self.bucket, **kw)

    def edit(self, requests: list[EditRequest]) -> list[EditResult]:
        out = []
        for req in requests:
            try:
                out.append(self._one(req))
            except RetryableError as exc:
                out.append(EditResult.failed(f"gave up after {getattr(exc, 'retries', 0)} retries: {exc}"))
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                if is_policy_refusal(text):
                    out.append(EditResult.refused(f"content policy: {text}"))
                else:
                    out.append(EditResult.failed(text))
        return out

    def settings(self) -> dict[str, Any]:
        return {"image_max_side": self.spec.image_max_side, "base_url": bool(self.spec.base_url)}


@register("editor", "gemini")
class GeminiEditor(_Hosted):
    name = "gemini"
    needs = (("hosted",),)  # an API key, or the local server at base_url

    def __init__(self, spec: Counterfactuals, sleep=None):
        from google import genai
        from google.genai import types

        super().__init__(spec, sleep)
        self.types = types
        self.client = genai.Client(api_key=_api_key(spec), http_options=genai_http_options(spec.base_url, spec.timeout_s))

    def _call(self, png: bytes, req: EditRequest):
        t = self.types
        # no candidateCount: Gemini 3 image models take none (Google's SDKs deprecate it as unsupported there)
        config = t.GenerateContentConfig(response_modalities=["IMAGE", "TEXT"], seed=req.seed % (2**31 - 1))
        with genai_errors():
            return self.client.models.generate_content(
                model=self.spec.model_id, config=config,
                contents=[t.Part.from_bytes(data=png, mime_type="image/png"), req.instruction])

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_gemini

        return probe_gemini(self.client, self.spec.model_id, self.spec.base_url or "the Gemini API",
                            sleep=self._sleep)

    def _one(self, req: EditRequest) -> EditResult:
        from biasaudit.lifecycle import mismatch, version_of

        png, reason = source_png(req.source, self.spec.image_max_side)
        if png is None:
            return EditResult.failed(reason)
        resp, retries = self._retrying(lambda: self._call(png, req))
        reported = getattr(resp, "model_version", None)
        version = version_of(reported)  # UNVERIFIED when the API named no model
        why = mismatch(self.spec.model_id, reported)
        if why:
            return EditResult.failed(why, retries=retries, model_version=version, model_mismatch=True)
        result = self._read(resp, retries)
        result.meta["model_version"] = version
        return result

    def _read(self, resp: Any, retries: int) -> EditResult:
        feedback = getattr(resp, "prompt_feedback", None)
        if feedback is not None and getattr(feedback, "block_reason", None):
            return EditResult.refused(f"content policy: prompt blocked ({feedback.block_reason})", retries=retries)
        texts = []
        for cand in resp.candidates or []:
            for part in (cand.content.parts if cand.content and cand.content.parts else []):
                if part.inline_data is not None and part.inline_data.data:
                    try:
                        return EditResult(decode_image(part.inline_data.data), "ok", meta={"retries": retries})
                    except ValueError as exc:
                        return EditResult.failed(f"unreadable image returned: {exc}", retries=retries)
                if part.text:
                    texts.append(part.text)
            finish = str(getattr(cand.finish_reason, "name", cand.finish_reason) or "")
            if finish in GEMINI_BLOCK_REASONS:
                return EditResult.refused(f"content policy: finish_reason {finish}", retries=retries,
                                          text=" ".join(texts)[:300])
        return EditResult.failed("no image in the response" + (f": {' '.join(texts)[:200]}" if texts else ""),
                                 retries=retries)


@register("editor", "openai")
class OpenAIEditor(_Hosted):
    name = "openai"
    needs = (("hosted",),)  # an API key, or the local server at base_url

    def __init__(self, spec: Counterfactuals, sleep=None):
        import openai

        super().__init__(spec, sleep)
        self.openai = openai
        self.client = openai_client(_api_key(spec), spec.base_url, spec.timeout_s)

    def _call(self, png: bytes, req: EditRequest):
        kw: dict[str, Any] = {}
        if self.spec.model_id.startswith("dall-e"):
            kw["response_format"] = "b64_json"  # gpt-image models always return base64 and reject it
        with openai_errors():
            return self.client.images.edit(model=self.spec.model_id, image=("source.png", png, "image/png"),
                                           prompt=req.instruction, n=1, **kw)

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_openai

        return probe_openai(self.client, self.spec.model_id, self.spec.base_url or "api.openai.com")

    def _one(self, req: EditRequest) -> EditResult:
        png, reason = source_png(req.source, self.spec.image_max_side)
        if png is None:
            return EditResult.failed(reason)
        try:
            resp, retries = self._retrying(lambda: self._call(png, req))
        except self.openai.BadRequestError as exc:
            text = str(exc)
            if is_policy_refusal(text):
                return EditResult.refused(f"content policy: {text}")
            return EditResult.failed(f"HTTP 400: {text}")
        data = list(resp.data or [])
        if not data or not data[0].b64_json:
            return EditResult.failed("no image in the response", retries=retries)
        try:
            return EditResult(decode_image(base64.b64decode(data[0].b64_json)), "ok", meta={"retries": retries})
        except ValueError as exc:
            return EditResult.failed(f"unreadable image returned: {exc}", retries=retries)
