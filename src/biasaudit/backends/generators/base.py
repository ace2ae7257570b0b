"""The generator interface: a batch function over requests that never raises for one bad item.

A backend turns `GenRequest`s (prompt, seed, size) into `GenResult`s carrying an RGB image or a
status + reason. The stage (biasaudit.t2i.generate) owns files, the manifest and resumption, so the
same backends run unchanged under a distributed runner.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from biasaudit.params.base import redact


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
    imports_existing: bool = False  # the images were made elsewhere (a folder): their records carry no answer time

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

    def probe(self) -> str:
        """One cheap request before the stage's first batch: '' when the model is served, else why not
        (hosted backends; a local model's loading is its own check)."""
        return ""

    @classmethod
    def preflight(cls, spec: Any, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        """What the schema cannot check (files, environment, local caches), before any work: the model
        revision and the problems found, each naming its params key (`key` is models.<name>)."""
        return spec.revision or spec.model_id, []


def api_key_problems(spec: Any, key: str) -> list[str]:
    """A hosted backend's key variable must be set (unless Vertex AI's default credentials serve)."""
    import os

    if spec.api_key_env and not getattr(spec, "vertex_project", "") and not os.environ.get(spec.api_key_env):
        return [f"{key}.api_key_env: environment variable {spec.api_key_env} is not set"]
    return []


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
