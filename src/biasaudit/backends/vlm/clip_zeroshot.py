"""Zero-shot classification with open_clip and a prompt ensemble per option.

Each option is described by several class names (`clip_class_names`, e.g. hispanic → hispanic,
latino, latina) inside several templates (`clip_templates`); the normalised text embeddings are
averaged per option (the CLIP paper's ensembling), and each image's option probabilities are the
softmax of 100·cosine. The answer text is the most probable option, so the parse is exact.
The prompt of a request is not used (recorded for provenance only): CLIP reads no instruction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed, load_pil
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec


@register("vlm", "clip")
class ClipZeroShot(VLMBackend):
    name = "clip"
    needs = (("clip", "model_id", "clip_pretrained"),)
    reads = ("clip_templates", "clip_class_names")

    def __init__(self, spec: VLMSpec, model_name: str | None = None, pretrained: str | None = None,
                 stand_in: bool = False):
        super().__init__()
        import open_clip
        import torch

        self.spec = spec
        self.model_id = model_name or spec.model_id
        pretrained = pretrained if pretrained is not None else spec.clip_pretrained
        self.revision = spec.revision or pretrained
        self.stand_in = stand_in
        self.torch = torch
        self.device = spec.device if spec.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        # fp16 on a GPU (open_clip's precision='fp16'), fp32 on the CPU
        self.precision = "fp16" if self.device.startswith("cuda") else "fp32"
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            self.model_id, pretrained=pretrained or None, device=self.device, precision=self.precision)
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(self.model_id)
        self._text_cache: dict[tuple[str, ...], np.ndarray] = {}

    def decoding_params(self) -> dict[str, Any]:
        return {"templates": list(self.spec.clip_templates), "class_names": dict(self.spec.clip_class_names),
                "logit_scale": 100.0}

    def _class_texts(self, option: str) -> list[str]:
        names = self.spec.clip_class_names.get(option.lower(), [option.lower()])
        return [t.format(n) for n in names for t in self.spec.clip_templates]

    def text_embeddings(self, options: tuple[str, ...]) -> np.ndarray:
        """(n_options, d) L2-normalised mean of each option's normalised prompt embeddings."""
        if options not in self._text_cache:
            torch = self.torch
            rows = []
            with torch.inference_mode():
                for option in options:
                    emb = self.model.encode_text(self.tokenizer(self._class_texts(option)).to(self.device))
                    emb = torch.nn.functional.normalize(emb.float(), dim=-1).mean(0)
                    rows.append(torch.nn.functional.normalize(emb, dim=-1).cpu().numpy())
            self._text_cache[options] = np.stack(rows)
        return self._text_cache[options]

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        torch = self.torch
        out: list[VLMResponse | None] = [None] * len(requests)
        ready: list[tuple[int, Any]] = []
        for i, req in enumerate(requests):
            if len(req.images) != 1:
                out[i] = failed(f"clip backend takes exactly one image per request, got {len(req.images)}")
            elif not req.options:
                out[i] = failed("clip backend needs options (allowed answers)")
            else:
                img, reason = load_pil(req.images[0])
                if img is None:
                    out[i] = failed(reason)
                else:
                    ready.append((i, self.preprocess(img)))
        bs = self.spec.local_batch_size
        for start in range(0, len(ready), bs):
            chunk = ready[start:start + bs]
            with torch.inference_mode():
                batch = torch.stack([x for _, x in chunk]).to(self.device, dtype=next(self.model.parameters()).dtype)
                feats = self.model.encode_image(batch)
                feats = torch.nn.functional.normalize(feats.float(), dim=-1).cpu().numpy()
            self._count("attempts", len(chunk))
            for (i, _), f in zip(chunk, feats):
                options = requests[i].options
                logits = 100.0 * self.text_embeddings(options) @ f
                p = np.exp(logits - logits.max())
                p /= p.sum()
                probs = {o: float(v) for o, v in zip(options, p)}
                out[i] = VLMResponse(text=options[int(np.argmax(p))], status=OK, option_probs=probs)
        for i, r in enumerate(out):
            if on_result is not None:
                on_result(i, r)  # type: ignore[arg-type]
        return out  # type: ignore[return-value]
