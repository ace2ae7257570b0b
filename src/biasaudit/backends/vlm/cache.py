"""A persistent answer cache in front of any VLM backend, with per-run accounting.

Key = hash(sha256 of every image file, prompt, options, max_tokens, backend, model id, revision,
decoding params). Each answer is written to SQLite (io.Cache, WAL, synchronous=FULL) the moment it
arrives, so a SIGKILL loses at most the calls in flight and a re-run never asks again for an answer
it already has. Failed calls (API errors, unreadable images, empty or cut-off answers) are not
cached: a re-run retries them. In batch mode `prefetch` sends all of a stage run's misses at once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Any

from biasaudit.backends.vlm.base import FAILED, OK, VLMBackend, VLMRequest, VLMResponse, failed
from biasaudit.pipeline.io import Cache
from biasaudit.pipeline.provenance import sha256_file, stable_hash


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
        self._prefetched: set[str] = set()  # keys answered by prefetch, not yet handed out
        self.stop: VLMResponse | None = None  # a re-routed answer: every later miss fails with it (the stage stops)

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
        key = {"images": shas, "prompt": request.prompt, "options": list(request.options),
               "max_tokens": request.max_tokens, "backend": self.backend.name,
               "model_id": self.backend.model_id, "revision": self.backend.revision,
               "decoding": self.backend.decoding_params()}
        if request.image_labels:  # only when present, so keys of unlabelled requests stay as they were
            key["image_labels"] = list(request.image_labels)
        if request.image_max_side >= 0:  # likewise: only when the request sets its own image size
            key["image_max_side"] = request.image_max_side
        if getattr(self.backend, "answers_by_identity", False):  # the planted VLM: who the image shows, not its bytes
            key |= {"paths": [str(p) for p in request.images], "task": request.task}
        return stable_hash(key, length=32)

    def _hit(self, key: str) -> VLMResponse | None:
        """A cached answer; an 'ok' with empty text (written before empty answers counted as failed)
        is not an answer and is asked again."""
        hit = self.cache.get(key)
        if hit is None:
            return None
        response = VLMResponse.from_json(hit, from_cache=True)
        if response.status == OK and not response.text.strip() and not response.option_probs:
            return None
        if self.backend.answered_by(response, response.meta.get("model_version")).status == FAILED:
            return None  # stored by a version that did not check who answered: asked again, and checked
        return response

    def prefetch(self, requests: list[VLMRequest]) -> int:
        """Batch mode: answer every cache miss among `requests` through the backend's batch jobs
        (as few as the API allows, for the whole stage run) and store each answer; the stage's
        per-batch calls then hit the cache, and only what the jobs left unanswered goes online.
        Returns the number of answers stored; a no-op for backends without batch mode."""
        batch = getattr(self.backend, "batch", None)
        if batch is None or not getattr(getattr(self.backend, "spec", None), "batch_mode", False):
            return 0
        seen: set[str] = set()
        misses: list[tuple[str, VLMRequest]] = []
        for req in requests:
            key = self.key(req)
            if key is None or key in seen or self._hit(key) is not None:
                continue
            seen.add(key)
            misses.append((key, req))
        stored = 0

        def store(j: int, response: VLMResponse) -> None:
            nonlocal stored
            if response.meta.get("model_mismatch") and not self.stop:
                self.stop = response  # the batch job was answered by another model: no online call follows
            if response.status != FAILED:
                self._stamp(response)
                self.cache.set(misses[j][0], response.to_json())
                self._account(response)
                self._prefetched.add(misses[j][0])
                stored += 1

        if misses:
            batch([r for _, r in misses], on_result=store)
        self.backend.online_only = True  # what the jobs left unanswered is asked online, item by item
        return stored

    def _stamp(self, response: VLMResponse) -> None:
        """Record when the answer came (meta answered_at, kept in the cache with it): the audit's data-collection
        window is read from these (report.audit_card)."""
        from biasaudit.pipeline.provenance import answer_time

        response.meta.setdefault("answered_at", answer_time(bool(getattr(self.backend, "stand_in", False))))

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
            hit = self._hit(key)
            if hit is not None and key in self._prefetched:  # answered by this run's batch jobs
                self._prefetched.discard(key)
                hit.from_cache = False
                out[i] = hit
            elif hit is not None:
                self.accounting.cache_hits += 1
                out[i] = hit
            else:
                misses.append(i)
        if misses and self.stop is not None:
            for i in misses:
                out[i] = VLMResponse("", FAILED, self.stop.reason, meta=dict(self.stop.meta))
            misses = []
        if misses:
            def store(j: int, response: VLMResponse) -> None:
                i = misses[j]
                if response.status != FAILED:
                    self._stamp(response)
                    self.cache.set(keys[i], response.to_json())  # durable before we go on
                self._account(response)
                out[i] = response

            responses = self.backend.generate([requests[i] for i in misses], on_result=store)
            for j, response in enumerate(responses):
                if out[misses[j]] is None:  # backend did not report through the callback
                    store(j, response)
        return [r if r is not None else failed("no response") for r in out]
