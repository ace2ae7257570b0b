"""Throughput of the real SD 3.5 Large (Turbo) and FLUX.1-schnell architectures at full size, on a GPU.

No weights are downloaded: the pipelines are the real diffusers classes built from the published
configs (transformer, VAE, CLIP-L/CLIP-G/T5-XXL text encoders) with random weights, which cost the
same FLOPs and memory as the trained ones. Tokenizers are in-memory stand-ins that pad to the same
lengths (CLIP 77, T5 --max-seq-len), so text encoding costs the same too. For each model it measures
images/s at 1024² with the published settings (4 steps, guidance 0), for a per-image loop and for
batched calls through the stage's backend, optionally with torch.compile, and projects the wall time
of the paper's 150 prompts × 100 images. Results are printed and written as JSON.

    python benchmarks/gpu_generate_fullsize.py [--models sd35-large-turbo flux-schnell] [--batch-sizes 1 4 8]
        [--images 16] [--compile] [--out bench_gpu.json]
    python benchmarks/gpu_generate_fullsize.py --smoke   # tiny layer counts on CPU: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Published architecture configs (config.json of each hub repo's subfolders), committed here: the numbers
# of each come from the file named in SOURCES.
SOURCES = {
    "sd35-large-turbo": "stabilityai/stable-diffusion-3.5-large-turbo: transformer/config.json, vae/config.json, "
                        "text_encoder{,_2,_3}/config.json (CLIP-L, OpenCLIP bigG, T5-XXL v1.1 encoder)",
    "flux-schnell": "black-forest-labs/FLUX.1-schnell: transformer/config.json, vae/config.json, "
                    "text_encoder/config.json (CLIP-L), text_encoder_2/config.json (T5-XXL v1.1 encoder)",
}
SD35_LARGE = {
    "transformer": dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                        num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                        pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm"),
    "vae": dict(latent_channels=16, scaling_factor=1.5305, shift_factor=0.0609),
}
FLUX_SCHNELL = {
    "transformer": dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                        guidance_embeds=False, axes_dims_rope=(16, 56, 56)),
    "vae": dict(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159),
}
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12, projection_dim=768,
              hidden_act="quick_gelu")
CLIP_G = dict(hidden_size=1280, intermediate_size=5120, num_attention_heads=20, num_hidden_layers=32,
              projection_dim=1280, hidden_act="gelu")
T5_XXL = dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, feed_forward_proj="gated-gelu",
              vocab_size=32128)


def shrink(cfg: dict, smoke: bool, **small) -> dict:
    return {**cfg, **small} if smoke else cfg


def build(model: str, device: str, dtype, smoke: bool):
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from biasaudit.tiny.diffusion import _clip_tokenizer, _t5_tokenizer

    clip_tok, t5_tok = _clip_tokenizer(), _t5_tokenizer()
    small_text = dict(num_hidden_layers=1) if smoke else {}

    def clip(cfg, cls):
        c = CLIPTextConfig(vocab_size=49408, bos_token_id=0, eos_token_id=1, pad_token_id=2,
                           max_position_embeddings=77, **{**cfg, **small_text})
        return cls(c)

    t5 = T5EncoderModel(T5Config(**shrink(T5_XXL, smoke, num_layers=1, d_model=64, d_ff=128, num_heads=2, d_kv=32),
                                 pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    spec = SD35_LARGE if model == "sd35-large-turbo" else FLUX_SCHNELL
    vae_blocks = (128, 256, 512, 512) if not smoke else (8, 8, 8, 8)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=vae_blocks, layers_per_block=2,
                        norm_num_groups=32 if not smoke else 4, use_quant_conv=False, use_post_quant_conv=False,
                        **spec["vae"])
    if model == "sd35-large-turbo":
        tcfg = shrink(spec["transformer"], smoke, num_layers=1, num_attention_heads=2, joint_attention_dim=64,
                      caption_projection_dim=128, attention_head_dim=64)
        pipe = StableDiffusion3Pipeline(
            transformer=SD3Transformer2DModel(**tcfg), vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
            text_encoder=clip(CLIP_L, CLIPTextModelWithProjection), text_encoder_2=clip(CLIP_G, CLIPTextModelWithProjection),
            text_encoder_3=t5, tokenizer=clip_tok, tokenizer_2=clip_tok, tokenizer_3=t5_tok)
    else:
        tcfg = shrink(spec["transformer"], smoke, num_layers=1, num_single_layers=1, num_attention_heads=2,
                      joint_attention_dim=64)
        pipe = FluxPipeline(transformer=FluxTransformer2DModel(**tcfg), vae=vae,
                            scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=False),
                            text_encoder=clip(CLIP_L, CLIPTextModel), text_encoder_2=t5, tokenizer=clip_tok,
                            tokenizer_2=t5_tok)
    return pipe.to(device=device, dtype=dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["sd35-large-turbo", "flux-schnell"])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny layer counts, 64², CPU: check the script only")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_gpu_generate.json"))
    args = ap.parse_args()

    import torch

    from biasaudit.backends.generators.base import GenRequest
    from biasaudit.backends.generators.diffusers_backend import DiffusersGenerator
    from biasaudit.params.generate import GeneratorSpec
    from biasaudit.pipeline.provenance import derive_seed, library_versions

    if args.smoke:
        args.size, args.images, args.batch_sizes, args.max_seq_len = 64, 2, [1, 2], 16
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "smoke": args.smoke,
               "size": args.size, "steps": args.steps, "libraries": library_versions(), "runs": []}
    for model in args.models:
        t0 = time.perf_counter()
        with torch.device(device):
            pipe = build(model, device, dtype, args.smoke)
        build_s = time.perf_counter() - t0
        n_params = sum(p.numel() for p in pipe.transformer.parameters())
        spec = GeneratorSpec(backend="diffusers", model_id=model, width=args.size, height=args.size,
                             num_inference_steps=args.steps, guidance_scale=0.0, max_sequence_length=args.max_seq_len,
                             dtype="bf16" if dtype == torch.bfloat16 else "fp32", device=device)
        gen = DiffusersGenerator.__new__(DiffusersGenerator)  # wrap the built pipeline in the stage's backend
        gen.name, gen.model_id, gen.revision, gen.spec, gen.device = model, model, "random-weights", spec, device
        gen.pipe, gen.pipeline_class, gen.stand_in = pipe, type(pipe).__name__, True
        pipe.set_progress_bar_config(disable=True)
        if args.compile:
            pipe.transformer = torch.compile(pipe.transformer)
        reqs = [GenRequest(f"i{i}", "p", f"A person who works as worker {i}, photorealistic portrait", i,
                           derive_seed("gpu-bench", i), args.size, args.size) for i in range(args.images)]
        for bs in args.batch_sizes:
            gen.generate(reqs[:bs])  # warm-up (and compilation)
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            for s in range(0, len(reqs), bs):
                out = gen.generate(reqs[s:s + bs])
                bad = [r.reason for r in out if r.status != "ok"]
                assert not bad, bad[:1]
            if device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t
            ips = len(reqs) / elapsed
            row = {"model": model, "transformer_params": n_params, "batch_size": bs, "compile": args.compile,
                   "images": len(reqs), "seconds": round(elapsed, 3), "images_per_s": round(ips, 4),
                   "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
                   "paper_15000_images_h": round(15000 / ips / 3600, 2), "build_s": round(build_s, 1)}
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
        for bs in args.batch_sizes[1:]:
            base = next(r for r in results["runs"] if r["model"] == model and r["batch_size"] == args.batch_sizes[0])
            cur = next(r for r in results["runs"] if r["model"] == model and r["batch_size"] == bs)
            print(f"{model}: batch {bs} vs {args.batch_sizes[0]}: {cur['images_per_s'] / base['images_per_s']:.2f}×")
        del pipe, gen
        if device == "cuda":
            torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
