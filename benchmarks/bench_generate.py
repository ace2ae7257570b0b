"""Generation throughput: the stage's batched tiny pipelines vs a plain per-image diffusers loop.

Both sides run the same random-weight SD3 / Flux pipelines (real diffusers classes, built offline by
biasaudit.tiny.diffusion) on the CPU at the offline profile's size, with the same per-image seeds.
The baseline is the loop most scripts write: `pipe(prompt, generator=torch.Generator().manual_seed(s))`
once per image. Ours is `DiffusersGenerator.generate` over batches of --batch-size requests (one
pipeline call per batch, one seeded generator per image). Prints images/s of each and the ratio.
Throughput of stand-ins says nothing about the real models; see gpu_generate_fullsize.py for those.

    python benchmarks/bench_generate.py [--images 32] [--batch-size 8] [--size 64] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--archs", nargs="+", default=["sd3", "flux"])
    args = ap.parse_args()

    import torch

    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.diffusers_backend import make_tiny
    from biasaudit.params.generate import GeneratorSpec
    from biasaudit.pipeline.provenance import derive_seed

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    prompts = [f"A person who works as worker number {i}, photorealistic portrait" for i in range(args.images)]
    with tempfile.TemporaryDirectory() as root:
        for arch in args.archs:
            spec = GeneratorSpec(backend="tiny", architecture=arch, width=args.size, height=args.size,
                                 num_inference_steps=args.steps, max_sequence_length=32, device="cpu", dtype="fp32",
                                 batch_size=args.batch_size)
            gen = make_tiny(f"tiny-{arch}", spec, root)
            reqs = [GenRequest(f"i{i}", "p", p, i, derive_seed("bench", i), args.size, args.size)
                    for i, p in enumerate(prompts)]
            gen.generate(reqs[:2])  # warm-up (first call allocates)

            t = time.perf_counter()
            for r in reqs:  # baseline: one pipeline call per image
                with torch.inference_mode():
                    gen.pipe(r.prompt, height=r.height, width=r.width, num_inference_steps=args.steps,
                             guidance_scale=0.0, max_sequence_length=32,
                             generator=torch.Generator("cpu").manual_seed(r.seed), output_type="np")
            base = time.perf_counter() - t

            t = time.perf_counter()
            for s in range(0, len(reqs), args.batch_size):
                results = gen.generate(reqs[s:s + args.batch_size])
                assert all(res.status == "ok" for res in results)
            ours = time.perf_counter() - t
            print(f"tiny-{arch} {args.size}²×{args.steps} steps, {args.images} images, CPU threads "
                  f"{torch.get_num_threads()}: per-image loop {args.images / base:.1f} img/s, "
                  f"batched (bs={args.batch_size}) {args.images / ours:.1f} img/s, ratio {base / ours:.2f}×")


if __name__ == "__main__":
    main()
