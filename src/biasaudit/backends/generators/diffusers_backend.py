"""Local diffusers pipelines: any hub id or local directory (SD 3.5 Large Turbo, FLUX.1-schnell, ...).

GPU memory: `cpu_offload: auto` loads the pipeline on the CPU, measures each component's weights and
picks none (everything fits in free VRAM), model (the largest component fits: diffusers'
enable_model_cpu_offload) or sequential (enable_sequential_cpu_offload, slowest); the choice and the
numbers behind it are recorded in `settings()` and so in every manifest row. `drop_t5` loads SD3
without its T5-XXL encoder (text_encoder_3=None, as the diffusers SD3 docs describe).

A NaN or all-black output is `failed: numerical ...` (not a refusal: SD3 and FLUX have no safety
checker); with `numerical_retries` it is regenerated with a new derived seed, recorded in `extra`.

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

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.params.generate import GeneratorSpec
from biasaudit.registry import register

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
GIB = 1024 ** 3
# Peak activations of one 1024² image through a DiT denoiser + VAE decode in bf16 (measured order of
# magnitude; the VAE decode dominates). Scaled by pixels and batch size; a deliberate overestimate.
ACTIVATION_BYTES_PER_MEGAPIXEL = 1.5 * GIB
BLACK_MAX = 8  # as generate.black_threshold's default: an output whose brightest pixel ≤ this is black
HEADROOM = 0.92  # use at most this fraction of free VRAM (CUDA context, allocator fragmentation)


def component_bytes(pipe: Any) -> dict[str, int]:
    """Parameter + buffer bytes of every torch module of a pipeline (measured, not looked up)."""
    out: dict[str, int] = {}
    for name, comp in getattr(pipe, "components", {}).items():
        if hasattr(comp, "parameters") and hasattr(comp, "buffers"):
            n = sum(p.numel() * p.element_size() for p in comp.parameters())
            n += sum(b.numel() * b.element_size() for b in comp.buffers())
            out[name] = int(n)
    return out


def activation_bytes(width: int, height: int, batch_size: int) -> int:
    return int(ACTIVATION_BYTES_PER_MEGAPIXEL * (width * height / 1024 ** 2) * max(1, batch_size))


def choose_offload(free_bytes: int | None, components: dict[str, int], activations: int,
                   headroom: float = HEADROOM) -> str:
    """none when the whole pipeline + activations fit in `headroom` of the free VRAM; model when the
    largest component + activations fit (diffusers moves one component at a time to the GPU);
    sequential (weights streamed layer by layer) otherwise. No CUDA (free_bytes None): none."""
    if free_bytes is None:
        return "none"
    budget = free_bytes * headroom
    if sum(components.values()) + activations <= budget:
        return "none"
    if max(components.values(), default=0) + activations <= budget:
        return "model"
    return "sequential"


def free_vram_bytes(device: str) -> int | None:
    """Free memory of the CUDA device `device` uses, or None without CUDA."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    index = torch.device(device).index
    free, _total = torch.cuda.mem_get_info(index if index is not None else torch.cuda.current_device())
    return int(free)


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
            raise FileNotFoundError(f"'{model_id}' has no model_index.json (not a diffusers pipeline folder)"
                                    " — `biasaudit weights fetch` downloads the paper's models into models/")
        return str(path), locked_revision(path) or weights_hash(path)
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


def locked_revision(path: Path) -> str:
    """'<hub repo>@<commit>' for a folder `biasaudit weights fetch` downloaded (its files' sha256 are in
    models/weights.lock.json and checked by `biasaudit weights verify`), so 30 GB are not re-hashed
    at every load; '' for any other folder."""
    from biasaudit.weights import WEIGHTS, read_lock

    lock = read_lock()
    for w in WEIGHTS:
        entry = lock.get(w.name) or {}
        if entry.get("commit") and Path(w.local_path).resolve() == path.resolve():
            return f"{w.source}@{entry['commit']}"
    return ""


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


SAFETENSORS_FLOAT = {"F64", "F32", "F16", "BF16"}  # cast to the load dtype; other dtypes keep their size
SAFETENSORS_SIZE = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
                    "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def planned_bytes(source: str | os.PathLike, itemsize: int, skip: tuple[str, ...] = ()) -> dict[str, int] | None:
    """Per component of a local diffusers folder, the bytes its weights will take once loaded with
    floats of `itemsize` bytes, read off the safetensors headers (no tensor is read). None when the
    folder is not local or a component has no safetensors file (then the sizes are measured after loading)."""
    import json

    root = Path(source)
    index = root / "model_index.json"
    if not index.is_file():
        return None
    out: dict[str, int] = {}
    for name, value in json.loads(index.read_text()).items():
        if name.startswith("_") or not isinstance(value, list) or value[0] is None or name in skip:
            continue
        folder = root / name
        if not folder.is_dir():
            continue
        files = sorted(folder.glob("*.safetensors"))
        plain = [f for f in files if f.name.count(".") == 1]  # model.safetensors, not model.fp16.safetensors
        files = plain or files
        if not files:
            if (folder / "config.json").is_file():
                return None  # a torch module saved another way: measure after loading instead
            continue  # scheduler, tokenizer, feature extractor: no weights
        total = 0
        for f in files:
            with open(f, "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
            for key, t in header.items():
                if key == "__metadata__":
                    continue
                numel = 1
                for d in t["shape"]:
                    numel *= d
                total += numel * (itemsize if t["dtype"] in SAFETENSORS_FLOAT else SAFETENSORS_SIZE[t["dtype"]])
        out[name] = total
    return out


def straight_to_device(source: str, spec: GeneratorSpec, device: str, free_bytes: int | None,
                       itemsize: int) -> tuple[str, dict[str, Any]]:
    """('cuda', record) when the pipeline can load straight onto the GPU (diffusers' device_map): a local
    folder whose weights + activations fit without offload, judged before loading from the safetensors
    headers. Otherwise ('', record): it is loaded in host RAM first, which offload needs anyway (model /
    sequential keep the weights there) and which a Hub id or a GPU other than the default requires."""
    if device != "cuda" or spec.cpu_offload not in ("none", "auto"):
        return "", {"load": "host RAM first" + (" (offload keeps the weights there)" if device == "cuda" else "")}
    sizes = planned_bytes(source, itemsize, ("text_encoder_3",) if spec.drop_t5 else ())
    if not sizes:
        return "", {"load": "host RAM first (no local safetensors to plan from)"}
    if spec.cpu_offload == "auto":
        free = free_bytes if free_bytes is not None else free_vram_bytes(device)
        if choose_offload(free, sizes, activation_bytes(spec.width, spec.height, spec.batch_size)) != "none":
            return "", {"load": "host RAM first (auto chose offload from the planned sizes)"}
    return device, {"load": "straight to cuda (device_map; no CPU-RAM staging)",
                    "planned_gib": round(sum(sizes.values()) / GIB, 3)}


def load_pipeline(source: str, spec: GeneratorSpec, device: str, free_bytes: int | None = None):
    """Load the pipeline, place it (offload as configured or chosen) and return (pipe, memory record).
    Without offload it loads straight onto the GPU; see straight_to_device."""
    import diffusers
    import torch

    cls = {"auto": diffusers.DiffusionPipeline, "sd3": diffusers.StableDiffusion3Pipeline,
           "flux": diffusers.FluxPipeline}[spec.pipeline]
    dtype = getattr(torch, DTYPES[spec.dtype])
    from packaging.version import Version

    # diffusers ≥ 0.42 renamed torch_dtype → dtype (the old name warns)
    dtype_key = "dtype" if Version(diffusers.__version__) >= Version("0.42") else "torch_dtype"
    kwargs: dict[str, Any] = {dtype_key: dtype}
    if spec.drop_t5:
        kwargs.update(text_encoder_3=None, tokenizer_3=None)
    if not Path(source).is_dir():
        kwargs.update(revision=spec.revision, local_files_only=hub_offline())
    free = free_bytes if free_bytes is not None else free_vram_bytes(device)
    direct, load = straight_to_device(source, spec, device, free, torch.empty((), dtype=dtype).element_size())
    if direct:
        kwargs["device_map"] = direct
    pipe = cls.from_pretrained(source, **kwargs)
    memory = place_pipeline(pipe, spec, device, free, placed=bool(direct)) | load
    if spec.compile:
        denoiser = getattr(pipe, "transformer", None) or pipe.unet
        compiled = torch.compile(denoiser)
        if hasattr(pipe, "transformer"):
            pipe.transformer = compiled
        else:
            pipe.unet = compiled
    pipe.set_progress_bar_config(disable=True)
    return pipe, memory


def place_pipeline(pipe: Any, spec: GeneratorSpec, device: str, free_bytes: int | None = None,
                   placed: bool = False) -> dict[str, Any]:
    """Put a loaded pipeline where `spec.cpu_offload` says (auto: chosen from free VRAM and the
    measured component sizes); return what was chosen and why (recorded in provenance). `placed`: it
    was loaded onto `device` already (no offload, chosen before loading)."""
    sizes = component_bytes(pipe)
    memory: dict[str, Any] = {"cpu_offload_requested": spec.cpu_offload,
                              "pipeline_gib": round(sum(sizes.values()) / GIB, 3),
                              "largest_component": max(sizes, key=sizes.get) if sizes else "",
                              "largest_component_gib": round(max(sizes.values(), default=0) / GIB, 3),
                              "drop_t5": spec.drop_t5}
    offload = spec.cpu_offload
    if placed:
        memory["cpu_offload"] = "none"
        return memory
    if offload == "auto":
        free = free_bytes if free_bytes is not None else free_vram_bytes(device)
        offload = choose_offload(free, sizes, activation_bytes(spec.width, spec.height, spec.batch_size))
        memory["free_vram_gib"] = None if free is None else round(free / GIB, 3)
    if not device.startswith("cuda"):
        offload = "none"  # accelerate's offload hooks need CUDA
    memory["cpu_offload"] = offload
    if offload == "model":
        pipe.enable_model_cpu_offload()
    elif offload == "sequential":
        pipe.enable_sequential_cpu_offload()
    else:
        pipe.to(device)
    return memory


def numerical_fault(image: np.ndarray, black_threshold: int = BLACK_MAX) -> str:
    """'' for a usable float image in [0, 1]; otherwise why it is a numerical fault (NaN/inf, or every
    pixel ≤ black_threshold/255: what an fp16 overflow decodes to)."""
    if not np.isfinite(image).all():
        return f"numerical: {int((~np.isfinite(image)).sum())} NaN/inf values in the decoded image"
    peak = float(np.max(image)) * 255.0 if image.size else 0.0
    if peak <= black_threshold + 0.5:
        return f"numerical: all-black image (max pixel value {int(round(peak))})"
    return ""


def retry_seed(seed: int, attempt: int) -> int:
    """The seed of numerical retry `attempt` (1, 2, ...): a fixed, recorded function of the original."""
    from biasaudit.pipeline.provenance import stable_hash

    return int(stable_hash([seed, "numerical-retry", attempt], length=15), 16)


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


@register("generator", "diffusers")
class DiffusersGenerator(Generator):
    backend = "diffusers"
    needs = (("weight", "model_id", "model_index.json"),)
    batches = True  # spec.batch_size prompts per forward pass
    requires_all = ("model_id",)
    side_multiple = 16  # VAE factor 8 × transformer patch size 2


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        problems, revision = [], ""
        try:
            revision = resolve_revision(spec.model_id, spec.revision)[1]
        except FileNotFoundError as exc:
            problems.append(f"{key}.model_id: {exc}")
        if spec.device == "cuda" or spec.cpu_offload != "none":
            import torch

            if not torch.cuda.is_available():
                problems.append(f"{key}.device: CUDA requested (device/cpu_offload) but no CUDA device is available")
        return revision, problems
    def __init__(self, name: str, spec: GeneratorSpec, source: str | None = None, revision: str | None = None,
                 model_id: str | None = None, free_bytes: int | None = None):
        source_, revision_ = (source, revision) if source is not None else resolve_revision(spec.model_id, spec.revision)
        super().__init__(name, model_id or spec.model_id, revision_ or "")
        self.spec = spec
        self.device = pick_device(spec.device)
        self.pipe, self.memory = load_pipeline(source_, spec, self.device, free_bytes)
        self.pipeline_class = type(self.pipe).__name__

    def settings(self) -> dict[str, Any]:
        s = self.spec
        return {"pipeline_class": self.pipeline_class, **call_kwargs(s), "dtype": s.dtype, "device": self.device,
                "width": s.width, "height": s.height, "noise": "torch.Generator(cpu).manual_seed(seed) per image",
                "memory": self.memory}

    def _run(self, requests: list[GenRequest]) -> np.ndarray:
        import torch

        gens = [torch.Generator("cpu").manual_seed(r.seed) for r in requests]
        with torch.inference_mode(), quiet_truncation(self.stand_in):
            out = self.pipe(prompt=[r.prompt for r in requests], height=requests[0].height, width=requests[0].width,
                            generator=gens, output_type="np", **call_kwargs(self.spec))
        return np.asarray(out.images, dtype=np.float32)

    @staticmethod
    def to_uint8(image: np.ndarray) -> np.ndarray:
        return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)

    def _results(self, requests: list[GenRequest]) -> list[GenResult]:
        images = self._run(requests)
        out = []
        for req, img in zip(requests, images):
            fault = numerical_fault(img)
            out.append(GenResult.failed(fault, seed_tried=req.seed) if fault else GenResult(self.to_uint8(img)))
        return out

    def _retry_numerical(self, req: GenRequest, first: GenResult) -> GenResult:
        """Regenerate a numerically failed image with new derived seeds (numerical_retries times)."""
        from dataclasses import replace

        tried = [req.seed]
        result = first
        for attempt in range(1, self.spec.numerical_retries + 1):
            seed = retry_seed(req.seed, attempt)
            tried.append(seed)
            [result] = self._results([replace(req, seed=seed)])
            if result.status == "ok":
                result.retries = attempt
                result.extra.update(numerical_retry_seed=seed, seeds_tried=tried)
                return result
        result.retries = len(tried) - 1
        result.extra.update(seeds_tried=tried)
        return result

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        if not requests:
            return []
        try:
            results = self._results(requests)
        except Exception as exc:
            if len(requests) == 1:
                return [GenResult.failed(f"{type(exc).__name__}: {exc}"[:500])]
            return [r for req in requests for r in self.generate([req])]  # isolate the bad item
        return [self._retry_numerical(req, res) if res.status == "failed" and res.reason.startswith("numerical")
                and self.spec.numerical_retries else res for req, res in zip(requests, results)]

    def close(self) -> None:
        self.pipe = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


# random-weight pipelines run the real diffusers code: stand-in outputs, kept like a model's images
@register("generator", "tiny", stand_in=True, recomputes_cheaply=False, batches=True, side_multiple=16,
          requires_all=("architecture",), needs=(), imports_existing=False)  # builds its own random weights: it needs nothing
def make_tiny_generator(name: str, spec: GeneratorSpec, tiny_root: str | os.PathLike | None = None) -> DiffusersGenerator:
    return make_tiny(name, spec, tiny_root)


def preflight_tiny(spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
    from biasaudit.tiny.diffusion import ensure_tiny_pipeline

    return ensure_tiny_pipeline(spec.architecture)[1], []  # type: ignore[arg-type]


make_tiny_generator.preflight = preflight_tiny  # type: ignore[attr-defined]


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
