"""GPU check of the paper profile's local models through our own backends, with random weights of the
real architectures at full size (cost and memory do not depend on the weights; nothing is downloaded).

Steps (each recorded with its status, so one failure does not hide the others; JSON rewritten after each):
  sd35-large-turbo, flux-schnell  1024², 4 steps, guidance 0, T5 256 tokens: images/s at batch 1 and 4,
                                  peak VRAM, the cpu_offload choice `auto` makes here (and for 24/48/80 GB
                                  cards from the measured component sizes)
  clip-vit-h-14                   open_clip ViT-H-14 in fp16 through ClipEmbedder: images/s batched
  insightface                     SCRFD-shaped ONNX stand-in at the real 640² input + ArcFace 112²,
                                  through InsightFaceDetector: the providers it got, faces/s
  vlm-2b                          Qwen2-VL-2B architecture (bf16) through TransformersVLM: a 2AFC request
                                  (two 512² images, labels interleaved), requests/s

    bash benchmarks/gpu_check.sh [--out gpu_check.json]   # on a GPU box, < 10 min
    bash benchmarks/gpu_check.sh --dry-run                # tiny sizes on the CPU (the tests run this)
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
CARDS_GB = (24, 48, 80)

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

        from biasaudit.provenance import library_versions

        self.path = path
        self.data = {"dry_run": dry_run, "stand_in": "random weights of the real architectures",
                     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                     "libraries": library_versions(), "steps": {}}
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            self.data["gpu_total_gib"] = round(total / GIB, 2)

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


def generator_step(model: str, dry: bool):
    import torch

    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.diffusers_backend import (
        DiffusersGenerator,
        activation_bytes,
        choose_offload,
        component_bytes,
        place_pipeline,
    )
    from biasaudit.params.generate import GeneratorSpec
    from biasaudit.provenance import derive_seed

    cuda = torch.cuda.is_available() and not dry
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    size, seq, batches, n = (64, 16, (1, 2), 2) if dry else (1024, 256, (1, 4), 8)
    free_before = torch.cuda.mem_get_info()[0] if cuda else None
    with torch.device(device):
        pipe = _fullsize_module().build(model, device, dtype, dry)
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
    reqs = [GenRequest(f"i{i}", "p", f"A person who works as a nurse, portrait {i}", i, derive_seed("gpu-check", i),
                       size, size) for i in range(n)]
    runs = []
    for bs in batches:
        gen.generate(reqs[:bs])  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        statuses: list[str] = []

        def run(bs=bs, statuses=statuses):
            for s in range(0, n, bs):
                statuses.extend(r.status + (f": {r.reason}" if r.reason else "") for r in gen.generate(reqs[s:s + bs]))

        ips = _timed(run, n, cuda)
        runs.append({"batch_size": bs, "images": n, "images_per_s": round(ips, 4),
                     "peak_vram_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if cuda else None,
                     "statuses": sorted(set(statuses))})
    per_card = {f"{gb}GB": {f"batch {bs}": choose_offload(int(gb * 1e9 * 0.97), sizes, activation_bytes(1024, 1024, bs))
                            for bs in (1, 4)} for gb in CARDS_GB}
    return {"memory": memory, "components_gib": {k: round(v / GIB, 2) for k, v in sizes.items()},
            "offload_by_card": per_card, "runs": runs,
            "transformer_params": sum(p.numel() for p in pipe.transformer.parameters())}


def clip_step(dry: bool):
    import numpy as np
    import torch

    from biasaudit.faces.embeddings import ClipEmbedder

    cuda = torch.cuda.is_available() and not dry
    emb = ClipEmbedder("ViT-H-14", "tiny" if dry else "", device="cuda" if cuda else "cpu",
                       batch_size=4 if dry else 64)
    n = 8 if dry else 256
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (256, 256, 3), dtype=np.uint8) for _ in range(n)]
    emb.embed(images[: emb.batch_size])  # warm-up
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out: dict = {}
    ips = _timed(lambda: out.setdefault("x", emb.embed(images)), n, cuda)
    dtype = str(next(emb.model.parameters()).dtype)
    return {"model": emb.model_id, "dtype": dtype, "batch_size": emb.batch_size, "images_per_s": round(ips, 2),
            "dim": int(out["x"].shape[1]), "peak_vram_gib": round(torch.cuda.max_memory_allocated() / GIB, 2) if cuda else None}


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
    rgb = np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    det.detect(rgb)
    n = 4 if dry else 64
    t = time.perf_counter()
    faces = sum(len(det.detect(rgb)) for _ in range(n))
    per_s = n / (time.perf_counter() - t)
    sessions = [getattr(m, "session", None) for m in det.app.models.values()]
    return {"available_providers": ort.get_available_providers(), "device": det.device,
            "session_providers": [s.get_providers() for s in sessions if s is not None],
            "det_size": det_size, "images_per_s": round(per_s, 2), "faces_per_image": faces / n,
            "note": "" if det.device.startswith("cuda") or dry else
            "onnxruntime has no CUDAExecutionProvider: install onnxruntime-gpu (same version) in place of onnxruntime"}


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
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    ap.add_argument("--steps", nargs="+", default=["sd35-large-turbo", "flux-schnell", "clip-vit-h-14",
                                                   "insightface", "vlm-2b"])
    args = ap.parse_args(argv)
    report = Report(Path(args.out), args.dry_run)
    tmp = Path(tempfile.mkdtemp())
    steps = {"sd35-large-turbo": lambda: generator_step("sd35-large-turbo", args.dry_run),
             "flux-schnell": lambda: generator_step("flux-schnell", args.dry_run),
             "clip-vit-h-14": lambda: clip_step(args.dry_run),
             "insightface": lambda: insightface_step(args.dry_run),
             "vlm-2b": lambda: vlm_step(args.dry_run, tmp)}
    for name in args.steps:
        report.step(name, steps[name])
    failed = [k for k, v in report.data["steps"].items() if v["status"] != "ok"]
    print(f"wrote {args.out}; {len(report.data['steps']) - len(failed)} ok, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent / "src"))
    sys.exit(main())
