"""The generator interface: a batch function over requests that never raises for one bad item.

A backend turns `GenRequest`s (prompt, seed, size) into `GenResult`s carrying an RGB image or a
status + reason. The stage (biasaudit.t2i.generate) owns files, the manifest and resumption, so the
same backends run unchanged under a distributed runner.
"""

from __future__ import annotations

from contextlib import contextmanager

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from biasaudit.params.base import redact

T = TypeVar("T")


@dataclass(frozen=True)
class GenRequest:
    image_id: str
    prompt_id: str
    prompt: str
    index: int
    seed: int
    width: int
    height: int


@dataclass
class GenResult:
    rgb: np.ndarray | None  # H×W×3 uint8, None unless status == "ok"
    status: str = "ok"  # ok | refused | failed
    reason: str = ""
    retries: int = 0
    seed_used: bool = True  # False where the backend cannot take a seed (recorded, not hidden)
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific provenance (JSON-able)

    def __post_init__(self) -> None:
        self.reason = redact(self.reason)  # an API error may quote the key it was sent

    @classmethod
    def failed(cls, reason: str, retries: int = 0, **extra: Any) -> "GenResult":
        return cls(None, "failed", reason, retries, extra=extra)

    @classmethod
    def refused(cls, reason: str, retries: int = 0, **extra: Any) -> "GenResult":
        return cls(None, "refused", reason, retries, extra=extra)


class Generator(ABC):
    """name (params key), backend, model_id, revision, stand_in; settings(); generate(requests)."""

    backend: str = ""
    stand_in: bool = False

    def __init__(self, name: str, model_id: str, revision: str):
        self.name, self.model_id, self.revision = name, model_id, revision

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """What determines the images besides prompt and seed (steps, guidance, size, dtype, ...)."""

    @abstractmethod
    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """One result per request, in order; an error of one item is that item's result."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release memory / connections."""


# --- retries with exponential backoff, shared by the API backends ---

class RetryableError(Exception):
    """A transient failure (429, 5xx, timeout): try again after `retry_after` seconds if given."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None,
                  jitter: Callable[[], float] = random.random) -> float:
    """Delay before retry number `attempt` (0-based): base·2^attempt with up to 25% jitter, capped;
    a server's Retry-After wins (also capped)."""
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, cap)
    return min(base * (2 ** attempt) * (1 + 0.25 * jitter()), cap)


def call_with_retries(fn: Callable[[], T], max_retries: int, base: float, cap: float,
                      sleep: Callable[[float], None] = time.sleep) -> tuple[T, int]:
    """Call `fn` until it does not raise RetryableError (at most max_retries retries).
    Returns (result, retries used); re-raises the last RetryableError when retries run out."""
    attempt = 0
    while True:
        try:
            return fn(), attempt
        except RetryableError as exc:
            if attempt >= max_retries:
                exc.retries = attempt  # type: ignore[attr-defined]
                raise
            sleep(backoff_delay(attempt, base, cap, exc.retry_after))
            attempt += 1


class Pacer:
    """Client-side pacing to at most `per_minute` calls (0 = unpaced)."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.interval = 60.0 / per_minute if per_minute > 0 else 0.0
        self.clock, self.sleep, self._next = clock, sleep, 0.0

    def wait(self) -> None:
        if not self.interval:
            return
        now = self.clock()
        if now < self._next:
            self.sleep(self._next - now)
            now = self._next
        self._next = now + self.interval


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes → H×W×3 uint8 (raises ValueError on anything unreadable)."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValueError(f"undecodable image bytes: {type(exc).__name__}: {exc}") from None


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@contextmanager
def genai_retries():
    """Around one google-genai call: 429/5xx API errors and transport errors (timeouts, resets) become
    RetryableError (honouring Retry-After); every other error passes through unchanged."""
    import httpx
    from google.genai import errors

    try:
        yield
    except errors.APIError as exc:
        code = exc.code or 0
        if code == 429 or code >= 500:
            headers = getattr(getattr(exc, "response", None), "headers", None) or {}
            raise RetryableError(f"HTTP {code} {exc.status or ''}".strip(),
                                 parse_retry_after(headers.get("retry-after"))) from None
        raise
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        raise RetryableError(f"{type(exc).__name__}: {exc}") from None
