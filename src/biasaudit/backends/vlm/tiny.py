"""`tiny` backend: the real backend code over seeded random-weight models built offline (tests,
offline profile): `tiny-open-clip` (clip zero-shot over a tiny open_clip model) and `tiny-qwen2-vl`
(the transformers backend over a tiny generative Qwen2-VL). Their answers are stand-ins: they test
the pipeline, not a model."""

from __future__ import annotations

import os
from pathlib import Path

from biasaudit.backends.vlm.base import VLMBackend
from biasaudit.backends.vlm.clip_zeroshot import ClipZeroShot
from biasaudit.params.classify import VLMSpec  # at run time: typing.get_type_hints resolves the factory's hints
from biasaudit.registry import register

TINY_MODELS = ("tiny-open-clip", "tiny-qwen2-vl", "tiny-qwen2-vl-digits")
TINY_DIR_ENV = "BIASAUDIT_TINY_DIR"  # where tiny weights are built (default: models/tiny)


def tiny_dir() -> Path:
    return Path(os.environ.get(TINY_DIR_ENV, "models/tiny"))


class TinyClip(ClipZeroShot):
    name = "tiny"

    def __init__(self, spec: VLMSpec):
        from biasaudit.tiny.clip import build_tiny_open_clip

        model_name, ckpt = build_tiny_open_clip(tiny_dir())
        super().__init__(spec, model_name=model_name, pretrained=str(ckpt), stand_in=True)
        self.model_id = spec.model_id
        self.revision = "random-seed0"


def make_tiny_qwen2_vl(spec: VLMSpec, digits_only: bool = False):
    """The real transformers backend over the tiny random Qwen2-VL; revision = its weights hash.
    `digits_only`: the variant whose free text is digits only (numeric answers parse)."""
    from biasaudit.backends.vlm.transformers_local import TransformersVLM
    from biasaudit.tiny.vlm import ensure_tiny_qwen2_vl, ensure_tiny_qwen2_vl_digits

    path, weights = (ensure_tiny_qwen2_vl_digits if digits_only else ensure_tiny_qwen2_vl)(tiny_dir())
    backend = TransformersVLM(spec, stand_in=True, path=path, revision=weights)
    backend.name = "tiny"
    return backend


@register("vlm", "tiny", reads=("clip_templates", "clip_class_names"), stand_in=True)
def make_tiny(spec: VLMSpec) -> VLMBackend:
    if spec.model_id == "tiny-open-clip":
        return TinyClip(spec)
    if spec.model_id in ("tiny-qwen2-vl", "tiny-qwen2-vl-digits"):
        return make_tiny_qwen2_vl(spec, digits_only=spec.model_id.endswith("-digits"))
    raise ValueError(f"classify.vlm.model_id: unknown tiny model '{spec.model_id}'; available: {', '.join(TINY_MODELS)}")
