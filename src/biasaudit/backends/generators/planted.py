"""`planted`: a PLANTED-truth "generator" for the offline profile, so the audit can be checked against truth.

Per prompt it knows the benchmark shares b (from the prompts table) and plants a declared distortion of
them: p_g = b_g · scale_g for the scaled groups, and the removed mass goes to one `receiver` group
(e.g. Black × 0.5, White + the difference). Each image then gets
  * a planted race label drawn from p (seeded by the image's seed),
  * a planted skin lightness L* and hue h drawn from that label's declared normal distributions,
  * pixels: one of the two real public-domain photos shipped in packages (skimage astronaut,
    matplotlib grace_hopper; see packaged_photos.py), seeded crop and flip, recoloured *inside its skin
    region* so that the mean sRGB colour of the photo's 68-landmark skin mask has L* = the planted L*
    (and hue ≈ the planted hue). The skin region is found with the project's own face code
    (biasaudit.faces.detect.landmarks68 + faces.segment) on the source photo.
The planted label, L* and hue go into the manifest (`planted_*` columns) and the PNG text chunk. Nothing
here is a model: the pixels carry no information about race (two people, recoloured), which is why the
SIMULATED classifier reads the planted label instead of looking. It exists so that the downstream
statistics (TVD, deviations, correction, L* per label, face loss) can be compared with known values.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.backends.generators.packaged_photos import SOURCES, Source, random_crop, source_rgb
from biasaudit.params.generate import GeneratorSpec, PlantedSpec
from biasaudit.registry import register

PLANTED = "PLANTED"
VERSION = "planted v1"


# ---------------------------------------------------------------- the planted distribution

def planted_distribution(bench: np.ndarray, scale: dict[str, float], receiver: str,
                         groups: tuple[str, ...]) -> np.ndarray:
    """Planted shares (…×G) from benchmark shares (…×G): scaled groups × their factor, the receiver
    gets the removed mass. Rows are renormalised first (benchmarks may not sum to exactly 1)."""
    b = np.asarray(bench, dtype=float)
    b = b / b.sum(axis=-1, keepdims=True)
    p = b.copy()
    for g, s in scale.items():
        p[..., groups.index(g)] *= s
    p[..., groups.index(receiver)] += 1.0 - p.sum(axis=-1)
    return p


def read_benchmarks(path: str | Path, groups: tuple[str, ...]) -> dict[str, np.ndarray]:
    """prompt_id → benchmark shares of `groups` from the prompts table (data/t2i/prompts.csv)."""
    import pandas as pd

    table = pd.read_csv(path, dtype={"prompt_id": str})
    missing = {"prompt_id", *groups} - set(table.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
    shares = table[list(groups)].to_numpy(float)
    return {pid: row for pid, row in zip(table["prompt_id"], shares) if np.isfinite(row).all() and row.sum() > 0}


def gender_benchmarks(path: str | Path, genders: tuple[str, ...]) -> dict[str, np.ndarray]:
    """prompt_id → benchmark shares of the gender labels: BLS Table 11's share of women (`pct_women`, a
    fraction) for an occupation, parity where the prompts table has none (t2i/analysis/gender.py reads the same)."""
    import pandas as pd

    table = pd.read_csv(path, dtype={"prompt_id": str})
    women = table["pct_women"].astype(float) if "pct_women" in table else pd.Series(np.nan, index=table.index)
    out = {}
    for pid, w in zip(table["prompt_id"], women):
        shares = np.full(len(genders), 1.0 / len(genders))
        if np.isfinite(w) and "woman" in genders and len(genders) == 2:
            shares[genders.index("woman")] = w
            shares[1 - genders.index("woman")] = 1.0 - w
        out[pid] = shares
    return out


def draw_gender(seed: int, bench: np.ndarray, spec: PlantedSpec, genders: tuple[str, ...]) -> tuple[str, np.ndarray]:
    """(planted gender, planted gender shares) of one image: the benchmark distorted by `gender_scale` (the
    removed mass to `gender_receiver`), drawn from its own stream of the image's seed, so the race label, L* and
    pixels stay what they are without gender."""
    p = planted_distribution(bench, dict(spec.gender_scale), spec.gender_receiver, genders)
    rng = np.random.default_rng([seed, 2])
    return genders[int(rng.choice(len(genders), p=p / p.sum()))], p


def draw_truth(rng: np.random.Generator, p: np.ndarray, spec: PlantedSpec,
               groups: tuple[str, ...]) -> tuple[str, float, float]:
    """(label, L*, hue) of one image: label ~ p, then L* ~ N(L_mean, L_sd) clipped to L_range and
    hue ~ N(hue_mean, hue_sd) of that label."""
    label = groups[int(rng.choice(len(groups), p=p / p.sum()))]
    lo, hi = spec.L_range
    L = float(np.clip(rng.normal(spec.L_mean[label], spec.L_sd[label]), lo, hi))
    hue = float(np.mod(rng.normal(spec.hue_mean[label], spec.hue_sd[label]), 360.0))
    return label, L, hue


# ---------------------------------------------------------------- the skin region of a source photo

@lru_cache(maxsize=None)
def source_regions(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(landmark skin mask, feathered recolouring weight in [0, 1]) of a packaged photo.

    The mask is what the faces stage measures (68-landmark polygon minus eyes, brows, mouth, nostrils).
    The recoloured region extends it to the connected skin-coloured pixels around it (forehead, ears,
    neck: ΔE76 < 20 from the mask's mean colour, inside the face box enlarged by 60%), so a darkened
    face is not framed by its old colour; the edge is feathered over a few pixels."""
    import cv2

    from biasaudit.faces.colour import srgb_to_lab
    from biasaudit.faces.detect import landmarks68
    from biasaudit.faces.segment import landmark_skin_from_landmarks

    src = next(s for s in SOURCES if s.name == name)
    rgb = source_rgb(name)
    h, w = rgb.shape[:2]
    lm = landmarks68(rgb, src.face_box)
    mask = landmark_skin_from_landmarks((h, w), lm)
    lab = srgb_to_lab(rgb)
    ref = lab[mask].mean(axis=0)
    near = np.linalg.norm(lab - ref, axis=-1) < 20.0
    l, t, r, b = src.face_box
    pad_x, pad_y = int(0.6 * (r - l)), int(0.6 * (b - t))
    box = np.zeros((h, w), bool)
    box[max(0, t - pad_y):min(h, b + pad_y), max(0, l - pad_x):min(w, r + pad_x)] = True
    cand = ((near & box) | mask).astype(np.uint8)
    k = max(3, int(0.03 * (r - l)) | 1)
    cand = cv2.morphologyEx(cand, cv2.MORPH_OPEN, np.ones((k, k), np.uint8))
    n, comp = cv2.connectedComponents(cand | mask.astype(np.uint8))
    keep = np.unique(comp[mask])
    region = np.isin(comp, keep[keep > 0]) | mask
    region = cv2.morphologyEx(region.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((k, k), np.uint8)).astype(bool)
    region |= cv2.dilate(mask.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    weight = cv2.GaussianBlur(region.astype(np.float32), (0, 0), sigmaX=1.5)
    weight[mask] = 1.0
    return mask, np.clip(weight, 0.0, 1.0)


def _recolour_lab(lab: np.ndarray, gamma: float, dh_deg: float) -> np.ndarray:
    """L' = 100·(L/100)^γ and the (a*, b*) plane rotated by dh degrees (per-pixel texture kept)."""
    out = lab.copy()
    out[..., 0] = 100.0 * np.clip(lab[..., 0] / 100.0, 1e-6, 1.0) ** gamma
    c, s = np.cos(np.radians(dh_deg)), np.sin(np.radians(dh_deg))
    out[..., 1] = c * lab[..., 1] - s * lab[..., 2]
    out[..., 2] = s * lab[..., 1] + c * lab[..., 2]
    return out


def _lab_to_rgb(lab: np.ndarray) -> np.ndarray:
    import warnings

    from skimage.color import lab2rgb

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # out-of-gamut colours clipped: expected when darkening
        return lab2rgb(lab) * 255.0


def recolour_skin(rgb: np.ndarray, mask: np.ndarray, weight: np.ndarray, target_L: float, target_hue: float,
                  tol: float = 0.05, max_iter: int = 50) -> tuple[np.ndarray, dict[str, float]]:
    """Recolour the weighted skin region so that the mean sRGB of `mask` has CIELAB L* = target_L (±tol;
    γ by bisection) and its hue is rotated onto target_hue. Pixels with weight 0 are untouched."""
    from biasaudit.faces.colour import describe_rgb, srgb_to_lab

    region = weight > 0
    ys, xs = np.nonzero(region)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    sub = rgb[y0:y1, x0:x1].astype(np.float64)
    wsub = weight[y0:y1, x0:x1, None]
    msub = mask[y0:y1, x0:x1]
    lab = srgb_to_lab(rgb[y0:y1, x0:x1])
    before = describe_rgb(sub[msub].mean(axis=0))
    dh = float(target_hue - before["h"])
    skin_lab, skin_rgb, skin_w = lab[msub], sub[msub], wsub[msub]

    def mean_colour(gamma: float, dh: float) -> dict[str, float]:
        new = _lab_to_rgb(_recolour_lab(skin_lab[None], gamma, dh))[0]
        return describe_rgb((skin_w * new + (1 - skin_w) * skin_rgb).mean(axis=0))

    def solve_gamma(dh: float) -> float:
        lo, hi, gamma = 0.05, 20.0, 1.0  # γ < 1 lightens, γ > 1 darkens
        for _ in range(max_iter):
            gamma = float(np.sqrt(lo * hi))
            got = mean_colour(gamma, dh)["L"]
            if abs(got - target_L) <= tol:
                break
            lo, hi = (gamma, hi) if got > target_L else (lo, gamma)
        return gamma

    gamma = solve_gamma(dh)
    for _ in range(3):  # gamut clipping moves the hue of the mean colour: correct the rotation, re-solve γ
        miss = (target_hue - mean_colour(gamma, dh)["h"] + 180.0) % 360.0 - 180.0
        if abs(miss) < 1.0:
            break
        dh += miss
        gamma = solve_gamma(dh)
    new = _lab_to_rgb(_recolour_lab(lab, gamma, dh))
    out = rgb.copy()
    out[y0:y1, x0:x1] = np.clip(np.round(wsub * new + (1 - wsub) * sub), 0, 255).astype(np.uint8)
    after = describe_rgb(out[y0:y1, x0:x1][msub].astype(np.float64).mean(axis=0))
    return out, {"gamma": round(gamma, 5), "hue_rotation": round(dh, 3), "source_L": round(before["L"], 3),
                 "source_hue": round(before["h"], 3), "source_mask_L": round(after["L"], 3),
                 "source_mask_hue": round(after["h"], 3), "source_mask_C": round(after["C"], 3)}


def render(seed: int, width: int, height: int, target_L: float, target_hue: float,
           max_crop_factor: float = 2.0) -> tuple[np.ndarray, dict[str, Any]]:
    """The image of one planted (L*, hue): a seeded source photo, crop and flip, skin recoloured."""
    from PIL import Image

    rng = np.random.default_rng([seed, 1])
    src: Source = SOURCES[int(rng.integers(len(SOURCES)))]
    rgb = source_rgb(src.name)
    mask, weight = source_regions(src.name)
    recoloured, info = recolour_skin(rgb, mask, weight, target_L, target_hue)
    face_side = max(src.face_box[2] - src.face_box[0], src.face_box[3] - src.face_box[1])
    x0, y0, c = random_crop(rng, src, rgb.shape[:2], int(max_crop_factor * face_side))
    crop = recoloured[y0:y0 + c, x0:x0 + c]
    flip = bool(rng.integers(2))
    if flip:
        crop = crop[:, ::-1]
    out = np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((width, height), Image.LANCZOS))
    return out, {"source_photo": src.name, "crop_xywh": [x0, y0, c, c], "flip": flip, **info}


@register("generator", "planted")
class PlantedGenerator(Generator):
    backend = "planted"
    stand_in = True
    cpu_bound = True  # numpy rendering: the local process pool helps
    reads = ("planted",)


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        """The revision carries the benchmark file's hash: changed benchmarks → a new planted truth."""
        from biasaudit.pipeline.provenance import sha256_file

        path = spec.planted.prompts_file  # type: ignore[union-attr]
        if not Path(path).is_file():
            return "", [f"{key}.planted.prompts_file: '{path}' does not exist (run the prompts stage)"]
        return f"{VERSION}; benchmarks sha256:{sha256_file(path)[:16]}", []
    def __init__(self, name: str, spec: GeneratorSpec, groups: tuple[str, ...] = (), genders: tuple[str, ...] = ()):
        import matplotlib
        import skimage

        assert spec.planted is not None
        if not groups:
            raise ValueError("the planted generator needs the active group set's labels (groups=cfg.groups)")
        self.spec, self.planted, self.groups = spec, spec.planted, tuple(groups)
        self.bench = read_benchmarks(self.planted.prompts_file, self.groups)
        self.genders = tuple(genders)
        self.gender_bench = gender_benchmarks(self.planted.prompts_file, self.genders) if self.genders else {}
        super().__init__(name, f"{PLANTED}: declared distortion of the benchmarks, rendered from two packaged "
                               "public-domain photos (not a model)",
                         f"{VERSION}; scikit-image {skimage.__version__}; matplotlib {matplotlib.__version__}")

    def settings(self) -> dict[str, Any]:
        return {"width": self.spec.width, "height": self.spec.height, "planted": self.planted.model_dump(),
                "note": f"{PLANTED}: labels and skin tones drawn from declared distributions; not a model"}

    def one(self, req: GenRequest) -> GenResult:
        bench = self.bench.get(req.prompt_id)
        if bench is None:
            return GenResult.failed(f"prompt {req.prompt_id} has no benchmark shares in {self.planted.prompts_file}")
        p = planted_distribution(bench, dict(self.planted.scale), self.planted.receiver, self.groups)
        label, L, hue = draw_truth(np.random.default_rng([req.seed, 0]), p, self.planted, self.groups)
        rgb, info = render(req.seed, req.width, req.height, L, hue, self.planted.max_crop_factor)
        gender = {}
        if self.genders:
            g, pg = draw_gender(req.seed, self.gender_bench[req.prompt_id], self.planted, self.genders)
            gender = {"planted_gender": g, "planted_gender_shares": [round(float(x), 6) for x in pg]}
        return GenResult(rgb, extra={"planted": PLANTED, "planted_label": label, "planted_L": round(L, 4),
                                     "planted_hue": round(hue, 4), "planted_C": info["source_mask_C"],
                                     "planted_shares": [round(float(x), 6) for x in p], **gender, **info})

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        out = []
        for req in requests:
            try:
                out.append(self.one(req))
            except Exception as exc:
                out.append(GenResult.failed(f"{type(exc).__name__}: {exc}"[:500]))
        return out
