"""Gemini backend through google-genai: temperature 0, answer constrained to the options.

Thinking. Thinking tokens count against `max_output_tokens`, so the output budget is always the
thinking budget *plus* the answer's tokens (`output_budget`). Models that cannot switch thinking off
(gemini-2.5-pro: budget 128..32768) keep it on with at least their minimum budget; -1 (dynamic)
reserves `DYNAMIC_THINKING_RESERVE`. An answer cut off by MAX_TOKENS, or empty, is *failed* (so the
cache never stores it) and is asked once more with `EMPTY_RETRY_FACTOR` × the budget.

Online mode sends one generateContent request per item (thread pool + the transport layer's token
bucket and retries, Retry-After honoured). Batch mode (`batch_mode: true`, half price): `submit`
puts every pending request of a stage run into as few inline batch jobs as the API allows
(`batch_max_requests` and `batch_max_bytes` per job), journals them (`batch_journal`, set by
CachedVLM beside its cache) so a killed run resumes the same jobs, polls all jobs concurrently
(one `batches.get` per job per round, every `batch_poll_s`) and cancels any still running after
`batch_stall_timeout_s`. Items a job did not answer (failed item, stalled or failed job) fall back
to online calls one by one. Images are downscaled to `image_max_side` (input tokens scale with size).
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasaudit.backends.transport import (
    GEMINI_BLOCKED,
    RetryableError,
    TokenBucket,
    api_failure_reason,
    enum_name,
    genai_errors,
    genai_http_options,
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

DONE_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
               "JOB_STATE_PARTIALLY_SUCCEEDED"}
DEAD_STATES = {"JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}

# Thinking budgets per model family (Gemini API docs, "Thinking"): (can switch off, minimum, maximum).
THINKING: dict[str, tuple[bool, int, int]] = {
    "gemini-2.5-pro": (False, 128, 32768),
    "gemini-2.5-flash-lite": (True, 512, 24576),
    "gemini-2.5-flash": (True, 1, 24576),
}
DYNAMIC_THINKING_RESERVE = 8192  # output tokens reserved for thinking when the budget is dynamic (-1)
# Gemini 3 and later think by level (thinkingLevel) and deprecate the sampling parameters (temperature, top_p,
# top_k: Gemini API changelog, 2026-07-21): output tokens reserved per level, and the families still sampled
LEVEL_RESERVE = {"MINIMAL": 512, "LOW": 2048, "MEDIUM": 8192, "HIGH": 16384}
SAMPLED_FAMILIES = ("gemini-1", "gemini-2")
EMPTY_RETRY_FACTOR = 4           # an empty / MAX_TOKENS answer is asked once more with 4× the budget


def thinking_family(model_id: str) -> tuple[bool, int, int] | None:
    name = model_id.split("/")[-1]
    for prefix in sorted(THINKING, key=len, reverse=True):
        if name.startswith(prefix):
            return THINKING[prefix]
    return None


def effective_thinking_budget(model_id: str, budget: int) -> int:
    """The budget actually sent: raised to the model's minimum where thinking cannot be switched off
    (0 there would be rejected), clipped to its maximum; -1 (dynamic) stays -1."""
    family = thinking_family(model_id)
    if family is None or budget == -1:
        return budget
    can_off, lo, hi = family
    if budget == 0 and can_off:
        return 0
    return min(max(budget, lo), hi)


def takes_temperature(model_id: str) -> bool:
    """Whether requests to `model_id` carry `temperature` (Gemini 1.x and 2.x; later models deprecate it)."""
    return model_id.split("/")[-1].startswith(SAMPLED_FAMILIES)


def output_budget(answer_tokens: int, thinking_budget: int) -> int:
    """max_output_tokens covering thinking plus the answer."""
    if thinking_budget == -1:
        return answer_tokens + DYNAMIC_THINKING_RESERVE
    return answer_tokens + max(0, thinking_budget)


@register("vlm", "gemini")
class GeminiVLM(VLMBackend):
    name = "gemini"
    needs = (("hosted",),)  # an API key, or the local server at base_url
    requires_any = ("api_key_env", "base_url")

    def __init__(self, spec: VLMSpec, sleep=time.sleep, clock=time.monotonic):
        super().__init__()
        from google import genai
        from google.genai import types

        self.spec, self.types = spec, types
        self.model_id = spec.model_id
        self.revision = spec.revision
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if not key and not spec.base_url:
            raise RuntimeError(f"environment variable {spec.api_key_env or '(api_key_env)'} is not set")
        self.client = genai.Client(api_key=key or "unused", http_options=genai_http_options(spec.base_url, spec.timeout_s))
        self.bucket = TokenBucket(spec.requests_per_minute, burst=spec.concurrency)
        self._sleep, self._clock = sleep, clock
        self.thinking_budget = effective_thinking_budget(spec.model_id, spec.thinking_budget)
        self.batch_journal: Path | None = None  # JSON {job key: batch job name}
        self._journal_lock = threading.Lock()
        self.batch_polls = 0
        self.online_only = False  # set once a stage run's batch jobs are done (CachedVLM.prefetch)

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        out = {"temperature": s.temperature if takes_temperature(self.model_id) else "model default",
               "max_tokens": s.max_tokens, "thinking_budget": self.thinking_budget,
               "output_budget": "answer + thinking", "constrain": s.constrain, "image_max_side": s.image_max_side,
               "image_format": s.image_format}
        if s.thinking_level:  # only when set, so the cache keys of budget-configured models stay as they were
            out |= {"thinking_level": s.thinking_level, "thinking_budget": None}
        return out

    # --- request building / response reading ------------------------------------------------------
    def _contents(self, req: VLMRequest) -> tuple[list[Any] | None, str]:
        parts: list[Any] = []
        for kind, value in req.parts():
            if kind == "text":
                parts.append(self.types.Part.from_text(text=value))
                continue
            data, mime, reason = encode_image(value, req.max_side(self.spec.image_max_side), self.spec.image_format)
            if data is None:
                return None, reason
            parts.append(self.types.Part.from_bytes(data=data, mime_type=mime))
        return [self.types.Content(role="user", parts=parts)], ""

    def answer_tokens(self, req: VLMRequest) -> int:
        return min(req.max_tokens, self.spec.max_tokens) if req.options else req.max_tokens

    def _config(self, req: VLMRequest, factor: int = 1) -> Any:
        t, s = self.types, self.spec
        budget = self.thinking_budget
        if factor > 1 and budget > 0:
            family = thinking_family(self.model_id)
            budget = min(budget * factor, family[2]) if family else budget * factor
        if s.thinking_level:
            kwargs: dict[str, Any] = {
                "max_output_tokens": (self.answer_tokens(req) + LEVEL_RESERVE[s.thinking_level]) * factor,
                "thinking_config": t.ThinkingConfig(thinking_level=s.thinking_level)}
        else:
            kwargs = {"max_output_tokens": output_budget(self.answer_tokens(req) * factor, budget),
                      "thinking_config": t.ThinkingConfig(thinking_budget=budget)}
        if takes_temperature(self.model_id):
            kwargs["temperature"] = s.temperature
        if s.constrain and req.options:
            kwargs["response_mime_type"] = "text/x.enum"
            kwargs["response_schema"] = {"type": "STRING", "enum": list(req.options)}
        return t.GenerateContentConfig(**kwargs)

    @staticmethod
    def read_response(resp: Any) -> VLMResponse:
        """A GenerateContentResponse → VLMResponse: refusals from block/finish reasons; an answer cut
        off by MAX_TOKENS or with no text is failed (never cached as ok)."""
        usage = getattr(resp, "usage_metadata", None)
        tin = getattr(usage, "prompt_token_count", None)
        tout = getattr(usage, "candidates_token_count", None)
        thoughts = getattr(usage, "thoughts_token_count", None)
        if thoughts:  # billed as output tokens
            tout = (tout or 0) + thoughts
        feedback = getattr(resp, "prompt_feedback", None)
        block = enum_name(getattr(feedback, "block_reason", None))
        if block and block != "BLOCKED_REASON_UNSPECIFIED":
            return VLMResponse("", REFUSED, f"prompt blocked: {block}", tin, tout)
        candidates = getattr(resp, "candidates", None) or []
        if not candidates:
            return VLMResponse("", FAILED, "malformed response: no candidates", tin, tout)
        cand = candidates[0]
        finish = enum_name(getattr(cand, "finish_reason", None))
        parts = getattr(getattr(cand, "content", None), "parts", None) or []
        text = "".join(p.text for p in parts if getattr(p, "text", None) and not getattr(p, "thought", False))
        meta = {"finish_reason": finish, "thoughts_tokens": thoughts}
        if finish in GEMINI_BLOCKED:
            return VLMResponse(text, REFUSED, f"finish reason {finish}", tin, tout, meta=meta)
        if finish == "MAX_TOKENS" or not text.strip():
            why = "cut off by max_output_tokens (finish_reason MAX_TOKENS)" if finish == "MAX_TOKENS" else "empty answer"
            return VLMResponse(text.strip(), FAILED, f"{why}; thinking used {thoughts or 0} tokens", tin, tout,
                               meta=meta | {"empty_answer": True})
        return VLMResponse(text.strip(), OK, "", tin, tout, meta=meta)

    # --- online -------------------------------------------------------------------------------------
    def _once(self, req: VLMRequest, contents: list[Any], factor: int = 1) -> VLMResponse:
        from google.genai import errors

        try:
            with genai_errors():
                resp = self.client.models.generate_content(model=self.model_id, contents=contents,
                                                           config=self._config(req, factor))
        except RetryableError:
            raise
        except errors.APIError as exc:
            return failed(api_failure_reason(exc))
        except Exception as exc:
            return failed(f"malformed response: {type(exc).__name__}: {str(exc)[:200]}")
        response = self.answered_by(self.read_response(resp), getattr(resp, "model_version", None))
        response.meta["answer_mode"] = self.answer_mode(req)
        return response

    def probe(self) -> str:
        from biasaudit.backends.transport import probe_gemini

        return probe_gemini(self.client, self.model_id, self.spec.base_url or "the Gemini API", sleep=self._sleep)

    def answer_mode(self, req: VLMRequest) -> str:
        """Which output mode the request asked for (recorded per row): an enum schema, or plain text."""
        return "response_schema (enum)" if self.spec.constrain and req.options else "plain"

    def _ask(self, req: VLMRequest, contents: list[Any], factor: int) -> VLMResponse:
        return retried(lambda: self._once(req, contents, factor), self.spec, self.bucket,
                       on_attempt=lambda a: (self._count("attempts"), a and self._count("retries")))

    def _one(self, req: VLMRequest) -> VLMResponse:
        contents, reason = self._contents(req)
        if contents is None:
            return failed(reason)
        response = self._ask(req, contents, 1)
        if response.meta.get("empty_answer"):  # thinking ate the budget: once more with a larger one
            self._count("empty_retries")
            again = self._ask(req, contents, EMPTY_RETRY_FACTOR)
            again.meta["budget_retry"] = True
            if again.meta.get("empty_answer"):
                again.reason = f"{again.reason} (also with {EMPTY_RETRY_FACTOR}× the output budget)"
            return again
        return response

    # --- batch --------------------------------------------------------------------------------------
    def _job_key(self, requests: list[VLMRequest]) -> str:
        from biasaudit.pipeline.provenance import stable_hash

        return stable_hash([self.model_id, self.decoding_params()] + [
            [list(r.images), list(r.image_labels), r.prompt, list(r.options), r.max_tokens] for r in requests],
            length=24)

    def chunks(self, sizes: list[int]) -> list[list[int]]:
        """Indices grouped into jobs of at most batch_max_requests items and batch_max_bytes of payload."""
        out: list[list[int]] = []
        current: list[int] = []
        used = 0
        for i, size in enumerate(sizes):
            if current and (len(current) >= self.spec.batch_max_requests or used + size > self.spec.batch_max_bytes):
                out.append(current)
                current, used = [], 0
            current.append(i)
            used += size
        if current:
            out.append(current)
        return out

    def _submit(self, key: str, inlined: list[Any]):
        job = self._journalled_job(key)
        if job is not None:
            return job
        job = self.client.batches.create(model=self.model_id, src=inlined,
                                         config=self.types.CreateBatchJobConfig(display_name=f"biasaudit-{key[:8]}"))
        self._count("batch_jobs")
        self._journal(key, job.name)
        return job

    def _poll_all(self, jobs: dict[str, Any]) -> dict[str, Any]:
        """Poll every job concurrently until each is done or the stall timeout passes (then cancel)."""
        start = self._clock()
        states = {k: enum_name(j.state) for k, j in jobs.items()}
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(jobs)))) as pool:
            while True:
                pending = [k for k, s in states.items() if s not in DONE_STATES]
                if not pending:
                    return jobs
                if self._clock() - start > self.spec.batch_stall_timeout_s:
                    self.batch_note = (f"batch {', '.join(jobs[k].name for k in pending)} stalled in "
                                       f"{', '.join(sorted({states[k] for k in pending}))} beyond "
                                       f"{self.spec.batch_stall_timeout_s}s; answered online")
                    for k in pending:
                        try:
                            self.client.batches.cancel(name=jobs[k].name)
                        except Exception:
                            pass
                        states[k] = "STALLED"
                        jobs[k] = None
                        self._count("batch_fallbacks")
                    return jobs
                self._sleep(self.spec.batch_poll_s)

                def get(k: str):
                    try:
                        return k, self.client.batches.get(name=jobs[k].name)
                    except Exception:
                        return k, None

                for k, job in pool.map(get, pending):
                    self.batch_polls += 1
                    if job is not None:
                        jobs[k], states[k] = job, enum_name(job.state)

    def batch(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse | None]:
        """Answer what the batch jobs answer; None where an item still needs an online call."""
        t = self.types
        out: list[VLMResponse | None] = [None] * len(requests)
        built: dict[int, Any] = {}
        sizes: dict[int, int] = {}
        for i, req in enumerate(requests):
            contents, reason = self._contents(req)
            if contents is None:
                out[i] = failed(reason)
                if on_result is not None:
                    on_result(i, out[i])
                continue
            built[i] = t.InlinedRequest(model=self.model_id, contents=contents, config=self._config(req))
            sizes[i] = sum(len(getattr(getattr(p, "inline_data", None), "data", b"") or b"") * 4 // 3 + 512
                           for c in contents for p in c.parts)
        index = list(built)
        groups = [[index[j] for j in chunk] for chunk in self.chunks([sizes[i] for i in index])]
        jobs: dict[str, Any] = {}
        members: dict[str, list[int]] = {}
        for group in groups:
            key = self._job_key([requests[i] for i in group])
            try:
                jobs[key] = self._submit(key, [built[i] for i in group])
                members[key] = group
            except Exception as exc:
                self._count("batch_fallbacks")
                self.batch_note = f"batch create failed: {type(exc).__name__}: {exc}"[:300]
        jobs = self._poll_all(jobs)
        for key, job in jobs.items():
            if job is None:
                self._journal(key, None)
                continue
            state = enum_name(job.state)
            self._journal(key, None)  # finished, failed or cancelled: never resumed again
            responses = list(getattr(getattr(job, "dest", None), "inlined_responses", None) or [])
            if state in DEAD_STATES or len(responses) != len(members[key]):
                self._count("batch_fallbacks")
                self.batch_note = f"batch {job.name} ended {state} with {len(responses)}/{len(members[key])} answers"
                continue
            for i, item in zip(members[key], responses):
                if getattr(item, "error", None) or getattr(item, "response", None) is None:
                    continue  # this item goes online
                response = self.answered_by(self.read_response(item.response),
                                            getattr(item.response, "model_version", None))
                if response.status == FAILED and not response.meta.get("model_mismatch"):
                    continue  # empty / cut-off / malformed: online, with the budget retry
                response.meta.update(via="batch", batch_job=job.name, answer_mode=self.answer_mode(requests[i]))
                out[i] = response
                if on_result is not None:
                    on_result(i, response)
        return out

    def _journal(self, key: str, name: str | None) -> None:
        if self.batch_journal is None:
            return
        from biasaudit.pipeline.io import atomic_write_json

        with self._journal_lock:
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
        except Exception:
            self._journal(key, None)
            return None
        if enum_name(job.state) in DEAD_STATES:
            self._journal(key, None)
            return None
        self._count("batch_resumed")
        return job

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        if not (self.spec.batch_mode and requests) or self.online_only:
            return self._each(requests, self._one, on_result, self.spec.concurrency)
        done = self.batch(requests, on_result)
        rest = [i for i, r in enumerate(done) if r is None]
        if rest:
            self._count("batch_item_fallbacks", len(rest))

            def report(j: int, response: VLMResponse) -> None:
                response.meta.setdefault("via", "online fallback")
                if on_result is not None:
                    on_result(rest[j], response)

            for i, response in zip(rest, self._each([requests[i] for i in rest], self._one, report,
                                                    self.spec.concurrency)):
                done[i] = response
        return done  # type: ignore[return-value]
