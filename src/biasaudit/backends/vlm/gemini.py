"""Gemini backend through google-genai: temperature 0, thinking off, answer constrained to the options.

Online mode sends one generateContent request per item (thread pool + token bucket, our own
retries on 408/429/5xx). Batch mode (`batch_mode: true`, half price) submits one inline batch job,
polls it every `batch_poll_s`, and if it has not finished after `batch_stall_timeout_s` cancels it
and answers the same requests online, so a stalled queue never blocks the pipeline. Submitted jobs
are journalled (`batch_journal`, set by CachedVLM beside its cache): a run killed while its job was
queued picks the same job up again instead of paying for a second one.
Images are downscaled to `image_max_side` before sending (input tokens scale with image size).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from biasaudit.backends.vlm.base import (FAILED, OK, REFUSED, RETRYABLE_STATUS, OnResult, RetryableError,
                                         TokenBucket, VLMBackend, VLMRequest, VLMResponse, call_with_retries,
                                         encode_image, failed)

BLOCK_FINISH_REASONS = {"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "IMAGE_SAFETY",
                        "IMAGE_PROHIBITED_CONTENT"}
DONE_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
               "JOB_STATE_PARTIALLY_SUCCEEDED"}


def _enum_name(value: Any) -> str:
    return "" if value is None else str(getattr(value, "name", value)).split(".")[-1]


class GeminiVLM(VLMBackend):
    name = "gemini"

    def __init__(self, spec: Any, sleep=time.sleep, clock=time.monotonic):
        super().__init__()
        from google import genai
        from google.genai import types

        self.spec, self.types = spec, types
        self.model_id = spec.model_id
        self.revision = spec.revision
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if not key and not spec.base_url:
            raise RuntimeError(f"environment variable {spec.api_key_env or '(api_key_env)'} is not set")
        http = types.HttpOptions(base_url=spec.base_url or None, timeout=int(spec.timeout_s * 1000),
                                 retry_options=types.HttpRetryOptions(attempts=1))
        self.client = genai.Client(api_key=key or "unused", http_options=http)
        self.bucket = TokenBucket(spec.requests_per_minute, burst=spec.concurrency)
        self._sleep, self._clock = sleep, clock
        self.batch_journal: Path | None = None  # JSON {request-set hash: batch job name}

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        return {"temperature": s.temperature, "max_tokens": s.max_tokens, "thinking_budget": s.thinking_budget,
                "constrain": s.constrain, "image_max_side": s.image_max_side, "image_format": s.image_format}

    # --- request building / response reading ------------------------------------------------------
    def _contents(self, req: VLMRequest) -> tuple[list[Any] | None, str]:
        parts: list[Any] = []
        for path in req.images:
            data, mime, reason = encode_image(path, self.spec.image_max_side, self.spec.image_format)
            if data is None:
                return None, reason
            parts.append(self.types.Part.from_bytes(data=data, mime_type=mime))
        parts.append(self.types.Part.from_text(text=req.prompt))
        return [self.types.Content(role="user", parts=parts)], ""

    def _config(self, req: VLMRequest) -> Any:
        t, s = self.types, self.spec
        kwargs: dict[str, Any] = {"temperature": s.temperature,
                                  "max_output_tokens": min(req.max_tokens, s.max_tokens) if req.options else req.max_tokens,
                                  "thinking_config": t.ThinkingConfig(thinking_budget=s.thinking_budget)}
        if s.constrain and req.options:
            kwargs["response_mime_type"] = "text/x.enum"
            kwargs["response_schema"] = {"type": "STRING", "enum": list(req.options)}
        return t.GenerateContentConfig(**kwargs)

    @staticmethod
    def read_response(resp: Any) -> VLMResponse:
        """A GenerateContentResponse → VLMResponse (refusals from block/finish reasons)."""
        usage = getattr(resp, "usage_metadata", None)
        tin = getattr(usage, "prompt_token_count", None)
        tout = getattr(usage, "candidates_token_count", None)
        feedback = getattr(resp, "prompt_feedback", None)
        block = _enum_name(getattr(feedback, "block_reason", None))
        if block and block != "BLOCKED_REASON_UNSPECIFIED":
            return VLMResponse("", REFUSED, f"prompt blocked: {block}", tin, tout)
        candidates = getattr(resp, "candidates", None) or []
        if not candidates:
            return VLMResponse("", FAILED, "malformed response: no candidates", tin, tout)
        cand = candidates[0]
        finish = _enum_name(getattr(cand, "finish_reason", None))
        parts = getattr(getattr(cand, "content", None), "parts", None) or []
        text = "".join(p.text for p in parts if getattr(p, "text", None) and not getattr(p, "thought", False))
        if finish in BLOCK_FINISH_REASONS:
            return VLMResponse(text, REFUSED, f"finish reason {finish}", tin, tout)
        return VLMResponse(text.strip(), OK, "", tin, tout, meta={"finish_reason": finish})

    # --- online -------------------------------------------------------------------------------------
    def _once(self, req: VLMRequest, contents: list[Any]) -> VLMResponse:
        from google.genai import errors

        try:
            resp = self.client.models.generate_content(model=self.model_id, contents=contents, config=self._config(req))
        except errors.APIError as exc:
            code = int(getattr(exc, "code", 0) or 0)
            if code in RETRYABLE_STATUS:
                raise RetryableError(f"HTTP {code}") from None
            return failed(f"HTTP {code}: {str(getattr(exc, 'message', exc))[:200]}")
        except Exception as exc:  # noqa: BLE001 - httpx transport errors and undecodable bodies
            import httpx

            if isinstance(exc, (httpx.TimeoutException, httpx.TransportError)):
                raise RetryableError(type(exc).__name__) from None
            return failed(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}")
        return self.read_response(resp)

    def _one(self, req: VLMRequest) -> VLMResponse:
        contents, reason = self._contents(req)
        if contents is None:
            return failed(reason)
        return call_with_retries(lambda: self._once(req, contents), self.spec.max_retries, self.spec.retry_backoff_s,
                                 self.bucket, on_attempt=lambda a: (self._count("attempts"), a and self._count("retries")))

    # --- batch --------------------------------------------------------------------------------------
    def _batch(self, requests: list[VLMRequest], on_result: OnResult | None) -> list[VLMResponse] | None:
        """Run an inline batch job; None (after cancelling it) when it stalls or fails as a whole."""
        t = self.types
        out: list[VLMResponse | None] = [None] * len(requests)
        inlined, index = [], []
        for i, req in enumerate(requests):
            contents, reason = self._contents(req)
            if contents is None:
                out[i] = failed(reason)
                continue
            inlined.append(t.InlinedRequest(model=self.model_id, contents=contents, config=self._config(req)))
            index.append(i)
        if inlined:
            from biasaudit.provenance import stable_hash

            job_key = stable_hash([self.model_id, self.decoding_params()] + [
                [list(requests[i].images), requests[i].prompt, list(requests[i].options), requests[i].max_tokens]
                for i in index], length=24)
            job = self._journalled_job(job_key)
            if job is None:
                try:
                    job = self.client.batches.create(model=self.model_id, src=inlined,
                                                     config=t.CreateBatchJobConfig(display_name="biasaudit"))
                except Exception as exc:  # noqa: BLE001
                    self._count("batch_fallbacks")
                    self.batch_note = f"batch create failed: {type(exc).__name__}: {exc}"[:300]
                    return None
                self._count("batch_jobs")
                self._journal(job_key, job.name)
            start = self._clock()
            state = _enum_name(job.state)
            while state not in DONE_STATES:
                if self._clock() - start > self.spec.batch_stall_timeout_s:
                    try:
                        self.client.batches.cancel(name=job.name)
                    except Exception:  # noqa: BLE001 - cancelling is best effort
                        pass
                    self._count("batch_fallbacks")
                    self._journal(job_key, None)
                    self.batch_note = f"batch {job.name} stalled in {state} beyond {self.spec.batch_stall_timeout_s}s"
                    return None
                self._sleep(self.spec.batch_poll_s)
                try:
                    job = self.client.batches.get(name=job.name)
                    state = _enum_name(job.state)
                except Exception:  # noqa: BLE001 - a failed poll is retried at the next interval
                    continue
            self._journal(job_key, None)  # finished, failed or cancelled: never resumed again
            responses = getattr(getattr(job, "dest", None), "inlined_responses", None) or []
            if state not in ("JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED") or len(responses) != len(index):
                self._count("batch_fallbacks")
                self.batch_note = f"batch {job.name} ended {state} with {len(responses)}/{len(index)} answers"
                return None
            for i, item in zip(index, responses):
                if getattr(item, "error", None):
                    out[i] = failed(f"batch item error: {item.error}"[:300])
                else:
                    out[i] = self.read_response(item.response)
                    out[i].meta["via"] = "batch"
                    out[i].meta["batch_job"] = job.name
        for i, r in enumerate(out):
            if on_result is not None:
                on_result(i, r)
        return out  # type: ignore[return-value]

    def _journal(self, key: str, name: str | None) -> None:
        if self.batch_journal is None:
            return
        from biasaudit.io import atomic_write_json

        path = Path(self.batch_journal)
        jobs = json.loads(path.read_text()) if path.exists() else {}
        if name is None:
            jobs.pop(key, None)
        else:
            jobs[key] = name
        atomic_write_json(path, jobs)

    def _journalled_job(self, key: str):
        """The still-live batch job a killed earlier run submitted for exactly these requests, if any."""
        if self.batch_journal is None or not Path(self.batch_journal).exists():
            return None
        name = json.loads(Path(self.batch_journal).read_text()).get(key)
        if not name:
            return None
        try:
            job = self.client.batches.get(name=name)
        except Exception:  # noqa: BLE001 - gone or unreachable: submit a new one
            self._journal(key, None)
            return None
        if _enum_name(job.state) in ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"):
            self._journal(key, None)
            return None
        self._count("batch_resumed")
        return job

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        if self.spec.batch_mode and requests:
            done = self._batch(requests, on_result)
            if done is not None:
                return done
        return self._each(requests, self._one, on_result, self.spec.concurrency)
