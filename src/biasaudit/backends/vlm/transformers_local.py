"""Local VLM through transformers (e.g. a Qwen2.5-VL checkpoint by path or hub id).

Greedy decoding (temperature 0) of the chat-templated prompt with the images. With `constrain` and
options, the answer is instead the option with the highest next-token probability among the
options' first tokens (option_probs renormalised over them) — constrained decoding for one-word
answers. Not yet exercised on a tiny random Qwen2-VL in this repository's tests (see the report).
"""

from __future__ import annotations

from typing import Any

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed, load_pil


class TransformersVLM(VLMBackend):
    name = "transformers"

    def __init__(self, spec: Any, stand_in: bool = False):
        super().__init__()
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.spec, self.torch, self.stand_in = spec, torch, stand_in
        self.model_id = spec.model_id
        self.revision = spec.revision or "main"
        kw = {"revision": spec.revision} if spec.revision else {}
        self.processor = AutoProcessor.from_pretrained(spec.model_id, **kw)
        self.model = AutoModelForImageTextToText.from_pretrained(
            spec.model_id, dtype=getattr(torch, spec.dtype), **kw).to(spec.device).eval()

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        return {"greedy": True, "max_tokens": s.max_tokens, "constrain": s.constrain, "image_max_side": s.image_max_side}

    def _one(self, req: VLMRequest) -> VLMResponse:
        torch = self.torch
        images = []
        for path in req.images:
            img, reason = load_pil(path, self.spec.image_max_side)
            if img is None:
                return failed(reason)
            images.append(img)
        messages = [{"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": req.prompt}]}]
        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = self.processor(text=[text], images=images or None, return_tensors="pt").to(self.spec.device)
        n_in = int(inputs["input_ids"].shape[1])
        self._count("attempts")
        with torch.inference_mode():
            if self.spec.constrain and req.options:
                logits = self.model(**inputs).logits[0, -1].float()
                tok = self.processor.tokenizer
                first = {o: tok(o, add_special_tokens=False)["input_ids"][0] for o in req.options}
                if len(set(first.values())) < len(first):
                    return failed("options share a first token; constrained scoring is ambiguous")
                probs = torch.softmax(logits[list(first.values())], dim=0).tolist()
                option_probs = dict(zip(req.options, probs))
                best = max(option_probs, key=option_probs.get)
                return VLMResponse(best, OK, tokens_in=n_in, tokens_out=1, option_probs=option_probs)
            out = self.model.generate(**inputs, max_new_tokens=req.max_tokens, do_sample=False)
        answer = self.processor.batch_decode(out[:, n_in:], skip_special_tokens=True)[0].strip()
        return VLMResponse(answer, OK, tokens_in=n_in, tokens_out=int(out.shape[1] - n_in))

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        return self._each(requests, self._one, on_result)
