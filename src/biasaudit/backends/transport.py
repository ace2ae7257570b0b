"""One transport layer for every hosted client (Gemini, Imagen, OpenAI chat, images, edits).

- `RetryableError`: a transient failure (HTTP 408/409/429/5xx, timeout, connection reset, malformed body).
- `parse_retry_after`: a Retry-After value in seconds *or* as an HTTP-date (RFC 9110 §10.2.3);
  `retry_after_from_headers` also reads OpenAI's `retry-after-ms`.
- `TokenBucket`: the one client-side rate limiter (thread-safe; `per_minute <= 0` = none).
- `call_with_retries`: exponential backoff with jitter, the server's Retry-After winning (capped).
- `openai_errors()` / `genai_errors()`: context managers mapping each SDK's exceptions onto
  RetryableError; everything else passes through unchanged for the client to classify
  (refusal vs failure). `unsupported_parameter(exc)` names the parameter a 400 rejects.
- `openai_client()` / `genai_http_options()`: SDK clients with the SDKs' own retries off (ours count
  them) and one timeout, which is a *total* deadline per request (`http_client`): httpx's own timeouts
  bound each read, so a server trickling one byte a second would otherwise never time out.
"""

from __future__ import annotations

import email.utils
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class RetryableError(Exception):
    """A transient failure: try again after `retry_after` seconds when the server said so."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after
        self.retries = 0


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: delta-seconds ('7', '1.5') or an HTTP-date
    ('Wed, 21 Oct 2015 07:28:00 GMT'); None when absent or unreadable; never negative."""
    if value is None:
        return None
    value = str(value).strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    now = now or datetime.now(timezone.utc)
    return max(0.0, (when - now).total_seconds())


def retry_after_from_headers(headers: Any, now: datetime | None = None) -> float | None:
    """`retry-after-ms` (OpenAI) or `retry-after` from a headers mapping (any case)."""
    if not headers:
        return None
    lower = {str(k).lower(): v for k, v in dict(headers).items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(lower.get("retry-after"), now)


class TokenBucket:
    """At most `per_minute` acquisitions per minute on average, bursts up to `burst` (thread-safe).
    `per_minute <= 0` disables the limit."""

    def __init__(self, per_minute: float, burst: int = 1, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rate = per_minute / 60.0
        self.capacity = float(max(1, burst))
        self.tokens = self.capacity
        self.clock, self.sleep = clock, sleep
        self.last = clock()
        self._lock = threading.Lock()

    def acquire(self) -> float:
        """Take one token, sleeping as needed; return the seconds waited."""
        if self.rate <= 0:
            return 0.0
        waited = 0.0
        while True:
            with self._lock:
                now = self.clock()
                self.tokens = min(self.capacity, self.tokens + (now - self.last) * self.rate)
                self.last = now
                if self.tokens >= 1.0:
                    self.tokens -= 1.0
                    return waited
                wait = (1.0 - self.tokens) / self.rate
            self.sleep(wait)
            waited += wait


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None,
                  jitter: Callable[[], float] = random.random) -> float:
    """Delay before retry number `attempt` (0-based): base·2^attempt with up to 25% jitter, capped;
    a server's Retry-After wins (also capped)."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, cap)
    return min(base * (2 ** attempt) * (1 + 0.25 * jitter()), cap)


def call_with_retries(fn: Callable[[], T], max_retries: int, base: float, cap: float = 60.0,
                      sleep: Callable[[float], None] = time.sleep, bucket: TokenBucket | None = None,
                      on_attempt: Callable[[int], None] | None = None,
                      jitter: Callable[[], float] = random.random) -> tuple[T, int]:
    """Call `fn` until it does not raise RetryableError (at most `max_retries` retries), taking a
    bucket token before every attempt. Returns (result, retries used); re-raises the last
    RetryableError (with `.retries`) when retries run out."""
    attempt = 0
    while True:
        if bucket is not None:
            bucket.acquire()
        if on_attempt is not None:
            on_attempt(attempt)
        try:
            return fn(), attempt
        except RetryableError as exc:
            exc.retries = attempt
            if attempt >= max_retries:
                raise
            sleep(backoff_delay(attempt, base, cap, exc.retry_after, jitter))
            attempt += 1


# --- error mapping ------------------------------------------------------------------------------

@contextmanager
def openai_errors() -> Iterator[None]:
    """Around one openai SDK call: retryable statuses, timeouts, connection errors and undecodable
    bodies become RetryableError (with the server's Retry-After); other errors pass through."""
    import openai

    try:
        yield
    except openai.APIStatusError as exc:
        if exc.status_code in RETRYABLE_STATUS:
            raise RetryableError(f"HTTP {exc.status_code}",
                                 retry_after_from_headers(getattr(exc.response, "headers", None))) from None
        raise
    except (openai.APITimeoutError, openai.APIConnectionError) as exc:
        raise RetryableError(f"{type(exc).__name__}: {exc}"[:300]) from None
    except (openai.APIResponseValidationError, json.JSONDecodeError) as exc:
        raise RetryableError(f"malformed response: {type(exc).__name__}: {exc}"[:300]) from None


@contextmanager
def genai_errors() -> Iterator[None]:
    """Around one google-genai call: the same mapping (the SDK's APIError carries `.code` and the
    httpx response; Retry-After is honoured like everywhere else)."""
    import httpx
    from google.genai import errors

    try:
        yield
    except errors.APIError as exc:
        code = int(getattr(exc, "code", 0) or 0)
        if code in RETRYABLE_STATUS or code >= 500:
            headers = getattr(getattr(exc, "response", None), "headers", None)
            raise RetryableError(f"HTTP {code} {getattr(exc, 'status', '') or ''}".strip(),
                                 retry_after_from_headers(headers)) from None
        raise
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        raise RetryableError(f"{type(exc).__name__}: {exc}"[:300]) from None
    except json.JSONDecodeError as exc:
        raise RetryableError(f"malformed response: {exc}"[:300]) from None


_PARAM_IN_MESSAGE = re.compile(r"(?:unsupported|unrecognized|unknown|not supported)[^'\"`]*['\"`]([A-Za-z_][\w.]*)['\"`]",
                               re.IGNORECASE)
_PARAM_FIRST = re.compile(r"['\"`]([A-Za-z_][\w.]*)['\"`][^.]*(?:is not supported|not supported|unsupported)",
                          re.IGNORECASE)


# the finish and block reasons google-genai reports for an answer withheld by the content policy (text or image)
GEMINI_BLOCKED = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "IMAGE_SAFETY",
                            "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION"})


def enum_name(value: Any) -> str:
    """A google-genai enum (or its string) as its bare name: FinishReason.SAFETY → 'SAFETY'; None → ''."""
    return "" if value is None else str(getattr(value, "name", value)).split(".")[-1]


def error_body(exc: Any) -> dict:
    """The `error` object of an API error body (OpenAI `{"error": {...}}`, Google alike), or {}."""
    body = getattr(exc, "body", None)
    if body is None:
        body = getattr(exc, "details", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        return inner if isinstance(inner, dict) else {}
    return {}


def unsupported_parameter(exc: Any) -> str | None:
    """The request parameter a 400 rejects (`param`, `unsupported_parameter`/`unsupported_value` codes,
    or the parameter quoted in the message), else None."""
    if int(getattr(exc, "status_code", getattr(exc, "code", 0)) or 0) != 400:
        return None
    err = error_body(exc)
    if err.get("param"):
        return str(err["param"])
    message = str(err.get("message") or getattr(exc, "message", "") or exc)
    for pattern in (_PARAM_IN_MESSAGE, _PARAM_FIRST):
        m = pattern.search(message)
        if m:
            return m.group(1)
    return None


def api_failure_reason(exc: Any) -> str:
    """One readable failure reason for a non-retryable API error; a rejected parameter is named first."""
    code = getattr(exc, "status_code", None) or getattr(exc, "code", None) or "?"
    err = error_body(exc)
    message = str(err.get("message") or getattr(exc, "message", "") or exc)[:240]
    param = unsupported_parameter(exc)
    if param:
        return f"unsupported parameter '{param}' for this model (HTTP {code}): {message}"
    return f"HTTP {code}: {message}"


# Words of a content-policy refusal, matched as whole words: a letter or digit on either side breaks the
# match ("constraint", "brain", "training" hold "rai"; "unblocked" holds "blocked"), an underscore does
# not (codes: OpenAI's content_policy_violation / moderation_blocked, Gemini's IMAGE_SAFETY /
# PROHIBITED_CONTENT). Google's Responsible-AI field names are listed as they are spelt
# (raiFilteredReason, rai_media_filtered_reasons, ...): camelCase has no separator after "rai".
_POLICY_REFUSAL = re.compile(
    r"(?<![a-z0-9])(?:safety|polic(?:y|ies)|blocked|responsible\s+ai|rai|sensitive|prohibited|moderation)(?![a-z0-9])"
    r"|rai_?(?:media_?)?filtered_?reasons?",
    re.IGNORECASE)


def is_policy_refusal(text: str | None) -> bool:
    """Whether an API error's text says a content policy refused the request (safety / policy / blocked /
    Responsible AI / RAI / sensitive / prohibited / moderation, each a whole word, or a Google RAI field)."""
    return bool(text) and _POLICY_REFUSAL.search(str(text)) is not None


# --- probes: one cheap request before a stage's first batch ----------------------------------------

def _probe_failure(model_id: str, where: str, code: int, message: str) -> str:
    from biasaudit.params.base import redact

    message = redact(" ".join(str(message).split())[:200])  # a server may quote the key it was sent
    if code == 404:
        return f"model {model_id} is not served at {where} (HTTP 404: {message})"
    if code in (401, 403):
        return f"not authorised for model {model_id} at {where} (HTTP {code}: {message}); check the key"
    return f"model {model_id} at {where} answered the probe with HTTP {code}: {message}"


def probe_gemini(client: Any, model_id: str, where: str, retries: int = 2,
                 sleep: Callable[[float], None] | None = None) -> str:
    """`models.get` (GET …/models/{model}): '' when the model is served, else one line naming it. Transient
    errors are retried; one that persists stops the stage too (nothing would get through). A model the
    lifecycle file gives as retired stops first, without a request (lifecycle.stop_reason)."""
    from google.genai import errors

    from biasaudit.lifecycle import stop_reason

    if retired := stop_reason(model_id):  # retired by its provider, or its shutdown date has passed: no request
        return retired

    def get():
        with genai_errors():
            return client.models.get(model=model_id)

    try:
        call_with_retries(get, retries, 1.0, 10.0, sleep=sleep or time.sleep)
    except RetryableError as exc:
        return f"model {model_id} at {where} did not answer the probe: {exc.reason} after {retries + 1} attempts"
    except errors.APIError as exc:
        return _probe_failure(model_id, where, int(getattr(exc, "code", 0) or 0), getattr(exc, "message", "") or exc)
    return ""


def probe_openai(client: Any, model_id: str, where: str, retries: int = 2,
                 sleep: Callable[[float], None] | None = None) -> str:
    """GET /models/{model}; where a server does not implement it (vLLM lists, never retrieves), its
    /models list; where neither exists, a one-token chat request (404: not served; 400: served, the
    request's shape aside: `shape_only`; a 400 about the model, or naming no parameter, stops). '' when the
    model is served, else one line naming it. A model the lifecycle file gives as retired (its shutdown date
    passed) stops first, without a request (lifecycle.stop_reason)."""
    import openai

    from biasaudit.lifecycle import stop_reason

    if retired := stop_reason(model_id):  # retired by its provider, or its shutdown date has passed: no request
        return retired
    sleep = sleep or time.sleep

    def attempt(fn):
        try:
            with openai_errors():
                return fn(), None
        except openai.APIStatusError as exc:
            return None, exc

    def ask(fn):
        return call_with_retries(lambda: attempt(fn), retries, 1.0, 10.0, sleep=sleep)[0]

    try:
        _, err = ask(lambda: client.models.retrieve(model_id))
        if err is None:
            return ""
        if err.status_code != 404:
            return _probe_failure(model_id, where, err.status_code, error_body(err).get("message") or err)
        listed, list_err = ask(lambda: [m.id for m in client.models.list()])
        if list_err is None:
            if model_id in listed:
                return ""
            shown = ", ".join(sorted(listed)[:8]) or "nothing"
            said = " ".join(str(error_body(err).get("message") or err).split())[:160]
            return f"model {model_id} is not served at {where} (HTTP 404: {said}; it serves: {shown})"
        _, chat_err = ask(lambda: client.chat.completions.create(
            model=model_id, messages=[{"role": "user", "content": "Reply with OK."}], max_tokens=1))
    except RetryableError as exc:
        return f"model {model_id} at {where} did not answer the probe: {exc.reason} after {retries + 1} attempts"
    if chat_err is None or shape_only(chat_err):
        return ""
    return _probe_failure(model_id, where, chat_err.status_code, error_body(chat_err).get("message") or chat_err)


def shape_only(exc: Any) -> bool:
    """Whether an error to the probe's one-token chat request still shows the model is served: a 400 that names
    a rejected parameter of the request (`max_tokens` to a reasoning model, as OpenAI's own body says), and
    whose parameter is not `model`. Any other answer — a 400 about the model ("Model not exist."), a 400
    naming nothing, any other 4xx but 429 (retried before this) — does not: the probe stops, naming it."""
    if getattr(exc, "status_code", None) != 400:
        return False
    param = unsupported_parameter(exc)
    if not param or param.lower() == "model":
        return False
    err = error_body(exc)
    said = f"{err.get('code') or ''} {err.get('message') or getattr(exc, 'message', '') or ''}"
    return not re.search(r"model_not_found|model\s+(?:not|does not|doesn't)\s+exist|no such model|unknown model",
                         said, re.IGNORECASE)


# --- a total deadline per request --------------------------------------------------------------

_DEADLINE = threading.local()  # the end (time.monotonic) of the request this thread is sending, or None


def _time_left(timeout: float | None, error: type[Exception]) -> float | None:
    """The socket timeout of one network operation: its own, never past the request's deadline."""
    end = getattr(_DEADLINE, "at", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error(f"no complete response within the total deadline of {_DEADLINE.total:g} s (timeout_s)")
    return left if timeout is None else min(timeout, left)


def deadline_transport(timeout_s: float, flavour: str = "httpx"):
    """An httpx transport whose every request — connect, send, headers and body — ends within `timeout_s`
    seconds in all: each socket operation is given the time left (httpcore's network backend, wrapped).
    `flavour` "httpx2": the same for httpx2/httpcore2, the drop-in fork the openai SDK is built on."""
    import importlib

    httpx = importlib.import_module(flavour)
    httpcore = importlib.import_module({"httpx": "httpcore", "httpx2": "httpcore2"}[flavour])

    class Stream(httpcore.NetworkStream):
        def __init__(self, inner: Any):
            self.inner = inner

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.inner.read(max_bytes, _time_left(timeout, httpcore.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.inner.write(buffer, _time_left(timeout, httpcore.WriteTimeout))

        def close(self) -> None:
            self.inner.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None):
            return Stream(self.inner.start_tls(ssl_context, server_hostname, _time_left(timeout, httpcore.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self.inner.get_extra_info(info)

    class Backend(httpcore.NetworkBackend):
        def __init__(self, inner: Any):
            self.inner = inner

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None):
            return Stream(self.inner.connect_tcp(host, port, _time_left(timeout, httpcore.ConnectTimeout),
                                                 local_address, socket_options))

        def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Any = None):
            return Stream(self.inner.connect_unix_socket(path, _time_left(timeout, httpcore.ConnectTimeout),
                                                         socket_options))

        def sleep(self, seconds: float) -> None:
            self.inner.sleep(seconds)

    class Body(httpx.SyncByteStream):
        """The response body, read under its request's deadline (the SDKs read it after handle_request)."""

        def __init__(self, inner: Any, end: float):
            self.inner, self.end = inner, end

        def __iter__(self):
            for chunk in _under(self.end, timeout_s, lambda: iter(self.inner)):
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class Transport(httpx.HTTPTransport):
        def __init__(self) -> None:
            super().__init__()
            # httpx builds its httpcore pool without a network backend argument: wrap the pool's own
            self._pool._network_backend = Backend(self._pool._network_backend)

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            end = time.monotonic() + timeout_s
            response = _under(end, timeout_s, lambda: super(Transport, self).handle_request(request))
            response.stream = Body(response.stream, end)
            return response

    return Transport()


def _under(end: float, total: float, fn: Callable[[], Any]) -> Any:
    """`fn()` (or every step of the iterator it returns) with this thread's request deadline at `end`."""
    before = getattr(_DEADLINE, "at", None), getattr(_DEADLINE, "total", None)
    _DEADLINE.at, _DEADLINE.total = end, total
    try:
        out = fn()
        if not hasattr(out, "__next__"):
            return out
    finally:
        _DEADLINE.at, _DEADLINE.total = before

    def steps():
        while True:
            _DEADLINE.at, _DEADLINE.total = end, total
            try:
                chunk = next(out)
            except StopIteration:
                return
            finally:
                _DEADLINE.at, _DEADLINE.total = before
            yield chunk

    return steps()


def http_client(timeout_s: float):
    """An httpx.Client whose requests end within `timeout_s` seconds in all (deadline_transport)."""
    import httpx

    return httpx.Client(transport=deadline_transport(timeout_s), timeout=timeout_s, follow_redirects=True)


# --- clients ----------------------------------------------------------------------------------

def openai_client(api_key: str, base_url: str | None, timeout_s: float):
    """An openai.OpenAI client with the SDK's retries off (ours count them) and a total deadline per request."""
    import openai

    return openai.OpenAI(api_key=api_key or "unused", base_url=base_url or None, timeout=timeout_s, max_retries=0,
                         http_client=openai.DefaultHttpxClient(transport=deadline_transport(timeout_s, "httpx2"),
                                                               timeout=timeout_s))


GEMINI_API_VERSION = "v1beta"  # the version the Gemini API documents generateContent, batches and models.get on


def genai_http_options(base_url: str | None, timeout_s: float, api_version: str | None = GEMINI_API_VERSION):
    """google-genai HttpOptions: our timeout (ms) as a total deadline per request, the SDK's own retries off.
    The Gemini API's documented `v1beta` (google-genai 3.x defaults to `v1`, which lacks image output, thinking
    levels and batch mode); Vertex AI clients pass None (the SDK's own Vertex version)."""
    from google.genai import types

    return types.HttpOptions(base_url=base_url or None, timeout=int(timeout_s * 1000), api_version=api_version,
                             retry_options=types.HttpRetryOptions(attempts=1), httpx_client=http_client(timeout_s))


__all__ = ["GEMINI_BLOCKED", "RETRYABLE_STATUS", "RetryableError", "TokenBucket", "api_failure_reason", "backoff_delay",
           "call_with_retries", "deadline_transport", "enum_name", "error_body", "genai_errors", "genai_http_options", "http_client",
           "is_policy_refusal", "openai_client", "openai_errors", "parse_retry_after", "probe_gemini", "probe_openai", "retry_after_from_headers", "unsupported_parameter"]
