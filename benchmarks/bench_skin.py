"""Skin-tone measurement: ours (dlib HOG + 68-landmark skin mask → mean sRGB → CIELAB) vs the
`skin-tone-classifier` package (stone: OpenCV Haar face + dominant colours → nearest palette colour,
PERLA and Monk palettes), on the same images; plus throughput of our landmark and BiSeNet paths.

Images: the two public-domain packaged photos (astronaut, Grace Hopper), each with its face region
darkened in linear light by factors spanning very dark to unchanged, so the true ordering of skin
tones within each person is known (darker factor → darker skin).

Reports: Spearman/Kendall agreement of the orderings (ours L* vs the known order, stone's L* and
palette index vs the known order and vs ours), speed ratio, and images/s for both of our paths
(the BiSeNet timing uses random weights of the real architecture: speed only, no accuracy).

    pip install --no-deps skin-tone-classifier==1.2.6   # its opencv-python 5 dependency breaks cv2
    python benchmarks/bench_skin.py [--factors 0.03 0.06 0.1 0.2 0.4 0.7 1.0] [--bisenet-images 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import skimage.data
from PIL import Image
from scipy.stats import kendalltau, spearmanr

from biasaudit.faces import colour, detect, segment
from biasaudit.pipeline.images import load_rgb


def darkened_set(factors: list[float], out_dir: Path) -> pd.DataFrame:
    photos = {"astronaut": skimage.data.astronaut(),
              "hopper": np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data/grace_hopper.jpg").convert("RGB"))}
    rows = []
    for person, rgb in photos.items():
        face = detect.DlibDetector().detect(rgb)[0]
        region = segment.face_region_from_landmarks(rgb.shape[:2], detect.landmarks68(rgb, face.bbox))
        region = segment.cv2.dilate(region.astype(np.uint8), np.ones((15, 15), np.uint8)).astype(bool)
        lin = (rgb / 255.0) ** 2.2
        for k in factors:
            img = rgb.copy()
            img[region] = np.round(255 * np.clip(lin[region] * k, 0, 1) ** (1 / 2.2))
            path = out_dir / f"{person}-{k:.2f}.png"
            Image.fromarray(img).save(path)
            rows.append({"person": person, "factor": k, "path": str(path)})
    return pd.DataFrame(rows)


def ours(path: str) -> float:
    loaded = load_rgb(path)
    mask, reason = segment.skin_mask(loaded.rgb)
    return float("nan") if mask is None else colour.describe_rgb(colour.mean_skin_rgb(loaded.rgb, mask))["L"]


def stone_measure(path: str, palette: str) -> tuple[float, float]:
    import stone
    from stone.image import DEFAULT_TONE_PALETTE

    res = stone.process(path, image_type="color", tone_palette=palette)
    if not res.get("faces"):
        return float("nan"), float("nan")
    f = res["faces"][0]
    hexes = [h.upper() for h in DEFAULT_TONE_PALETTE[palette]]
    tone = f["skin_tone"].upper()
    idx = hexes.index(tone) if tone in hexes else float("nan")
    rgb = np.array([int(f["skin_tone"][i:i + 2], 16) for i in (1, 3, 5)], float)
    return float(colour.describe_rgb(rgb)["L"]), idx


def agreement(a, b) -> str:
    m = ~(np.isnan(a) | np.isnan(b))
    if m.sum() < 3:
        return "n<3"
    return f"Spearman {spearmanr(a[m], b[m])[0]:+.2f}, Kendall {kendalltau(a[m], b[m])[0]:+.2f} (n={m.sum()})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factors", type=float, nargs="+", default=[0.03, 0.06, 0.1, 0.2, 0.4, 0.7, 1.0])
    ap.add_argument("--bisenet-images", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        df = darkened_set(args.factors, Path(tmp))
        ours(df["path"][0])  # warm up model loading
        t = time.perf_counter()
        df["ours_L"] = [ours(p) for p in df["path"]]
        t_ours = (time.perf_counter() - t) / len(df)
        t = time.perf_counter()
        for palette in ("perla", "monk"):
            res = [stone_measure(p, palette) for p in df["path"]]
            df[f"stone_{palette}_L"] = [r[0] for r in res]
            df[f"stone_{palette}_idx"] = [r[1] for r in res]
        t_stone = (time.perf_counter() - t) / (2 * len(df))
        pd.set_option("display.width", 160)
        print(df.drop(columns="path").round(2).to_string(index=False))
        truth = np.log(df["factor"].to_numpy())  # within a person, darker factor = darker skin
        print("\nOrdering agreement with the known order (pooled over both people):")
        print(f"  ours L*            : {agreement(df['ours_L'].to_numpy(), truth)}")
        for palette in ("perla", "monk"):
            print(f"  stone {palette:<5} L*     : {agreement(df[f'stone_{palette}_L'].to_numpy(), truth)}")
            sign = 1.0 if palette == "perla" else -1.0  # PERLA runs dark→light, Monk light→dark
            print(f"  stone {palette:<5} index  : {agreement(sign * df[f'stone_{palette}_idx'].to_numpy(dtype=float), truth)}")
            print(f"  ours vs stone {palette:<5}: {agreement(df['ours_L'].to_numpy(), df[f'stone_{palette}_L'].to_numpy())}")
        print(f"\nSpeed: ours {t_ours * 1e3:.0f} ms/image, stone {t_stone * 1e3:.0f} ms/image "
              f"→ ours is {t_stone / t_ours:.1f}× the speed of stone")
        print(f"Throughput, landmark path (detect + landmarks + mask + CIELAB, 512² images): {1 / t_ours:.1f} images/s")

        if args.bisenet_images > 0:
            import torch

            from biasaudit.faces.bisenet import BiSeNet

            net = BiSeNet().eval()  # random weights of the real architecture: timing only
            torch.set_num_threads(max(1, torch.get_num_threads()))
            rgbs = [load_rgb(p).rgb for p in df["path"][: args.bisenet_images]]
            boxes = [detect.DlibDetector().detect(r)[0].bbox for r in rgbs]
            segment.bisenet_masks(net, rgbs[0], [boxes[0]])
            t = time.perf_counter()
            for r, b in zip(rgbs, boxes):
                segment.bisenet_masks(net, r, [b])
            t_b = (time.perf_counter() - t) / len(rgbs)
            print(f"Throughput, BiSeNet path (512² parse of the face crop, CPU, {torch.get_num_threads()} threads; "
                  f"random weights, speed only): {1 / t_b:.2f} images/s ({t_b * 1e3:.0f} ms/image, excluding detection)")


if __name__ == "__main__":
    main()
