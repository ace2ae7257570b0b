"""What a full paper run costs: GPU-hours per generator and API dollars, from one command.

Sizes come from profiles/paper.yaml (prompts × images per prompt per model; Method B photos ×
10 counterfactuals); prices from the price table in params.yaml (`classify.prices`: USD per million
tokens for Gemini 2.5 Flash, USD per image for Imagen 4 Fast and Gemini 2.5 Flash Image — all
ESTIMATES from list prices; check current pricing). Seconds per image on a GPU come from a
`benchmarks/gpu_generate_fullsize.py` result (--gpu-json, measured on random weights of the real
architectures at 1024², which cost the same FLOPs as the trained ones); without one, the script uses
the ASSUMED values below and says so on every line. CPU-side faces work (dlib) can be measured here
with --measure-faces.

    python benchmarks/cost_model.py [--gpu-json bench_gpu_generate.json] [--measure-faces]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ASSUMED seconds per 1024² image (4 steps, bf16, batch 4) on one H100/H200-class GPU, used only when no
# gpu_generate_fullsize.py result is given. Order-of-magnitude guesses, not measurements.
ASSUMED_GPU_S_PER_IMAGE = {"sd35-large-turbo": 1.0, "flux-schnell": 0.8}
ASSUMED_CLIP_GPU_S_PER_IMAGE = 0.01  # ViT-H-14 image embedding at batch 64 (assumed)
# Tokens per classification request (assumed): one image ≤ 768 px = 258 tokens in Gemini 2.x, plus the
# ~60-token instruction; a one-word answer with thinking off.
ASSUMED_TOKENS_IN, ASSUMED_TOKENS_OUT = 320, 2
COUNTERFACTUAL_GROUPS = 10  # 5 races × 2 genders per source photo


def paper_sizes() -> dict:
    from biasaudit.config import read_yaml

    paper = read_yaml(ROOT / "profiles/paper.yaml")
    base = read_yaml(ROOT / "params.yaml")
    top_k = paper.get("prompts.top_k", base["prompts"]["top_k"])
    categories = paper.get("prompts.categories", base["prompts"]["categories"])
    n_groups = 5  # prompts are chosen per racial group and category (top_k each)
    photos = len(paper.get("sources.occupations", [])) * paper.get("sources.photos_per_occupation", 1)
    return {"prompts": top_k * n_groups * len(categories),
            "images_per_prompt": paper.get("generate.images_per_prompt", base["generate"]["images_per_prompt"]),
            "models": paper["models"], "photos": photos, "vlms": list(paper.get("vlms", {})),
            "classifier": paper.get("classify.vlm.model_id", base["classify"]["vlm"]["model_id"])}


def gpu_seconds(gpu_json: str | None) -> tuple[dict[str, float], str, set[str]]:
    """(seconds per image per model, where they come from, the models actually measured)."""
    if not gpu_json:
        return dict(ASSUMED_GPU_S_PER_IMAGE), "ASSUMED (no gpu_generate_fullsize.py result given)", set()
    runs = json.loads(Path(gpu_json).read_text())["runs"]
    best: dict[str, float] = {}
    for r in runs:
        best[r["model"]] = min(best.get(r["model"], float("inf")), 1.0 / r["images_per_s"])
    return {**ASSUMED_GPU_S_PER_IMAGE, **best}, f"MEASURED where listed ({gpu_json}; best batch size)", set(best)


def faces_seconds_per_image(n: int = 8) -> float:
    """dlib HOG detection + 68 landmarks + 128-d descriptor + CIELAB on 512² packaged photos, here."""
    import numpy as np

    from biasaudit.backends.generators.packaged_photos import make_variant
    from biasaudit.faces.stage import FaceMeasurer
    from biasaudit.params.faces import Faces

    measurer = FaceMeasurer(Faces(clip_pretrained="tiny", device="cpu"))
    images = [make_variant(s, 512, 512)[0] for s in range(n)]
    measurer.measure(images[0])
    t = time.perf_counter()
    for rgb in images:
        measurer.measure(np.ascontiguousarray(rgb))
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-json", default=None, help="output of benchmarks/gpu_generate_fullsize.py")
    ap.add_argument("--measure-faces", action="store_true", help="time the dlib faces pass on this machine")
    ap.add_argument("--gpu-usd-per-hour", type=float, default=0.0, help="optional: price one GPU-hour")
    args = ap.parse_args()

    from biasaudit.config import load_params

    cfg = load_params(ROOT / "params.yaml")
    prices = cfg.classify.prices
    size = paper_sizes()
    per_model = size["prompts"] * size["images_per_prompt"]
    total_images = per_model * len(size["models"])
    gpu_s, gpu_source, measured = gpu_seconds(args.gpu_json)
    print(f"Paper run: {size['prompts']} prompts × {size['images_per_prompt']} images × {len(size['models'])} models "
          f"= {total_images:,} images; Method B: {size['photos']} photos × {COUNTERFACTUAL_GROUPS} edits\n")
    print(f"GPU time per image: {gpu_source}")
    total_gpu_h, total_usd = 0.0, 0.0
    for name, spec in size["models"].items():
        if spec["backend"] == "diffusers":
            s = gpu_s.get(name)
            label = "MEASURED" if name in measured else "ASSUMED"
            hours = per_model * s / 3600
            total_gpu_h += hours
            print(f"  generate@{name:18s} {per_model:6,} images × {s:.2f} s = {hours:6.2f} GPU-h  [{label}]")
        else:
            price = prices.get(spec["model_id"])
            usd = per_model * price.per_image if price else float("nan")
            total_usd += usd if price else 0.0
            print(f"  generate@{name:18s} {per_model:6,} images × ${price.per_image if price else float('nan'):.3f}"
                  f" = ${usd:8.2f} API  [price table: estimate]")
    clip_h = total_images * ASSUMED_CLIP_GPU_S_PER_IMAGE / 3600
    total_gpu_h += clip_h
    print(f"  faces (CLIP ViT-H-14)      {total_images:6,} images × {ASSUMED_CLIP_GPU_S_PER_IMAGE:.2f} s = "
          f"{clip_h:6.2f} GPU-h  [ASSUMED]")
    if args.measure_faces:
        fs = faces_seconds_per_image()
        print(f"  faces (dlib, CPU)          {total_images:6,} images × {fs:.3f} s = "
              f"{total_images * fs / 3600:6.2f} CPU-core-h  [MEASURED here, {os.cpu_count()} cores]")

    price = prices.get(size["classifier"])
    print("\nAPI cost (prices from params.yaml classify.prices — estimates):")
    if price:
        per_call = (ASSUMED_TOKENS_IN * price.input_per_mtok + ASSUMED_TOKENS_OUT * price.output_per_mtok) / 1e6
        usd = total_images * per_call
        total_usd += usd
        print(f"  classify ({size['classifier']}) {total_images:,} calls × ~{ASSUMED_TOKENS_IN} in / "
              f"{ASSUMED_TOKENS_OUT} out tokens [ASSUMED tokens] = ${usd:.2f} online, "
              f"${usd * price.batch_discount:.2f} in batch mode")
    edit_model = cfg.counterfactuals.model_id
    paper_edit = "gemini-2.5-flash-image"
    edit_price = prices.get(paper_edit) or prices.get(edit_model)
    if edit_price:
        edits = size["photos"] * COUNTERFACTUAL_GROUPS
        usd = edits * edit_price.per_image
        total_usd += usd
        print(f"  counterfactuals ({paper_edit}) {edits} edits × ${edit_price.per_image:.3f} = ${usd:.2f}")
    print(f"  REFLECT ({', '.join(size['vlms'])}): priced per VLM only where the price table has the model "
          f"({', '.join(v for v in size['vlms'] if v in prices) or 'none listed'})")
    print(f"\nTotal: {total_gpu_h:.1f} GPU-hours"
          + (f" (${total_gpu_h * args.gpu_usd_per_hour:,.2f} at ${args.gpu_usd_per_hour}/h)" if args.gpu_usd_per_hour else "")
          + f"; ${total_usd:,.2f} API (estimate)")


if __name__ == "__main__":
    main()
