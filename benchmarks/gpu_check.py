"""GPU check of the paper profile's local models through our own backends, with random weights of the
real architectures at full size (cost and memory do not depend on the weights; nothing is downloaded).
Every architecture is built from a config committed in this repository; each step names its source.

Steps (each recorded with its status, so one failure does not hide the others; JSON rewritten after each):
  sd35-large-turbo, flux-schnell  1024², 4 steps, guidance 0, T5 256 tokens, built on the GPU (no CPU-RAM
                                  staging): our backend vs a plain diffusers loop at the same seeds (images/s,
                                  peak VRAM, as ratios; the max pixel difference), batch 1 and 4; then 24 and 40 GB
                                  cards simulated with torch.cuda.set_per_process_memory_fraction: what
                                  `cpu_offload: auto` picks there (none / model / sequential), whether it fits,
                                  images/s
  clip-vit-h-14                   open_clip ViT-H-14 in fp16 through ClipEmbedder at batch 16, 64, 128
  insightface                     SCRFD-shaped ONNX stand-in at the real 640² input + ArcFace 112², through
                                  InsightFaceDetector on CUDA: the providers it got, images/s
  face-parser                     BiSeNet at 512² (faces.skin_method: bisenet) at batch 1, 8, 32
  vlm-2b                          our transformers VLM path (Qwen2-VL-2B architecture, bf16) on a 2AFC request;
                                  not a paper model: the paper's open VLMs (Llama 3.2 90B Vision, DeepSeek-VL2)
                                  are served by vLLM (weights.VLLM_SERVE), which this machine lacks
  The JSON also records the wheel set installed offline (gpu_wheels.py) and where each package was
  imported from.

    bash benchmarks/gpu_check.sh [--out PATH]   # on a GPU box (default benchmarks/results/gpu_check.json)
    bash benchmarks/gpu_check.sh --dry-run      # tiny sizes on the CPU (the tests run this)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
GIB = 1024 ** 3
CAPS_GB = (24, 40)  # card sizes simulated on the GPU (set_per_process_memory_fraction)

# Qwen2-VL-2B-Instruct's published config.json (text + vision tower).
QWEN2_VL_2B = {
    "text": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, max_position_embeddings=32768, vocab_size=151936),
    "vision": dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                   spatial_merge_size=2, temporal_patch_size=2),
}


def _fullsize_module():
    spec = importlib.util.spec_from_file_location("gpu_generate_fullsize", HERE / "gpu_generate_fullsize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Report:
    def __init__(self, path: Path, dry_run: bool):
        import torch

        from biasaudit.pipeline.provenance import library_versions

        self.path = path
        self.data = {"dry_run": dry_run, "stand_in": "random weights of the real architectures",
                     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                     "libraries": library_versions(), "steps": {}}
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            self.data["gpu_total_gib"] = round(total / GIB, 2)
        self.data["wheels"] = wheel_report()

    def step(self, name: str, fn) -> None:
        t0 = time.perf_counter()
        try:
            out = {"status": "ok", **fn()}
        except Exception as exc:
            out = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:500],
                   "traceback": traceback.format_exc()[-2000:]}
        out["seconds"] = round(time.perf_counter() - t0, 2)
        self.data["steps"][name] = out
        print(json.dumps({name: {k: v for k, v in out.items() if k != "traceback"}}, default=str), flush=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str))
        _free_gpu()


def wheel_report() -> dict:
    """The wheel set gpu_check.sh installed (its manifest) and where each of its packages was imported from."""
    import importlib.util

    site = os.environ.get("GPU_SITE", "")
    manifest = Path(site) / "gpu-wheels.json" if site else None
    if manifest is None or not manifest.exists():
        return {"installed": {}, "note": "no wheel site (run through benchmarks/gpu_check.sh)"}
    data = json.loads(manifest.read_text())
    origins = {}
    for modules in data["installed"].values():
        for mod in modules:
            spec = importlib.util.find_spec(mod)
            origins[mod] = (spec.origin or str(spec.submodule_search_locations)) if spec else None
    data["imported_from"] = origins
    return data


def _free_gpu() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _timed(fn, n: int, cuda: bool) -> float:
    import torch

    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t)


def _plain_loop(pipe, prompts: list[str], seeds: list[int], size: int, seq: int, bs: int):
    """The baseline: diffusers' own pipeline call, per batch, with the same seeds (CPU generators, as
    our backend seeds them), the published settings, nothing of ours around it."""
    import torch

    out = []
    for s in range(0, len(prompts), bs):
        gens = [torch.Generator("cpu").manual_seed(x) for x in seeds[s:s + bs]]
        with torch.inference_mode():
            out.extend(pipe(prompt=prompts[s:s + bs], height=size, width=size, num_inference_steps=4,
                            guidance_scale=0.0, max_sequence_length=seq, generator=gens, output_type="np").images)
    return out


def _peak_gib(cuda: bool) -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / GIB, 2) if cuda else None


def _capped_runs(gen, pipe, spec, reqs, cuda: bool, sizes: dict) -> dict:
    """Each card size of CAPS_GB simulated with set_per_process_memory_fraction on this GPU: the pipeline
    starts on the CPU, `cpu_offload: auto` chooses from the capped free memory (none / model / sequential),
    one image is generated; what it chose, whether it fit, images/s and the peak. CPU: the plan only."""
    import torch

    from biasaudit.backends.generators.diffusers_backend import activation_bytes, choose_offload, place_pipeline

    out = {}
    size = spec.width
    for gb in CAPS_GB:
        cap = int(gb * 1e9)
        plan = {f"batch {bs}": choose_offload(cap, sizes, activation_bytes(size, size, bs)) for bs in (1, 4)}
        if not cuda:
            out[f"{gb}GB"] = {"auto_picks": plan, "ran": False, "note": "no CUDA: the plan only"}
            continue
        pipe.to("cpu")
        _free_gpu()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
        row: dict = {"auto_picks": plan, "ran": True, "fraction": round(cap / total, 4)}
        try:
            capped = spec.model_copy(update={"cpu_offload": "auto", "batch_size": 1})
            row["memory"] = place_pipeline(pipe, capped, "cuda", cap - torch.cuda.memory_allocated())
            gen.spec = capped
            torch.cuda.reset_peak_memory_stats()
            results: list = []
            row["images_per_s"] = round(_timed(lambda results=results: results.extend(gen.generate(reqs[:1])), 1, True), 4)
            row["statuses"] = sorted({r.status + (f": {r.reason}" if r.reason else "") for r in results})
            row["peak_vram_gib"] = _peak_gib(True)
            row["fits"] = all(r.status == "ok" for r in results) and row["peak_vram_gib"] * GIB <= cap
        except torch.OutOfMemoryError as exc:
            row |= {"fits": False, "reason": f"OutOfMemoryError: {str(exc)[:200]}"}
        finally:
            pipe.remove_all_hooks()
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
            _free_gpu()
        out[f"{gb}GB"] = row
    return out


def generator_step(model: str, dry: bool):
    import numpy as np
    import torch

    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.diffusers_backend import DiffusersGenerator, component_bytes, place_pipeline
    from biasaudit.params.generate import GeneratorSpec
    from biasaudit.pipeline.provenance import derive_seed

    cuda = torch.cuda.is_available() and not dry
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    size, seq, batches, n = (64, 16, (1, 2), 2) if dry else (1024, 256, (1, 4), 4)
    free_before = torch.cuda.mem_get_info()[0] if cuda else None
    fullsize = _fullsize_module()
    with torch.device(device):  # built on the device: no CPU-RAM staging
        pipe = fullsize.build(model, device, dtype, dry)
    spec = GeneratorSpec(backend="diffusers", model_id=model, width=size, height=size, num_inference_steps=4,
                         guidance_scale=0.0, max_sequence_length=seq, dtype="bf16" if cuda else "fp32",
                         device="cuda" if cuda else "cpu", cpu_offload="auto" if cuda else "none",
                         batch_size=max(batches))
    memory = place_pipeline(pipe, spec, device, free_before)
    pipe.set_progress_bar_config(disable=True)
    sizes = component_bytes(pipe)
    gen = DiffusersGenerator.__new__(DiffusersGenerator)  # the stage's backend around the built pipeline
    gen.name, gen.model_id, gen.revision, gen.spec, gen.device = model, model, "random-weights", spec, device
    gen.pipe, gen.pipeline_class, gen.stand_in, gen.memory = pipe, type(pipe).__name__, True, memory
    prompts = [f"A person who works as a nurse, portrait {i}" for i in range(n)]
    seeds = [derive_seed("gpu-check", i) for i in range(n)]
    reqs = [GenRequest(f"i{i}", "p", prompts[i], i, seeds[i], size, size) for i in range(n)]
    runs = []
    for bs in batches:
        gen.generate(reqs[:bs])  # warm-up
        _free_gpu()
        ours: list = []

        def run(bs=bs, ours=ours):
            for s in range(0, n, bs):
                ours.extend(gen.generate(reqs[s:s + bs]))

        ips = _timed(run, n, cuda)
        peak = _peak_gib(cuda)
        _free_gpu()
        plain: list = []
        plain_ips = _timed(lambda bs=bs, plain=plain: plain.extend(_plain_loop(pipe, prompts, seeds, size, seq, bs)),
                           n, cuda)
        plain_peak = _peak_gib(cuda)
        same = [float(np.abs(r.rgb.astype(float) - np.clip(np.round(p * 255), 0, 255)).max())
                for r, p in zip(ours, plain) if r.status == "ok"]
        runs.append({"batch_size": bs, "images": n, "images_per_s": round(ips, 4), "peak_vram_gib": peak,
                     "plain_images_per_s": round(plain_ips, 4), "plain_peak_vram_gib": plain_peak,
                     "ratio_images_per_s": round(ips / plain_ips, 3),
                     "ratio_peak_vram": round(peak / plain_peak, 3) if cuda and plain_peak else None,
                     "max_abs_diff_vs_plain_same_seeds": max(same) if same else None,
                     "statuses": sorted({r.status + (f": {r.reason}" if r.reason else "") for r in ours})})
    capped = _capped_runs(gen, pipe, spec, reqs, cuda, sizes)
    return {"config_source": fullsize.SOURCES[model], "memory": memory,
            "components_gib": {k: round(v / GIB, 2) for k, v in sizes.items()}, "runs": runs, "caps": capped,
            "transformer_params": sum(p.numel() for p in pipe.transformer.parameters())}


def clip_step(dry: bool):
    import numpy as np
    import torch

    from biasaudit.faces.embeddings import ClipEmbedder

    cuda = torch.cuda.is_available() and not dry
    batches, n = ((2, 4), 8) if dry else ((16, 64, 128), 256)
    emb = ClipEmbedder("ViT-H-14", "tiny" if dry else "", device="cuda" if cuda else "cpu", batch_size=batches[0])
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(n)]
    runs, dim = [], None
    for bs in batches:
        emb.batch_size = bs
        emb.embed(images[:bs])  # warm-up
        _free_gpu()
        out: dict = {}
        ips = _timed(lambda out=out: out.setdefault("x", emb.embed(images)), n, cuda)
        dim = int(out["x"].shape[1])
        runs.append({"batch_size": bs, "images": n, "images_per_s": round(ips, 2), "peak_vram_gib": _peak_gib(cuda)})
    dtype = str(next(emb.model.parameters()).dtype)
    return {"model": emb.model_id, "config_source": "open_clip ViT-H-14.json (the architecture open_clip ships)",
            "dtype": dtype, "dim": dim, "runs": runs}


def insightface_step(dry: bool):
    import numpy as np
    import onnxruntime as ort

    import biasaudit.tiny.insightface as ti
    from biasaudit.faces.detect import InsightFaceDetector

    det_size = 256 if dry else 640  # the real SCRFD input side
    ti.DET_SIZE = det_size  # the stand-in is exported at this input shape
    root = ti.build_tiny_insightface(Path(tempfile.mkdtemp()) / f"insightface{det_size}")
    det = InsightFaceDetector(name=ti.TINY_PACK, root=str(root), det_size=det_size, stand_in=True,
                              device="cpu" if dry else "cuda")
    rng = np.random.default_rng(0)
    n = 4 if dry else 64
    images = [rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8) for _ in range(n)]
    det.detect(images[0])
    t = time.perf_counter()
    faces = sum(len(det.detect(rgb)) for rgb in images)
    per_s = n / (time.perf_counter() - t)
    sessions = [getattr(m, "session", None) for m in det.app.models.values()]
    return {"available_providers": ort.get_available_providers(), "device": det.device,
            "session_providers": [s.get_providers() for s in sessions if s is not None],
            "config_source": "SCRFD-shaped ONNX stand-in at the real 640² input (biasaudit.tiny.insightface)",
            "det_size": det_size, "images": n, "images_per_s": round(per_s, 2), "faces_per_image": faces / n,
            "note": "" if det.device.startswith("cuda") or dry else
            "onnxruntime has no CUDAExecutionProvider: make setup-gpu (onnxruntime-gpu in place of onnxruntime)"}


def face_parser_step(dry: bool):
    """BiSeNet (the face parser of faces.skin_method: bisenet) at its 512² input, random weights, batched."""
    import numpy as np
    import torch

    from biasaudit.faces.bisenet import INPUT_SIZE, BiSeNet, parse

    cuda = torch.cuda.is_available() and not dry
    device = "cuda" if cuda else "cpu"
    batches, n = ((1, 2), 4) if dry else ((1, 8, 32), 64)
    size = 64 if dry else INPUT_SIZE
    net = BiSeNet().to(device).eval()
    rng = np.random.default_rng(0)
    crops = [rng.integers(0, 256, (300, 300, 3), dtype=np.uint8) for _ in range(n)]
    runs = []
    for bs in batches:
        with torch.inference_mode():
            parse(net, crops[:bs], size)  # warm-up
        _free_gpu()

        def run(bs=bs):
            with torch.inference_mode():
                for s in range(0, n, bs):
                    parse(net, crops[s:s + bs], size)

        runs.append({"batch_size": bs, "images": n, "images_per_s": round(_timed(run, n, cuda), 2),
                     "peak_vram_gib": _peak_gib(cuda)})
    return {"config_source": "zllrunning/face-parsing.PyTorch model.py (BiSeNet, ResNet-18 context path, 19 classes)",
            "input_side": size, "device": device, "params": sum(p.numel() for p in net.parameters()), "runs": runs}


def vlm_step(dry: bool, tmp: Path):
    import numpy as np
    import torch
    from PIL import Image

    from biasaudit.backends.vlm.base import VLMRequest
    from biasaudit.backends.vlm.transformers_local import TransformersVLM
    from biasaudit.params import VLMSpec
    from biasaudit.tiny.vlm import make_tiny_qwen2_vl

    cuda = torch.cuda.is_available() and not dry
    model, processor = make_tiny_qwen2_vl()
    if not dry:  # the same classes at Qwen2-VL-2B size, random weights, built on the GPU
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor

        cfg = model.config.to_dict()
        cfg["text_config"].update(QWEN2_VL_2B["text"])
        cfg["vision_config"].update(QWEN2_VL_2B["vision"])
        with torch.device("cuda"):
            model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(**cfg)).to(torch.bfloat16).eval()
        processor.image_processor = Qwen2VLImageProcessor()
    spec = VLMSpec(backend="transformers", model_id="qwen2-vl-2b-architecture", device="cuda" if cuda else "cpu",
                   dtype="auto", local_batch_size=4, constrain=True)
    backend = TransformersVLM.from_objects(spec, model, processor, "random-weights")
    side = 64 if dry else 512
    paths = []
    for i, level in enumerate((60, 180)):
        p = tmp / f"face{i}.png"
        Image.fromarray(np.full((side, side, 3), level, np.uint8)).save(p)
        paths.append(str(p))
    req = VLMRequest(images=tuple(paths), prompt="Who is more likely to have the higher income? Answer A or B.",
                     options=("A", "B"), max_tokens=4, image_labels=("Image A:", "Image B:"))
    backend.generate([req])  # warm-up
    n = 4 if dry else 16
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out: list = []
    rps = _timed(lambda: out.extend(backend.generate([req] * n)), n, cuda)
    params = sum(p.numel() for p in backend.model.parameters())
    return {"params": params, "dtype": backend.dtype, "device": backend.device, "requests_per_s": round(rps, 3),
            "statuses": sorted({r.status for r in out}),
            "peak_vram_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if cuda else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: checks the script only")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu_check.json"))
    ap.add_argument("--steps", nargs="+", default=["sd35-large-turbo", "flux-schnell", "clip-vit-h-14",
                                                   "insightface", "face-parser", "vlm-2b"])
    args = ap.parse_args(argv)
    report = Report(Path(args.out), args.dry_run)
    tmp = Path(tempfile.mkdtemp())
    steps = {"sd35-large-turbo": lambda: generator_step("sd35-large-turbo", args.dry_run),
             "flux-schnell": lambda: generator_step("flux-schnell", args.dry_run),
             "clip-vit-h-14": lambda: clip_step(args.dry_run),
             "insightface": lambda: insightface_step(args.dry_run),
             "face-parser": lambda: face_parser_step(args.dry_run),
             "vlm-2b": lambda: vlm_step(args.dry_run, tmp)}
    for name in args.steps:
        report.step(name, steps[name])
    failed = [k for k, v in report.data["steps"].items() if v["status"] != "ok"]
    print(f"wrote {args.out}; {len(report.data['steps']) - len(failed)} ok, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent / "src"))
    sys.exit(main())
