"""VLM / classifier backends behind one interface (shared by Method A classification and Method B).

    backend = make_vlm_backend(cfg.classify.vlm)
    vlm = CachedVLM(backend, cfg.classify.cache_path, price)
    vlm.prefetch(all_pending_requests)   # batch mode: one set of batch jobs for the whole stage run
    responses = vlm.generate([VLMRequest(images=(path,), prompt=text, options=labels)])
"""

from __future__ import annotations

from typing import Any

from biasaudit import registry
from biasaudit.backends.transport import TokenBucket
from biasaudit.backends.vlm.base import FAILED, OK, REFUSED, VLMBackend, VLMRequest, VLMResponse, encode_image
from biasaudit.backends.vlm.cache import Accounting, CachedVLM, Price
from biasaudit.backends.vlm.parse import parse_choice, parse_usd


def backend_names() -> tuple[str, ...]:
    return registry.names("vlm")


def make_vlm_backend(spec: Any, groups: tuple[str, ...] = (), dimension: str = "race") -> VLMBackend:
    """Build the backend a `VLMSpec` names (imports only what that backend needs); `groups`, the active group
    set's labels (or the gender set's, with dimension "gender"), goes to a backend whose constructor takes it
    (simulated: `dimension` says which planted truth it reads)."""
    if spec.backend not in registry.names("vlm"):
        raise ValueError(f"vlm.backend: unknown backend '{spec.backend}'; available: {', '.join(backend_names())}")
    return registry.build("vlm", spec.backend, spec, groups=groups, dimension=dimension)


def probe(spec: Any) -> str:
    """A hosted VLM's probe (VLMBackend.probe) on a backend built for it: '' when the model answers."""
    return make_vlm_backend(spec).probe()


def stage_probe(spec: Any) -> Any:
    """The engine's Stage.probe for `spec`: None for a local backend (nothing to ask before loading it)."""
    from functools import partial

    return partial(probe, spec) if registry.is_hosted("vlm", spec.backend) else None


__all__ = ["Accounting", "backend_names", "CachedVLM", "FAILED", "OK", "Price", "REFUSED", "TokenBucket", "VLMBackend",
           "VLMRequest", "VLMResponse", "encode_image", "make_vlm_backend", "parse_choice", "parse_usd", "probe", "stage_probe"]
