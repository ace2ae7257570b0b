"""Local diffusers pipelines: any hub id or local directory (SD 3.5 Large Turbo, FLUX.1-schnell, ...).

Every image gets its own `torch.Generator` seeded with its derived seed, so a batch of 8 gives the
same images as 8 single calls (up to floating-point batching noise) and any image can be
regenerated alone. Generators live on the CPU, so the initial noise is the same on cuda, mps and cpu.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from biasaudit.backends.generators.base import GenRequest, GenResult, Generator
from biasaudit.params.generate import GeneratorSpec

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def looks_like_path(model_id: str) -> bool:
    """A local directory reference, as opposed to an 'org/name' hub id."""
    return model_id.startswith((".", "/", "~")) or model_id.count("/") > 1 or Path(model_id).exists()


def resolve_revision(model_id: str, revision: str | None) -> tuple[str, str]:
    """(what to load, revision to record): a local directory and its weights hash, or a hub id and the
    commit of its cached snapshot. Raises FileNotFoundError with a readable reason when absent."""
    from biasaudit.tiny.diffusion import weights_hash

    if looks_like_path(model_id):
        path = Path(model_id).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"local path '{model_id}' does not exist")
        if not (path / "model_index.json").is_file():
            raise FileNotFoundError(f"'{model_id}' has no model_index.json (not a diffusers pipeline folder)")
        return str(path), weights_hash(path)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = snapshot_download(model_id, revision=revision, allow_patterns=["model_index.json"],
                                     local_files_only=hub_offline())
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"hub id '{model_id}' (revision {revision or 'main'}) is not in the local Hugging Face cache and "
            "HF_HUB_OFFLINE=1; download it first (huggingface-cli download) or give a local directory") from None
    except Exception as exc:  # network errors, gated repos, unknown ids
        raise FileNotFoundError(f"hub id '{model_id}': {type(exc).__name__}: {exc}") from None
    return model_id, Path(snapshot).name  # snapshots/<commit>


def pick_device(requested: str) -> str:
    import torch

    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def call_kwargs(spec: GeneratorSpec) -> dict[str, Any]:
    """Pipeline call arguments fixed by the spec (the per-image ones are prompt, seed, size)."""
    kw: dict[str, Any] = {"num_inference_steps": spec.num_inference_steps, "guidance_scale": spec.guidance_scale}
    if spec.max_sequence_length is not None:
        kw["max_sequence_length"] = spec.max_sequence_length
    if spec.negative_prompt is not None:
        kw["negative_prompt"] = spec.negative_prompt
    return kw


def load_pipeline(source: str, spec: GeneratorSpec, device: str):
    import torch
    import diffusers

    cls = {"auto": diffusers.DiffusionPipeline, "sd3": diffusers.StableDiffusion3Pipeline,
           "flux": diffusers.FluxPipeline}[spec.pipeline]
    dtype = getattr(torch, DTYPES[spec.dtype])
    from packaging.version import Version

    # diffusers ≥ 0.42 renamed torch_dtype → dtype (the old name warns)
    dtype_key = "dtype" if Version(diffusers.__version__) >= Version("0.42") else "torch_dtype"
    kwargs: dict[str, Any] = {dtype_key: dtype}
    if not Path(source).is_dir():
        kwargs.update(revision=spec.revision, local_files_only=hub_offline())
    pipe = cls.from_pretrained(source, **kwargs)
    if spec.cpu_offload == "model":
        pipe.enable_model_cpu_offload()
    elif spec.cpu_offload == "sequential":
        pipe.enable_sequential_cpu_offload()
    else:
        pipe.to(device)
    if spec.compile:
        denoiser = getattr(pipe, "transformer", None) or pipe.unet
        compiled = torch.compile(denoiser)
        if hasattr(pipe, "transformer"):
            pipe.transformer = compiled
        else:
            pipe.unet = compiled
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextmanager
def quiet_truncation(enabled: bool):
    """The tiny stand-ins tokenize per character, so every prompt overflows CLIP's 77 tokens and the
    pipelines warn once per batch; silence that for stand-ins only (real models keep the warning)."""
    import logging

    logger = logging.getLogger("diffusers")
    level = logger.level
    if enabled:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class DiffusersGenerator(Generator):
    backend = "diffusers"

    def __init__(self, name: str, spec: GeneratorSpec, source: str | None = None, revision: str | None = None,
                 model_id: str | None = None):
        source_, revision_ = (source, revision) if source is not None else resolve_revision(spec.model_id, spec.revision)
        super().__init__(name, model_id or spec.model_id, revision_ or "")
        self.spec = spec
        self.device = pick_device(spec.device)
        self.pipe = load_pipeline(source_, spec, self.device)
        self.pipeline_class = type(self.pipe).__name__

    def settings(self) -> dict[str, Any]:
        s = self.spec
        return {"pipeline_class": self.pipeline_class, **call_kwargs(s), "dtype": s.dtype, "device": self.device,
                "width": s.width, "height": s.height, "noise": "torch.Generator(cpu).manual_seed(seed) per image"}

    def _run(self, requests: list[GenRequest]) -> np.ndarray:
        import torch

        gens = [torch.Generator("cpu").manual_seed(r.seed) for r in requests]
        with torch.inference_mode(), quiet_truncation(self.stand_in):
            out = self.pipe(prompt=[r.prompt for r in requests], height=requests[0].height, width=requests[0].width,
                            generator=gens, output_type="np", **call_kwargs(self.spec))
        images = np.asarray(out.images, dtype=np.float32)
        if not np.isfinite(images).all():  # fp16 overflow → NaN; count as a black image
            images = np.nan_to_num(images, nan=0.0, posinf=1.0, neginf=0.0)
        return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        if not requests:
            return []
        try:
            images = self._run(requests)
            return [GenResult(img) for img in images]
        except Exception as exc:  # noqa: BLE001 - one bad batch must not end the stage
            if len(requests) == 1:
                return [GenResult.failed(f"{type(exc).__name__}: {exc}"[:500])]
            return [r for req in requests for r in self.generate([req])]  # isolate the bad item

    def close(self) -> None:
        self.pipe = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


def make_tiny(name: str, spec: GeneratorSpec, root: str | os.PathLike | None = None) -> DiffusersGenerator:
    """The tiny backend: build (once) the random-weight pipeline and load it with the real code."""
    from biasaudit.tiny.diffusion import DEFAULT_ROOT, ensure_tiny_pipeline

    assert spec.architecture is not None
    directory, revision = ensure_tiny_pipeline(spec.architecture, root or DEFAULT_ROOT)
    pipeline = spec.pipeline if spec.pipeline != "auto" else spec.architecture
    gen = DiffusersGenerator(name, spec.model_copy(update={"pipeline": pipeline}), source=str(directory),
                             revision=revision, model_id=f"biasaudit/tiny-{spec.architecture} (random weights)")
    gen.backend, gen.stand_in = "tiny", True
    return gen
