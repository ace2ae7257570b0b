"""Per-image stages, local runner vs the Ray runner on this machine: images/s and their ratio.

Each stage runs through its real entry point (`run_generate`, `run_classify`, `run_faces`) in a fresh
temporary workspace, once with `execution.runner: local` and once with `ray` (a local Ray instance,
--workers actors of one CPU each), on the same images: generate with the tiny SD3 stand-in,
classify with the tiny Qwen2-VL stand-in, faces with dlib (HOG + landmarks + face descriptor, real
packaged models) and the tiny CLIP on packaged-photos images. Ray's time includes starting its actors
and loading one model copy per actor (what a user waits for); its own start-up (`ray.init`) is timed
separately. The ratio is Ray images/s ÷ local images/s: on a 2-core machine expect ≤ 1 (the local
runner already uses both cores through torch/BLAS threads); the point of Ray is more machines and GPUs.

    python benchmarks/bench_scale.py [--images 16] [--workers 2] [--out bench_scale.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def config(runner: str, workers: int, images_per_prompt: int, models: dict):
    from biasaudit.config import read_yaml, validate

    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = models
    raw["generate"] = {**raw["generate"], "images_per_prompt": images_per_prompt, "limit": 0}
    raw["classify"] = {**raw["classify"], "batch_size": 4, "limit": 0,
                       "vlm": {**raw["classify"]["vlm"], "backend": "tiny", "model_id": "tiny-qwen2-vl",
                               "api_key_env": "", "batch_mode": False}}
    raw["faces"] = {**raw["faces"], "detector": "dlib", "skin_method": "landmarks", "face_embedding": "dlib",
                    "clip_pretrained": "tiny", "batch_size": 4, "device": "cpu", "limit": 0}
    raw["execution"] = {"runner": runner, "shard_index": 0, "shard_count": 1,
                        "ray": {"address": "", "num_workers": workers, "num_cpus_per_worker": 1.0,
                                "num_gpus_per_worker": 0.0}}
    return validate(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=16, help="images per stage (even)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import pandas as pd
    import ray

    from biasaudit.faces.stage import run_faces
    from biasaudit.t2i.classify import run_classify
    from biasaudit.t2i.generate import run_generate

    per_prompt = 2
    n_prompts = max(1, args.images // per_prompt)
    models = {
        "tiny-sd3": {"backend": "tiny", "architecture": "sd3", "width": 64, "height": 64, "num_inference_steps": 2,
                     "max_sequence_length": 32, "device": "cpu", "dtype": "fp32", "batch_size": 4},
        "packaged-photos": {"backend": "packaged-photos", "width": 256, "height": 256},
    }
    stages = [("generate (tiny-sd3)", "generate", "tiny-sd3"), ("classify (tiny Qwen2-VL)", "classify", "tiny-sd3"),
              ("faces (dlib + tiny CLIP)", "faces", "packaged-photos")]
    home = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    tiny = home / "models"
    (tiny / "tiny").mkdir(parents=True)
    os.environ["BIASAUDIT_TINY_DIR"] = str(tiny / "tiny")
    here = os.getcwd()
    times: dict[str, dict[str, float]] = {}
    ray_init_s = 0.0
    try:
        for runner in ("local", "ray"):
            ws = home / runner
            (ws / "data/t2i").mkdir(parents=True)
            (ws / "models").symlink_to(tiny, target_is_directory=True)
            pd.DataFrame({"prompt_id": [f"occ_p{i}" for i in range(n_prompts)], "template_version": "v1",
                          "prompt": [f"A person who works as job {i}" for i in range(n_prompts)]}
                         ).to_csv(ws / "data/t2i/prompts.csv", index=False)
            os.chdir(ws)
            cfg = config(runner, args.workers, per_prompt, models)
            if runner == "ray":
                t = time.perf_counter()
                ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
                ray_init_s = time.perf_counter() - t
            else:  # build the tiny weights once, outside the timings (both runners then only load them)
                from biasaudit.backends.vlm import make_vlm_backend
                from biasaudit.tiny.diffusion import ensure_tiny_pipeline

                ensure_tiny_pipeline("sd3")
                make_vlm_backend(cfg.classify.vlm, cfg.groups)
            # the inputs of classify and faces come from generate; untimed
            run_generate("packaged-photos", cfg, progress=False)
            for label, stage, model in stages:
                t = time.perf_counter()
                if stage == "generate":
                    n = run_generate(model, cfg, progress=False).summary["this_run"]["processed"]
                elif stage == "classify":
                    n = run_classify(model, cfg, progress=False)["summary"].processed
                else:
                    n = run_faces(model, cfg, progress=False)["summary"].processed
                elapsed = time.perf_counter() - t
                times.setdefault(label, {})[runner] = n / elapsed
                print(f"{label:28s} {runner:5s}: {n} images in {elapsed:6.1f} s = {n / elapsed:6.2f} images/s",
                      flush=True)
    finally:
        os.chdir(here)
        if ray.is_initialized():
            ray.shutdown()
    print(f"\nray.init: {ray_init_s:.1f} s (once per run, not in the rates); {os.cpu_count()} CPUs, "
          f"{args.workers} Ray actors × 1 CPU")
    rows = []
    for label, r in times.items():
        ratio = r["ray"] / r["local"]
        rows.append({"stage": label, "local_images_per_s": round(r["local"], 3), "ray_images_per_s": round(r["ray"], 3),
                     "ray_over_local": round(ratio, 2)})
        print(f"{label:28s} Ray / local = {ratio:.2f}×")
    if args.out:
        Path(args.out).write_text(json.dumps({"images": args.images, "workers": args.workers, "cpus": os.cpu_count(),
                                              "ray_init_s": round(ray_init_s, 1), "stages": rows}, indent=2))


if __name__ == "__main__":
    main()
