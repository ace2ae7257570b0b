"""`tiny` backend: the real clip zero-shot code over a seeded random-weight open_clip model built
offline (tests, offline profile). Its labels are stand-ins: they test the pipeline, not a model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from biasaudit.backends.vlm.clip_zeroshot import ClipZeroShot

TINY_MODELS = ("tiny-open-clip",)
TINY_DIR_ENV = "BIASAUDIT_TINY_DIR"  # where tiny weights are built (default: models/tiny)


def tiny_dir() -> Path:
    return Path(os.environ.get(TINY_DIR_ENV, "models/tiny"))


class TinyClip(ClipZeroShot):
    name = "tiny"

    def __init__(self, spec: Any):
        from biasaudit.tiny.clip import build_tiny_open_clip

        model_name, ckpt = build_tiny_open_clip(tiny_dir())
        super().__init__(spec, model_name=model_name, pretrained=str(ckpt), stand_in=True)
        self.model_id = spec.model_id
        self.revision = "random-seed0"


def make_tiny(spec: Any):
    if spec.model_id == "tiny-open-clip":
        return TinyClip(spec)
    raise ValueError(f"classify.vlm.model_id: unknown tiny model '{spec.model_id}'; available: {', '.join(TINY_MODELS)}")
