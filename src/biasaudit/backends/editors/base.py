"""The image-editor interface of Method B (face-only counterfactuals) and its shared helpers.

An editor turns `EditRequest`s (source photo, target group, instruction, seed, face mask) into one
`EditResult` per request, in order, and never raises for one bad item. Mask-based editors (diffusers
inpainting, the tiny stand-in) composite their output so that every pixel outside the feathered face
mask is the source's own (`composite`); hosted editors return whatever the service returns, and the
validate_edits checks measure what changed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import ndimage

from biasaudit.params.base import redact


@dataclass(frozen=True)
class EditRequest:
    source: str                   # path of the source photo
    target: str                   # FOCUS group name, e.g. 'Black_man'
    description: str              # e.g. 'a Black man'
    instruction: str              # the full instruction text (hosted editors) / inpainting prompt
    seed: int
    mask: np.ndarray | None = field(default=None, compare=False, hash=False)  # bool H×W face region
    negative_prompt: str = ""


@dataclass
class EditResult:
    image: np.ndarray | None      # H×W×3 uint8, or None when no edit came back
    status: str                   # ok | refused | failed
    reason: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. retries, text the service returned

    def __post_init__(self) -> None:
        self.reason = redact(self.reason)  # an API error may quote the key it was sent

    @classmethod
    def failed(cls, reason: str, **meta: Any) -> "EditResult":
        return cls(None, "failed", reason[:500], meta)

    @classmethod
    def refused(cls, reason: str, **meta: Any) -> "EditResult":
        return cls(None, "refused", reason[:500], meta)


class ImageEditor(ABC):
    name: str = ""
    model_id: str = ""
    revision: str = ""
    stand_in: bool = False
    uses_mask: bool = False       # whether requests need the face mask
    prompt_field: str = "instruction"  # the counterfactuals key whose text it is given

    @abstractmethod
    def edit(self, requests: list[EditRequest]) -> list[EditResult]:
        """One result per request, in order; never raises for one bad item."""

    def settings(self) -> dict[str, Any]:
        return {}

    def probe(self) -> str:
        """One cheap request before the stage's first batch: '' when the model is served (hosted editors)."""
        return ""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "model_id": self.model_id, "revision": self.revision,
                "stand_in": self.stand_in, "settings": self.settings()}


def feathered_alpha(mask: np.ndarray, dilate_px: int, feather_px: float) -> np.ndarray:
    """Face mask → blending weights in [0, 1]: dilated by `dilate_px` (disc), edge blurred by a Gaussian of
    sigma `feather_px`, and exactly 0 farther than dilate_px + 3·feather_px from the mask."""
    grown = ndimage.distance_transform_edt(~mask.astype(bool)) <= dilate_px if dilate_px > 0 else mask.astype(bool)
    alpha = grown.astype(np.float64)
    if feather_px > 0:
        alpha = ndimage.gaussian_filter(alpha, sigma=feather_px, truncate=3.0)
        alpha = np.maximum(alpha, grown * 0.5)  # keep the face itself mostly edited
        alpha[alpha < 1e-3] = 0.0
    return np.clip(alpha, 0.0, 1.0)


def composite(source: np.ndarray, generated: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """source·(1−α) + generated·α, rounded to uint8; pixels with α = 0 are the source's own, bit for bit."""
    if source.shape != generated.shape:
        raise ValueError(f"source {source.shape} and generated {generated.shape} differ in size")
    a = alpha[..., None]
    blend = np.round(source.astype(np.float64) * (1 - a) + generated.astype(np.float64) * a).astype(np.uint8)
    return np.where(a > 0, blend, source)
