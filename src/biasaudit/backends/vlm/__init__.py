"""VLM / classifier backends behind one interface (shared by Method A classification and Method B).

    backend = make_vlm_backend(cfg.classify.vlm)
    vlm = CachedVLM(backend, "data/cache/classify.sqlite", price)
    responses = vlm.generate([VLMRequest(images=(path,), prompt=text, options=labels)])
"""

from __future__ import annotations

from typing import Any

from biasaudit.backends.vlm.base import (FAILED, OK, REFUSED, TokenBucket, VLMBackend, VLMRequest, VLMResponse,
                                         encode_image)
from biasaudit.backends.vlm.cache import Accounting, CachedVLM, Price
from biasaudit.backends.vlm.parse import parse_choice, parse_usd

BACKENDS = ("gemini", "openai", "transformers", "clip", "file", "tiny", "simulated")


def make_vlm_backend(spec: Any) -> VLMBackend:
    """Build the backend a `VLMSpec` names (imports only what that backend needs)."""
    if spec.backend == "gemini":
        from biasaudit.backends.vlm.gemini import GeminiVLM
        return GeminiVLM(spec)
    if spec.backend == "openai":
        from biasaudit.backends.vlm.openai_chat import OpenAIChatVLM
        return OpenAIChatVLM(spec)
    if spec.backend == "transformers":
        from biasaudit.backends.vlm.transformers_local import TransformersVLM
        return TransformersVLM(spec)
    if spec.backend == "clip":
        from biasaudit.backends.vlm.clip_zeroshot import ClipZeroShot
        return ClipZeroShot(spec)
    if spec.backend == "file":
        from biasaudit.backends.vlm.file import FileLabels
        return FileLabels(spec)
    if spec.backend == "tiny":
        from biasaudit.backends.vlm.tiny import make_tiny
        return make_tiny(spec)
    if spec.backend == "simulated":
        from biasaudit.backends.vlm.simulated import SimulatedClassifier
        return SimulatedClassifier(spec)
    raise ValueError(f"vlm.backend: unknown backend '{spec.backend}'; available: {', '.join(BACKENDS)}")


__all__ = ["Accounting", "BACKENDS", "CachedVLM", "FAILED", "OK", "Price", "REFUSED", "TokenBucket", "VLMBackend",
           "VLMRequest", "VLMResponse", "encode_image", "make_vlm_backend", "parse_choice", "parse_usd"]
