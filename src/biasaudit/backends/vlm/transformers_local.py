"""Local VLM through transformers: a Qwen2-VL / Qwen2.5-VL style checkpoint by local path or hub id.

    backend = TransformersVLM(spec)   # spec: VLMSpec(backend="transformers", model_id=..., device, dtype)
    backend.generate([VLMRequest(images=(a, b), prompt="...", options=("A", "B"))])

- Loading: `AutoProcessor` + `AutoModelForImageTextToText` (the real classes). A hub id is resolved
  in the local Hugging Face cache when HF_HUB_OFFLINE=1 (a clear error naming `model_id` when it is
  not there); otherwise transformers downloads it. The revision recorded is the spec's, else the
  cached snapshot's commit, else a fingerprint of a local folder's files (names, sizes, configs).
- Prompt: one user turn through the processor's chat template — every image of the request (in
  order: 2AFC sends A then B) followed by the prompt text.
- Decoding: greedy, at most `request.max_tokens` new tokens; requests are batched (left padding,
  `spec.local_batch_size` per forward pass).
- Options: when a request has options, `option_probs` is the softmax over the options' first-token
  logits at the answer position (the first generated token). With `spec.constrain` the answer is the
  most probable option (one forward step); without it the model's own greedy text is returned and
  the probabilities are still recorded. Options that share a first token (e.g. words that a small
  vocabulary splits alike) are scored instead by their whole-sequence log-likelihood after the prompt
  (one forward pass over every option; softmax over the sums).
- One bad item (unreadable image, an option that tokenizes to nothing, an error in its forward pass) gives
  a failed response with a reason; the rest of the batch is still answered.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed, load_pil
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it (1/ON/YES/TRUE), read now rather than at import."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def folder_fingerprint(path: Path) -> str:
    """A cheap revision for a local model folder: sha256 over (relative path, size) of every file and
    the full text of its JSON configs. Weight bytes are not read (multi-GB checkpoints)."""
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file() and not q.name.startswith(".")):
        h.update(f"{p.relative_to(path).as_posix()}\0{p.stat().st_size}\0".encode())
        if p.suffix == ".json":
            h.update(p.read_bytes())
    return "local-" + h.hexdigest()[:16]


def resolve_model(model_id: str, revision: str = "", key: str = "vlm.model_id") -> tuple[str, str]:
    """(what to pass to from_pretrained, revision to record) for a local folder or a hub id.

    Offline (HF_HUB_OFFLINE=1) a hub id must already be in the local cache: otherwise a ValueError
    naming `key` says how to get it. Online the hub id is returned as is (transformers downloads it).
    """
    path = Path(model_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{key}: local folder '{model_id}' has no config.json (not a saved transformers model)")
        return str(path), revision or folder_fingerprint(path)
    if model_id.startswith((".", "/", "~")) or model_id.count("/") > 1 or not model_id:
        raise ValueError(f"{key}: '{model_id}' is neither an existing local model folder nor a hub id (org/name)")
    if not hub_offline():
        return model_id, revision
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = snapshot_download(model_id, revision=revision or None, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise ValueError(
            f"{key}: hub model '{model_id}'{f' (revision {revision})' if revision else ''} is not in the local "
            f"Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it; download it first "
            f"(`hf download {model_id}`) or set {key} to a local folder ({type(exc).__name__})") from exc
    return snapshot, revision or Path(snapshot).name  # snapshot folders are named by commit hash


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, str]:
    """('auto' → cuda when available, else cpu; dtype 'auto' → bfloat16 on a GPU, float32 on the CPU)."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


@register("vlm", "transformers")
class TransformersVLM(VLMBackend):
    name = "transformers"
    needs = (("weight", "model_id", "config.json"),)

    def __init__(self, spec: VLMSpec, stand_in: bool = False, path: str | os.PathLike | None = None,
                 revision: str | None = None):
        """`path`/`revision` override where the weights are and what revision is recorded (the tiny
        stand-in passes its built folder and weights hash); otherwise both come from the spec."""
        super().__init__()
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.spec, self.torch, self.stand_in = spec, torch, stand_in
        self.model_id = spec.model_id
        if path is not None:
            source, rev = str(path), revision or folder_fingerprint(Path(path))
        else:
            source, rev = resolve_model(spec.model_id, spec.revision)
        kw: dict[str, Any] = {"revision": spec.revision} if (spec.revision and not Path(source).is_dir()) else {}
        self.processor = AutoProcessor.from_pretrained(source, **kw)
        self.device, self.dtype = resolve_device_dtype(spec.device, spec.dtype)
        load_kw: dict[str, Any] = {"dtype": getattr(torch, self.dtype)}
        if spec.device_map:
            load_kw["device_map"] = spec.device_map  # accelerate places the layers (several GPUs / CPU)
        model = AutoModelForImageTextToText.from_pretrained(source, **load_kw, **kw)
        self.model = (model if spec.device_map else model.to(self.device)).eval()
        if spec.device_map:  # inputs go where the embeddings live
            self.device = str(next(self.model.parameters()).device)
        self.revision = rev or getattr(self.model.config, "_commit_hash", None) or "main"
        self._attach()

    @classmethod
    def from_objects(cls, spec: VLMSpec, model: Any, processor: Any, revision: str, stand_in: bool = True) -> "TransformersVLM":
        """The backend around a model and processor built in memory (benchmarks: random weights of a
        real architecture at full size); placed on `spec.device` in `spec.dtype`."""
        import torch

        self = cls.__new__(cls)
        VLMBackend.__init__(self)
        self.spec, self.torch, self.stand_in, self.model_id = spec, torch, stand_in, spec.model_id
        self.device, self.dtype = resolve_device_dtype(spec.device, spec.dtype)
        self.processor, self.revision = processor, revision
        self.model = model.to(self.device, dtype=getattr(torch, self.dtype)).eval()
        self._attach()
        return self

    def _attach(self) -> None:
        tok = self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        tok.padding_side = "left"  # decoder-only batched generation
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        gen = self.model.generation_config
        self.eos_ids = set(_as_list(gen.eos_token_id) or _as_list(tok.eos_token_id))
        self.pad_id = gen.pad_token_id if gen.pad_token_id is not None else tok.pad_token_id

    def decoding_params(self) -> dict[str, Any]:
        s = self.spec
        return {"greedy": True, "constrain": s.constrain, "image_max_side": s.image_max_side, "dtype": self.dtype,
                "option_scoring": "first-token softmax; sequence log-likelihood when first tokens collide"}

    # --- helpers --------------------------------------------------------------------------------

    def first_tokens(self, options: tuple[str, ...]) -> tuple[list[int] | None, str]:
        """Each option's first token id, or None and a reason when two options share one."""
        if len(set(options)) < len(options):
            return None, f"duplicate options {list(options)}"
        ids = []
        for o in options:
            toks = self.tokenizer(o, add_special_tokens=False)["input_ids"]
            if not toks:
                return None, f"option {o!r} tokenizes to nothing"
            ids.append(int(toks[0]))
        if len(set(ids)) < len(ids):
            return None, "shared first token"
        return ids, ""

    def sequence_option_probs(self, req: VLMRequest, images: list) -> dict[str, float]:
        """Softmax over each option's summed token log-probabilities after the prompt."""
        torch = self.torch
        prompt = self.prompt_text(req)
        texts = [prompt + option for option in req.options]
        inputs = self.processor(text=texts, images=[images] * len(texts) if images else None,
                                return_tensors="pt", padding=True).to(self.device)
        lengths = [len(self.tokenizer(o, add_special_tokens=False)["input_ids"]) for o in req.options]
        self._count("attempts", 1)
        with torch.inference_mode():
            logits = self.model(**inputs).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        token_logp = logp.gather(-1, inputs["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        totals = torch.stack([token_logp[i, -n:].sum() for i, n in enumerate(lengths)])  # left padding: options end last
        return dict(zip(req.options, torch.softmax(totals, dim=0).tolist()))

    def prompt_text(self, req: VLMRequest) -> str:
        """The chat-templated user turn: labels, images and prompt in `req.parts()` order."""
        content = [{"type": "image"} if kind == "image" else {"type": "text", "text": value}
                   for kind, value in req.parts()]
        return self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                  add_generation_prompt=True, tokenize=False)

    def _run(self, group: list[tuple[VLMRequest, list, list[int] | None]], constrained: bool) -> list[VLMResponse]:
        """One batched forward/generate over prepared requests (same kind: with/without images)."""
        torch = self.torch
        texts = [self.prompt_text(req) for req, _, _ in group]
        has_images = bool(group[0][1])
        inputs = self.processor(text=texts, images=[images for _, images, _ in group] if has_images else None,
                                return_tensors="pt", padding=True).to(self.device)
        n_prompt = int(inputs["input_ids"].shape[1])
        tokens_in = inputs["attention_mask"].sum(dim=1).tolist()
        max_new = 1 if constrained else max(req.max_tokens for req, _, _ in group)
        self._count("attempts", len(group))
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=max_new, do_sample=False, temperature=None,
                                      top_p=None, top_k=None, pad_token_id=self.pad_id, output_logits=True,
                                      return_dict_in_generate=True)
        first_logits = out.logits[0].float()  # answer position: logits of the first generated token
        responses = []
        for i, (req, _, option_ids) in enumerate(group):
            option_probs = None
            if option_ids is not None:
                probs = torch.softmax(first_logits[i, option_ids], dim=0).tolist()
                option_probs = dict(zip(req.options, probs))
            if constrained:
                best = max(option_probs, key=option_probs.get)
                responses.append(VLMResponse(best, OK, tokens_in=int(tokens_in[i]), tokens_out=1,
                                             option_probs=option_probs, meta={"constrained": True}))
                continue
            new = out.sequences[i, n_prompt:n_prompt + req.max_tokens].tolist()
            n_out = next((k + 1 for k, t in enumerate(new) if t in self.eos_ids), len(new))
            text = self.tokenizer.decode(new[:n_out], skip_special_tokens=True).strip()
            responses.append(VLMResponse(text, OK, tokens_in=int(tokens_in[i]), tokens_out=n_out,
                                         option_probs=option_probs))
        return responses

    # --- interface ------------------------------------------------------------------------------

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        # torch's CPU kernels split sums by thread, so the last bits of an option probability depend on the
        # thread count (the machine's cores); a stand-in on the CPU (the tiny Qwen2-VL: its matrices are too
        # small for threads to pay, and on a busy machine each kernel's threads wait for one another) runs on one
        # thread, so its answers are the same on every machine with the same kernels (as ClipEmbedder's)
        torch, threads = self.torch, self.torch.get_num_threads()
        if self.stand_in and self.device == "cpu":
            torch.set_num_threads(1)
        try:
            return self._generate(requests, on_result)
        finally:
            torch.set_num_threads(threads)

    def _generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        out: list[VLMResponse | None] = [None] * len(requests)

        def report(i: int, response: VLMResponse) -> None:
            out[i] = response
            if on_result is not None:
                on_result(i, response)

        groups: dict[tuple[bool, bool], list[int]] = {}
        prepared: dict[int, tuple[VLMRequest, list, list[int] | None]] = {}
        for i, req in enumerate(requests):
            images, bad = [], ""
            for path in req.images:
                img, reason = load_pil(path, req.max_side(self.spec.image_max_side))
                if img is None:
                    bad = reason
                    break
                images.append(img)
            option_ids, reason = self.first_tokens(req.options) if req.options else (None, "")
            if bad or (reason and reason != "shared first token"):
                report(i, failed(bad or reason))
                continue
            if reason:  # options share a first token: whole-sequence scoring, one request at a time
                try:
                    probs = self.sequence_option_probs(req, images)
                    if self.spec.constrain:
                        report(i, VLMResponse(max(probs, key=probs.get), OK, option_probs=probs,
                                              meta={"constrained": True, "option_scoring": "sequence"}))
                    else:
                        response = self._run([(req, images, None)], False)[0]
                        response.option_probs = probs
                        report(i, response)
                except Exception as exc:
                    report(i, failed(f"{type(exc).__name__}: {exc}"[:500]))
                continue
            prepared[i] = (req, images, option_ids)
            groups.setdefault((bool(images), bool(self.spec.constrain and req.options)), []).append(i)

        size = max(1, int(self.spec.local_batch_size))
        for (_, constrained), idx in groups.items():
            for start in range(0, len(idx), size):
                chunk = idx[start:start + size]
                try:
                    for i, response in zip(chunk, self._run([prepared[i] for i in chunk], constrained)):
                        report(i, response)
                except Exception:
                    for i in chunk:
                        try:
                            report(i, self._run([prepared[i]], constrained)[0])
                        except Exception as exc:
                            report(i, failed(f"{type(exc).__name__}: {exc}"[:500]))
        return [r if r is not None else failed("no response") for r in out]


def _as_list(x: Any) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]

