"""Local face inpainting with any diffusers inpainting pipeline (hub id or local path), restricted to
the face region: the face-region mask (faces/segment.py) is dilated and feathered by params, the
pipeline repaints inside it, and the result is composited onto the source so that every pixel outside
the feathered mask is the source's own, bit for bit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from biasaudit.backends.editors.base import EditRequest, EditResult, ImageEditor, composite, feathered_alpha
from biasaudit.pipeline.images import load_rgb
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import Counterfactuals


def _device(name: str) -> str:
    import torch

    if name != "auto":
        return name
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


@register("editor", "diffusers")
class DiffusersInpaintEditor(ImageEditor):
    name = "diffusers"
    needs = (("weight", "model_id", "model_index.json"),)
    uses_mask = True
    prompt_field = "inpaint_prompt"  # an inpainting prompt, not an edit instruction

    def __init__(self, spec: Counterfactuals, stand_in: bool = False, pipeline: Any = None):
        import torch
        from diffusers import AutoPipelineForInpainting

        self.spec, self.stand_in = spec, stand_in
        self.model_id, self.revision = spec.model_id, spec.revision or ""
        self.device = _device(spec.device)
        if pipeline is None:
            dtype = torch.float16 if self.device == "cuda" else torch.float32
            kw = {"revision": spec.revision} if spec.revision else {}
            pipeline = AutoPipelineForInpainting.from_pretrained(spec.model_id, dtype=dtype, **kw)
        else:
            pipeline = AutoPipelineForInpainting.from_pipe(pipeline)
        self.pipe = pipeline.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)

    def settings(self) -> dict[str, Any]:
        s = self.spec
        return {"pipeline": type(self.pipe).__name__, "steps": s.num_inference_steps, "guidance_scale": s.guidance_scale,
                "strength": s.strength, "dilate_px": s.mask_dilate_px, "feather_px": s.mask_feather_px,
                "device": self.device, "max_side": s.image_max_side}

    def _size(self, w: int, h: int) -> tuple[int, int]:
        scale = min(1.0, self.spec.image_max_side / max(w, h))
        mult = 16
        return max(mult, int(w * scale) // mult * mult), max(mult, int(h * scale) // mult * mult)

    def _one(self, req: EditRequest) -> EditResult:
        import torch

        if req.mask is None:
            return EditResult.failed("inpainting needs the face mask")
        loaded = load_rgb(req.source)
        if not loaded.ok:
            return EditResult.failed(f"source: {loaded.reason}")
        src = loaded.rgb
        h, w = src.shape[:2]
        alpha = feathered_alpha(req.mask, self.spec.mask_dilate_px, self.spec.mask_feather_px)
        W, H = self._size(w, h)
        image = Image.fromarray(src).resize((W, H), Image.Resampling.LANCZOS)
        mask_img = Image.fromarray((alpha > 0).astype(np.uint8) * 255).resize((W, H), Image.Resampling.NEAREST)
        gen = torch.Generator(device="cpu").manual_seed(req.seed % 2**63)
        kw: dict[str, Any] = {}
        if req.negative_prompt and self.spec.guidance_scale > 1:
            kw["negative_prompt"] = req.negative_prompt
        out = self.pipe(prompt=req.instruction, image=image, mask_image=mask_img, height=H, width=W,
                        num_inference_steps=self.spec.num_inference_steps, guidance_scale=self.spec.guidance_scale,
                        strength=self.spec.strength, generator=gen, **kw).images[0]
        generated = np.asarray(out.convert("RGB").resize((w, h), Image.Resampling.LANCZOS))
        return EditResult(composite(src, generated, alpha), "ok", meta={"size": [W, H]})

    def edit(self, requests: list[EditRequest]) -> list[EditResult]:
        out = []
        for req in requests:
            try:
                out.append(self._one(req))
            except Exception as exc:
                out.append(EditResult.failed(f"{type(exc).__name__}: {exc}"))
        return out
