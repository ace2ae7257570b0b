"""A persistent answer cache in front of any VLM backend, with per-run accounting.

Key = hash(sha256 of every image file, prompt, options, max_tokens, backend, model id, revision,
decoding params). Each answer is written to SQLite (io.Cache, WAL, synchronous=FULL) the moment it
arrives, so a SIGKILL loses at most the calls in flight and a re-run never asks again for an answer
it already has. Failed calls (API errors, unreadable images) are not cached: a re-run retries them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Any

from biasaudit.backends.vlm.base import FAILED, VLMBackend, VLMRequest, VLMResponse, failed
from biasaudit.io import Cache
from biasaudit.provenance import sha256_file, stable_hash


@dataclass(frozen=True)
class Price:
    """USD per million tokens; `batch_discount` multiplies both for batch-mode calls (Gemini: 0.5)."""
    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0
    batch_discount: float = 1.0


@dataclass
class Accounting:
    requests: int = 0      # requests asked of CachedVLM
    cache_hits: int = 0    # answered from the cache (no model call)
    calls: int = 0         # requests sent to the model (cache misses)
    failed: int = 0        # of those, failed after retries (not cached)
    tokens_in: int = 0
    tokens_out: int = 0
    batch_calls: int = 0   # answered through a batch job
    cost_usd: float = 0.0  # estimated from the price table; 0 when no price is known
    priced: bool = False   # whether a price was known for this model

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CachedVLM:
    """`CachedVLM(backend, cache_path).generate(requests)`: answers from the cache where present,
    the backend otherwise; `.accounting` counts calls, cache hits, tokens and estimated cost."""

    def __init__(self, backend: VLMBackend, cache_path: str | os.PathLike, price: Price | None = None):
        self.backend = backend
        self.cache = Cache(cache_path)
        if hasattr(backend, "batch_journal"):  # batch jobs of a killed run are picked up again
            from pathlib import Path

            backend.batch_journal = Path(cache_path).with_suffix(".batches.json")
        self.price = price
        self.accounting = Accounting(priced=price is not None)
        self._lock = threading.Lock()
        self._sha: dict[str, str] = {}

    def _image_sha(self, path: str) -> str:
        if path not in self._sha:
            self._sha[path] = sha256_file(path)
        return self._sha[path]

    def key(self, request: VLMRequest) -> str | None:
        """The cache key of a request, or None when an image cannot be read (never cached)."""
        try:
            shas = [self._image_sha(p) for p in request.images]
        except OSError:
            return None
        return stable_hash({"images": shas, "prompt": request.prompt, "options": list(request.options),
                            "max_tokens": request.max_tokens, "backend": self.backend.name,
                            "model_id": self.backend.model_id, "revision": self.backend.revision,
                            "decoding": self.backend.decoding_params()}, length=32)

    def _account(self, response: VLMResponse) -> None:
        with self._lock:
            acc = self.accounting
            acc.calls += 1
            if response.status == FAILED:
                acc.failed += 1
            acc.tokens_in += response.tokens_in or 0
            acc.tokens_out += response.tokens_out or 0
            batch = response.meta.get("via") == "batch"
            acc.batch_calls += int(batch)
            if self.price is not None:
                factor = self.price.batch_discount if batch else 1.0
                acc.cost_usd += factor * ((response.tokens_in or 0) * self.price.input_per_mtok
                                          + (response.tokens_out or 0) * self.price.output_per_mtok) / 1e6

    def generate(self, requests: list[VLMRequest]) -> list[VLMResponse]:
        out: list[VLMResponse | None] = [None] * len(requests)
        keys = [self.key(r) for r in requests]
        misses: list[int] = []
        for i, (req, key) in enumerate(zip(requests, keys)):
            self.accounting.requests += 1
            if key is None:
                out[i] = failed(f"cannot read image(s) {list(req.images)}")
                continue
            hit = self.cache.get(key)
            if hit is not None:
                self.accounting.cache_hits += 1
                out[i] = VLMResponse.from_json(hit, from_cache=True)
            else:
                misses.append(i)
        if misses:
            def store(j: int, response: VLMResponse) -> None:
                i = misses[j]
                if response.status != FAILED:
                    self.cache.set(keys[i], response.to_json())  # durable before we go on
                self._account(response)
                out[i] = response

            responses = self.backend.generate([requests[i] for i in misses], on_result=store)
            for j, response in enumerate(responses):
                if out[misses[j]] is None:  # backend did not report through the callback
                    store(j, response)
        return [r if r is not None else failed("no response") for r in out]
