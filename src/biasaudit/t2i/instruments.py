"""Instrument bias by skin tone: how the packaged face detectors and the landmark skin mask behave as the
same real faces are recoloured from dark to light.

The sweep renders the two packaged public-domain photos (see backends/generators/planted.py) at target
skin lightness L* from `L_min` to `L_max`, several recolourings each (seeded source photo, crop, flip,
hue), in two modes:
  * `skin`: only the skin region recoloured (how the planted generator makes its images);
  * `whole`: the whole image darkened/lightened by one L* power curve (a dark face in a dark photo;
    packaged_photos.shift_lightness), the harder case for a gradient detector.
Every image has a known truth: the target L* (the mean sRGB colour of the source's 68-landmark skin mask
has exactly that L*), the true face box and the true skin mask in the output's pixels. Methods:
  * `dlib-hog`, `dlib-cnn` (MMOD, mmod_human_face_detector.dat): detection, score, and the L* measured by
    the landmark mask on the detected face (error against the target), mask area against the true one;
  * `landmarks68`: the 68-landmark skin mask on the TRUE face box (no detector): L* error, mask area, IoU;
  * `mediapipe-blazeface` / `mediapipe-facemesh` (faces.mediapipe_lite, LiteRT), when their models are
    available: the same detector measures, and the 468-point mesh skin mask on the true box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from biasaudit.faces.colour import describe_rgb

METHODS = ("dlib-hog", "dlib-cnn", "landmarks68", "mediapipe-blazeface", "mediapipe-facemesh")
MODES = ("skin", "whole")


@dataclass(frozen=True)
class Truth:
    target_L: float
    box: tuple[float, float, float, float]
    mask: np.ndarray
    source_photo: str


def _transform_mask(mask: np.ndarray, crop: tuple[int, int, int], flip: bool, size: int) -> np.ndarray:
    import cv2

    x0, y0, c = crop
    m = mask[y0:y0 + c, x0:x0 + c]
    if flip:
        m = m[:, ::-1]
    return cv2.resize(m.astype(np.uint8), (size, size), interpolation=cv2.INTER_NEAREST).astype(bool)


def _transform_box(box, crop: tuple[int, int, int], flip: bool, size: int) -> tuple[float, float, float, float]:
    x0, y0, c = crop
    k = size / c
    l, t, r, b = ((box[0] - x0) * k, (box[1] - y0) * k, (box[2] - x0) * k, (box[3] - y0) * k)
    if flip:
        l, r = size - r, size - l
    return (l, t, r, b)


def sweep_image(seed: int, target_L: float, mode: str, size: int, crop_factor: float, hue: float | None = None
                ) -> tuple[np.ndarray, Truth]:
    """One recoloured packaged photo at `target_L` and its truth (box, skin mask in output pixels)."""
    from PIL import Image

    from biasaudit.backends.generators.packaged_photos import SOURCES, random_crop, shift_lightness, source_rgb
    from biasaudit.backends.generators.planted import render, source_regions

    rng = np.random.default_rng([seed, 7])
    hue = float(rng.uniform(50, 64)) if hue is None else hue
    if mode == "skin":
        rgb, info = render(seed, size, size, target_L, hue, crop_factor)
        name, crop, flip = info["source_photo"], tuple(info["crop_xywh"][:3]), info["flip"]
    elif mode == "whole":
        src = SOURCES[int(rng.integers(len(SOURCES)))]
        name = src.name
        full = source_rgb(name)
        mask_full = source_regions(name)[0]
        side = max(src.face_box[2] - src.face_box[0], src.face_box[3] - src.face_box[1])
        crop = random_crop(rng, src, full.shape[:2], int(crop_factor * side))
        x0, y0, c = crop
        shifted, _ = shift_lightness(full[y0:y0 + c, x0:x0 + c], mask_full[y0:y0 + c, x0:x0 + c], target_L)
        flip = bool(rng.integers(2))
        if flip:
            shifted = shifted[:, ::-1]
        rgb = np.asarray(Image.fromarray(np.ascontiguousarray(shifted)).resize((size, size), Image.LANCZOS))
    else:
        raise ValueError(f"unknown sweep mode {mode!r} ({' | '.join(MODES)})")
    src = next(s for s in SOURCES if s.name == name)
    mask = _transform_mask(source_regions(name)[0], crop, flip, size)
    return rgb, Truth(float(target_L), _transform_box(src.face_box, crop, flip, size), mask, name)


def _mask_measures(rgb: np.ndarray, mask: np.ndarray, truth: Truth) -> dict[str, float]:
    area, true_area = int(mask.sum()), int(truth.mask.sum())
    out = {"mask_area": area, "mask_area_ratio": area / true_area if true_area else np.nan,
           "mask_iou": float((mask & truth.mask).sum() / max(1, (mask | truth.mask).sum()))}
    if area:
        L = describe_rgb(rgb[mask].reshape(-1, 3).astype(np.float64).mean(axis=0))["L"]
        return out | {"measured_L": L, "L_error": L - truth.target_L}
    return out | {"measured_L": np.nan, "L_error": np.nan}


def _measure(rgb: np.ndarray, box, truth: Truth) -> dict[str, float]:
    """The 68-landmark skin mask on `box`: area and IoU against the true mask, L* against the target."""
    from biasaudit.faces.detect import landmarks68
    from biasaudit.faces.segment import landmark_skin_from_landmarks

    return _mask_measures(rgb, landmark_skin_from_landmarks(rgb.shape[:2], landmarks68(rgb, box)), truth)


NO_MEASURE = {"mask_area": 0, "mask_area_ratio": np.nan, "mask_iou": np.nan, "measured_L": np.nan, "L_error": np.nan}


def box_iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def methods_status(hog_upsample: int = 1, cnn_upsample: int = 0, mediapipe_dir: str | None = None
                   ) -> tuple[dict[str, str], object]:
    """(status by method: what runs and why MediaPipe does not, MediaPipe model paths or None), without
    loading any model."""
    status = {"dlib-hog": f"ran (upsample {hog_upsample})", "dlib-cnn": f"ran (upsample {cnn_upsample})",
              "landmarks68": "ran on the true face box"}
    if mediapipe_dir is None:
        status["mediapipe"] = "off (instruments.mediapipe: false)"
        return status, None
    from biasaudit.faces import mediapipe_lite as mp

    paths, reason = mp.ensure_models(mediapipe_dir)
    if paths is None:
        status["mediapipe"] = f"not run: {reason}"
    else:
        status["mediapipe-blazeface"] = f"ran (LiteRT; {mp.model_revision(paths)})"
        status["mediapipe-facemesh"] = "ran on the true face box (LiteRT)"
    return status, paths


def load_methods(hog_upsample: int = 1, cnn_upsample: int = 0, mediapipe_dir: str | None = None
                 ) -> tuple[dict, object]:
    """(detectors by name, face mesh or None): the methods methods_status says run."""
    from biasaudit.faces.detect import DlibDetector

    _, paths = methods_status(hog_upsample, cnn_upsample, mediapipe_dir)
    detectors = {"dlib-hog": DlibDetector("hog", hog_upsample), "dlib-cnn": DlibDetector("cnn", cnn_upsample)}
    mesh = None
    if paths is not None:
        from biasaudit.faces import mediapipe_lite as mp

        detectors["mediapipe-blazeface"] = mp.BlazeFaceDetector(paths)
        mesh = mp.FaceMesh(paths)
    return detectors, mesh


def level_rows(detectors: dict, mesh, mode: str, L: float, recolourings: int, size: int, crop_factor: float,
               seed: int, min_box_iou: float) -> list[dict]:
    """The sweep rows of one mode × target L*: every method on every recolouring."""
    from biasaudit.pipeline.provenance import derive_seed

    rows = []
    for k in range(recolourings):
        s = derive_seed(seed, "instruments", k)  # the same photo, crop and hue at every L*: paired
        rgb, truth = sweep_image(s, L, mode, size, crop_factor)
        base = {"mode": mode, "target_L": float(L), "recolouring": k, "source_photo": truth.source_photo}
        for name, det in detectors.items():
            faces = det.detect(rgb)
            # a detection counts when it overlaps the true face (a badge or flag is not the face)
            hit = next((f for f in faces if box_iou(f.bbox, truth.box) >= min_box_iou), None)
            row = base | {"method": name, "detected": hit is not None, "n_faces": len(faces),
                          "score": hit.score if hit else np.nan}
            rows.append(row | (_measure(rgb, hit.bbox, truth) if hit else NO_MEASURE))
        rows.append(base | {"method": "landmarks68", "detected": np.nan, "n_faces": np.nan, "score": np.nan}
                    | _measure(rgb, truth.box, truth))
        if mesh is not None:
            from biasaudit.faces.mediapipe_lite import mesh_skin_mask

            pts, flag = mesh.landmarks(rgb, truth.box)
            rows.append(base | {"method": "mediapipe-facemesh", "detected": np.nan, "n_faces": np.nan,
                                "score": flag} | _mask_measures(rgb, mesh_skin_mask(rgb.shape[:2], pts), truth))
    return rows


def make_levels_fn(settings: dict):
    """The batch function (in this process, or built in each pool worker): items {order, mode, L} →
    {order, rows}."""
    detectors, mesh = load_methods(settings["hog_upsample"], settings["cnn_upsample"], settings["mediapipe_dir"])

    def fn(items: list[dict]) -> list[dict]:
        return [{"order": it["order"], "rows": level_rows(detectors, mesh, it["mode"], it["L"], settings["recolourings"],
                                                          settings["size"], settings["crop_factor"], settings["seed"],
                                                          settings["min_box_iou"])} for it in items]

    return fn


def run_sweep(levels: list[float], recolourings: int, modes: list[str], size: int = 160, crop_factor: float = 2.0,
              hog_upsample: int = 1, cnn_upsample: int = 0, seed: int = 0, min_box_iou: float = 0.3,
              mediapipe_dir: str | None = None, progress: bool = False, workers: int = 1) -> pd.DataFrame:
    """Raw sweep rows: one per method × mode × target L* × recolouring, in that order whatever `workers`
    (the mode × L* cells go to the local process pool, scale.pool, when workers > 1).
    `sweep.attrs['methods']` says which methods ran (and why MediaPipe did not, when it did not)."""
    from functools import partial

    settings = {"hog_upsample": hog_upsample, "cnn_upsample": cnn_upsample, "mediapipe_dir": mediapipe_dir,
                "recolourings": recolourings, "size": size, "crop_factor": crop_factor, "seed": seed,
                "min_box_iou": min_box_iou}
    items = [{"order": i, "mode": mode, "L": float(L)} for i, (mode, L) in
             enumerate((m, L) for m in modes for L in levels)]
    status = methods_status(hog_upsample, cnn_upsample, mediapipe_dir)[0]
    done: list[dict] = []
    if workers > 1 and len(items) > 1:
        from biasaudit.pipeline.scale.pool import run_pool

        run_pool([[it] for it in items], partial(make_levels_fn, settings), done.extend, workers,
                 preload=("biasaudit.t2i.instruments", "biasaudit.faces.preload_dlib"))
    else:
        fn = make_levels_fn(settings)
        for it in items:
            done += fn([it])
            if progress:
                print(f"{it['mode']} L*={it['L']:g} done", flush=True)
    sweep = pd.DataFrame([row for rec in sorted(done, key=lambda r: r["order"]) for row in rec["rows"]])
    sweep.attrs["methods"] = status
    return sweep


MASK_METHODS = ("landmarks68", "mediapipe-facemesh")


def summarize(sweep: pd.DataFrame, thresholds: list[float] = (0.0,)) -> pd.DataFrame:
    """Per method × mode × target L*: detection rate (and the rate if scores were cut at each threshold),
    mean score, L* error and mask area against the truth. Mask-only methods have no detection rate."""
    sw = sweep.assign(**{f"detected_at_{t:g}": sweep["detected"].astype(float) * (sweep["score"] >= t)
                         for t in thresholds})
    g = sw.groupby(["method", "mode", "target_L"], sort=True)
    out = g.agg(n=("recolouring", "size"), detection_rate=("detected", lambda s: s.astype(float).mean()),
                **{f"detection_rate_at_{t:g}": (f"detected_at_{t:g}", "mean") for t in thresholds},
                mean_score=("score", "mean"), mean_L_error=("L_error", "mean"),
                mean_abs_L_error=("L_error", lambda s: s.abs().mean()), mask_area_ratio=("mask_area_ratio", "mean"),
                mask_iou=("mask_iou", "mean")).reset_index()
    rate_cols = [c for c in out.columns if c.startswith("detection_rate")]
    out.loc[out["method"].isin(MASK_METHODS), rate_cols] = np.nan
    return out


def dark_rates(summary: pd.DataFrame, dark_max: float = 25.0) -> pd.DataFrame:
    """Detection rate and mean score per detector and mode at target L* ≤ dark_max vs above."""
    det = summary[~summary["method"].isin(MASK_METHODS)].assign(dark=lambda d: d["target_L"] <= dark_max)
    rate_cols = [c for c in det.columns if c.startswith("detection_rate")]
    out = det.groupby(["method", "mode", "dark"]).apply(
        lambda d: pd.Series({**{c: float((d[c] * d["n"]).sum() / d["n"].sum()) for c in rate_cols},
                             "mean_score": float(d["mean_score"].mean()),
                             "mean_abs_L_error": float(d["mean_abs_L_error"].mean())}),
        include_groups=False).reset_index()
    out["L_range"] = np.where(out["dark"], f"L*<={dark_max:g}", f"L*>{dark_max:g}")
    return out.drop(columns="dark")
