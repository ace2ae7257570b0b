"""The VLM backend interface shared by race classification (Method A) and the VLM audit (Method B).

A backend turns a list of `VLMRequest`s (images + prompt + optional allowed answers) into one
`VLMResponse` per request, in order. It never raises for one bad item: an unreadable image, an API
error after its retries or a refusal becomes a response with `status` and `reason`.

Shared helpers here: image encoding with downscaling (to cut API cost), the retrying call wrapper
over the transport layer (backends/transport.py), and an ordered thread-pool map.
"""

from __future__ import annotations

import io
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

from PIL import Image

from biasaudit.backends.transport import RetryableError, TokenBucket, call_with_retries
from biasaudit.params.base import redact
from biasaudit.pipeline.images import load_rgb

OK, REFUSED, FAILED = "ok", "refused", "failed"


@dataclass(frozen=True)
class VLMRequest:
    images: tuple[str, ...]  # file paths, sent in this order
    prompt: str
    options: tuple[str, ...] = ()  # allowed answers (constrained output / option probabilities)
    max_tokens: int = 32
    # a text label sent just before each image ("Image A:", "Image B:"), interleaved; () = none
    image_labels: tuple[str, ...] = ()
    # the REFLECT question ('2afc:income', 'mcq:salary', 'salary:salary'); models read the prompt, only
    # the SIMULATED planted VLM reads this
    task: str = ""
    # downscale each image so its longer side is at most this (0 = send as is); -1 = the backend spec's
    # image_max_side. REFLECT sets it so that every VLM sees each face at the same resolution.
    image_max_side: int = -1

    def max_side(self, spec_max_side: int) -> int:
        """The longest side this request's images are sent at (its own, else the spec's)."""
        return spec_max_side if self.image_max_side < 0 else self.image_max_side

    def parts(self) -> list[tuple[str, str]]:
        """The user turn in order, as ('text', s) / ('image', path): every image after its label
        (when labels are given), then the prompt. Every backend builds its request from this."""
        out: list[tuple[str, str]] = []
        for i, path in enumerate(self.images):
            if i < len(self.image_labels) and self.image_labels[i]:
                out.append(("text", self.image_labels[i]))
            out.append(("image", path))
        out.append(("text", self.prompt))
        return out


@dataclass
class VLMResponse:
    text: str
    status: str  # ok | refused | failed
    reason: str = ""
    tokens_in: int | None = None
    tokens_out: int | None = None
    option_probs: dict[str, float] | None = None
    from_cache: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. {"via": "batch"}; provenance only

    def __post_init__(self) -> None:
        self.reason = redact(self.reason)  # an API error may quote the key it was sent

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "status": self.status, "reason": self.reason, "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "option_probs": self.option_probs, "meta": self.meta}

    @classmethod
    def from_json(cls, data: dict[str, Any], from_cache: bool = False) -> "VLMResponse":
        return cls(text=data["text"], status=data["status"], reason=data.get("reason", ""),
                   tokens_in=data.get("tokens_in"), tokens_out=data.get("tokens_out"),
                   option_probs=data.get("option_probs"), from_cache=from_cache, meta=data.get("meta") or {})


OnResult = Callable[[int, VLMResponse], None]


def failed(reason: str) -> VLMResponse:
    return VLMResponse(text="", status=FAILED, reason=reason)


class VLMBackend(ABC):
    """One model behind one interface. Subclasses set `name`, `model_id`, `revision`, `stand_in`."""

    name: str = ""
    model_id: str = ""
    revision: str = ""
    stand_in: bool = False

    def __init__(self) -> None:
        self.stats: dict[str, int] = {"attempts": 0, "retries": 0, "batch_jobs": 0, "batch_fallbacks": 0}
        self._stats_lock = threading.Lock()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] = self.stats.get(key, 0) + n

    @abstractmethod
    def decoding_params(self) -> dict[str, Any]:
        """Everything besides the inputs that changes the answer (enters the cache key)."""

    @abstractmethod
    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        """One response per request, in order; never raises for one bad item. `on_result(i, response)`
        is called as each answer arrives (CachedVLM stores it at once, so a kill loses nothing done)."""

    def _each(self, requests: list[VLMRequest], one: Callable[[VLMRequest], VLMResponse],
              on_result: OnResult | None, concurrency: int = 1) -> list[VLMResponse]:
        """Answer requests one by one (on `concurrency` threads), reporting each as it finishes."""
        def run(item: tuple[int, VLMRequest]) -> VLMResponse:
            i, req = item
            try:
                response = one(req)
            except Exception as exc:
                response = failed(f"{type(exc).__name__}: {exc}"[:500])
            if on_result is not None:
                on_result(i, response)
            return response

        return ordered_map(run, list(enumerate(requests)), concurrency)

    def probe(self) -> str:
        """One cheap request before a stage's first batch: '' when the model is there, else why the stage
        cannot run (hosted backends ask their API; a local model was loaded already)."""
        return ""

    def answered_by(self, response: VLMResponse, reported: str | None) -> VLMResponse:
        """`response` with the model version the API reported (meta.model_version); failed, naming both
        names, when that is not the model asked (lifecycle.answered_as_asked): a re-routed answer is never
        cached or counted, and the stage stops on it (meta.model_mismatch). An answer naming no model is
        recorded as lifecycle.UNVERIFIED, or stops the stage likewise under execution.require_verified_model."""
        from biasaudit.lifecycle import mismatch, version_of

        if ("hosted",) not in getattr(self, "needs", ()):  # a local model: nothing names who answered
            return response
        response.meta["model_version"] = version_of(reported)  # UNVERIFIED when the API named no model
        why = mismatch(self.model_id, reported)
        if not why:
            return response
        return VLMResponse(response.text, FAILED, why, response.tokens_in, response.tokens_out,
                           meta=response.meta | {"model_mismatch": True})

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model_id": self.model_id, "revision": self.revision,
                "stand_in": self.stand_in, "decoding": self.decoding_params()}


# --- images -------------------------------------------------------------------------------------

def load_pil(path: str, max_side: int = 0) -> tuple[Image.Image | None, str]:
    """`path` as an sRGB PIL image, downscaled so its longer side is ≤ `max_side` (0 = keep), or
    (None, reason). The last 64 decoded images are kept, keyed by path, size and mtime (a changed file is
    read again): an audit asks many questions about the same few images (REFLECT: about 30 each), and
    decoding and LANCZOS resizing were a third of a local model's time. Each call gets its own copy."""
    try:
        st = os.stat(path)
    except OSError:
        return _decode_pil(str(path), max_side)
    img, reason = _cached_pil(str(path), st.st_mtime_ns, st.st_size, max_side)
    return (img.copy() if img is not None else None), reason


@lru_cache(maxsize=64)
def _cached_pil(path: str, mtime_ns: int, size: int, max_side: int) -> tuple[Image.Image | None, str]:
    return _decode_pil(path, max_side)


def _decode_pil(path: str, max_side: int) -> tuple[Image.Image | None, str]:
    loaded = load_rgb(path)
    if not loaded.ok:
        return None, f"image {path}: {loaded.reason}"
    img = Image.fromarray(loaded.rgb)
    if max_side and max(img.size) > max_side:
        img.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    return img, ""


def encode_image(path: str, max_side: int = 0, fmt: str = "JPEG", quality: int = 90) -> tuple[bytes | None, str, str]:
    """Load `path` as sRGB, downscale so the longer side is ≤ `max_side` (0 = keep), encode.

    Returns (bytes, mime type, reason); bytes is None with a reason when the image is unusable.
    """
    img, reason = load_pil(path, max_side)
    if img is None:
        return None, "", reason
    buf = io.BytesIO()
    if fmt.upper() == "PNG":
        img.save(buf, format="PNG")
        return buf.getvalue(), "image/png", ""
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), "image/jpeg", ""




# --- retries (the transport layer) ---------------------------------------------------------------

def retried(fn: Callable[[], VLMResponse], spec: Any, bucket: TokenBucket | None,
            on_attempt: Callable[[int], None] | None = None) -> VLMResponse:
    """Call `fn` (raising transport.RetryableError for transient failures) with the spec's retries,
    honouring Retry-After; after the last retry a failed response."""
    try:
        response, _ = call_with_retries(fn, spec.max_retries, spec.retry_backoff_s, 60.0, bucket=bucket,
                                        on_attempt=on_attempt)
        return response
    except RetryableError as exc:
        return failed(f"gave up after {spec.max_retries + 1} attempts: {exc.reason}")


T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Sequence[T], concurrency: int) -> list[R]:
    """`[fn(x) for x in items]` on a thread pool of `concurrency` workers, results in input order."""
    if concurrency <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(fn, items))
