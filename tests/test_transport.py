"""The one transport layer: Retry-After (seconds, HTTP-date, -ms), backoff, retries, the token
bucket, error mapping of both SDKs, and unsupported-parameter reasons."""

from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import httpx
import pytest

from biasaudit.backends.transport import (
    RetryableError,
    TokenBucket,
    api_failure_reason,
    backoff_delay,
    call_with_retries,
    genai_errors,
    openai_errors,
    parse_retry_after,
    retry_after_from_headers,
    unsupported_parameter,
)

NOW = datetime(2026, 1, 11, 12, 0, 0, tzinfo=timezone.utc)


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("7") == 7.0 and parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    # RFC 9110 IMF-fixdate, 90 s after "now"
    assert parse_retry_after(format_datetime(NOW + timedelta(seconds=90), usegmt=True), now=NOW) == 90.0
    assert parse_retry_after("Sun, 11 Jan 2026 11:00:00 GMT", now=NOW) == 0.0  # in the past: at once
    assert parse_retry_after("soon") is None and parse_retry_after("") is None and parse_retry_after(None) is None
    assert retry_after_from_headers({"Retry-After-Ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_from_headers({"Retry-After": "Sun, 11 Jan 2026 12:00:30 GMT"}, now=NOW) == 30.0
    assert retry_after_from_headers(None) is None


def test_backoff_and_retries():
    assert backoff_delay(0, 2.0, 60.0, jitter=lambda: 0.0) == 2.0
    assert backoff_delay(3, 2.0, 60.0, jitter=lambda: 0.0) == 16.0
    assert backoff_delay(3, 2.0, 60.0, jitter=lambda: 1.0) == 20.0  # +25% jitter
    assert backoff_delay(10, 2.0, 60.0, jitter=lambda: 0.0) == 60.0  # capped
    assert backoff_delay(0, 2.0, 60.0, retry_after=7.0) == 7.0  # the server's Retry-After wins
    assert backoff_delay(0, 2.0, 60.0, retry_after=700.0) == 60.0  # ... capped too
    sleeps, calls = [], iter([RetryableError("429"), RetryableError("503", retry_after=1.5), "done"])

    def fn():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert call_with_retries(fn, 5, 0.5, 10.0, sleep=sleeps.append) == ("done", 2)
    assert sleeps[1] == 1.5 and 0.5 <= sleeps[0] <= 0.625
    with pytest.raises(RetryableError) as info:
        call_with_retries(lambda: (_ for _ in ()).throw(RetryableError("500")), 2, 0, 0, sleep=lambda s: None)
    assert info.value.retries == 2


def test_token_bucket_spaces_calls_and_every_attempt_takes_a_token():
    now, slept = [0.0], []
    bucket = TokenBucket(120, burst=1, clock=lambda: now[0],
                         sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    for _ in range(3):
        bucket.acquire()
    assert slept == [0.5, 0.5]
    attempts = iter([RetryableError("429"), "ok"])

    def fn():
        v = next(attempts)
        if isinstance(v, Exception):
            raise v
        return v

    slept.clear()
    call_with_retries(fn, 3, 0.0, 1.0, sleep=lambda s: None, bucket=bucket)
    assert slept == [0.5, 0.5]  # the retry waited for its own token as well
    assert TokenBucket(0).acquire() == 0.0


def _openai_error(status, body, headers=None):
    import openai

    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(status, json=body, headers=headers or {}, request=request)
    cls = {400: openai.BadRequestError, 429: openai.RateLimitError, 500: openai.InternalServerError}[status]
    return cls(body["error"]["message"], response=response, body=body["error"])


def test_openai_error_mapping_and_unsupported_parameter():
    with pytest.raises(RetryableError) as info:
        with openai_errors():
            raise _openai_error(429, {"error": {"message": "slow down"}}, {"retry-after": "3"})
    assert info.value.retry_after == 3.0
    with pytest.raises(RetryableError):
        with openai_errors():
            raise _openai_error(500, {"error": {"message": "boom"}})
    # the wire text OpenAI returns for max_tokens on a reasoning model
    bad = _openai_error(400, {"error": {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                   "'max_completion_tokens' instead.", "type": "invalid_request_error", "param": "max_tokens",
        "code": "unsupported_parameter"}})
    with pytest.raises(type(bad)):
        with openai_errors():
            raise bad
    assert unsupported_parameter(bad) == "max_tokens"
    assert api_failure_reason(bad).startswith("unsupported parameter 'max_tokens'")
    no_param = _openai_error(400, {"error": {
        "message": "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) "
                   "value is supported.", "type": "invalid_request_error", "param": None, "code": "unsupported_value"}})
    assert unsupported_parameter(no_param) == "temperature"
    plain = _openai_error(400, {"error": {"message": "Invalid image.", "param": None, "code": None}})
    assert unsupported_parameter(plain) is None and api_failure_reason(plain).startswith("HTTP 400")


def test_genai_error_mapping_honours_retry_after():
    from google.genai import errors

    response = httpx.Response(429, json={"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}},
                              headers={"Retry-After": "4"})
    with pytest.raises(RetryableError) as info:
        with genai_errors():
            raise errors.ClientError(429, {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}},
                                     response)
    assert info.value.retry_after == 4.0
    with pytest.raises(RetryableError):
        with genai_errors():
            raise httpx.ReadTimeout("slow")
    with pytest.raises(errors.ClientError):
        with genai_errors():
            raise errors.ClientError(400, {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}, None)
