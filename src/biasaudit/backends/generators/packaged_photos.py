"""`packaged-photos`: a stand-in "generator" of real faces for the offline profile.

It ignores the prompt and returns a seeded variant of one of the two public-domain face photos that
ship in packages (scikit-image's astronaut, matplotlib's grace_hopper): a random crop that keeps the
whole face, an optional mirror flip, and a skin-tone shift that moves the mean L* of a reference skin
patch (both cheeks) to a target drawn uniformly from [l_min, l_max] (default 25–75: dark to light).
The shift is a power curve on CIELAB L* (L' = 100·(L/100)^γ, a, b kept), so black stays black, white
stays white and the target is hit exactly at the patch. Everything it makes is labelled stand-in:
it lets the face, skin and embedding stages measure real faces offline, and the recorded target L*
lets them check their measurements; it says nothing about any generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.params.generate import GeneratorSpec
from biasaudit.registry import register

L_RANGE = (25.0, 75.0)
PATCH = 7  # half-size of each square cheek patch (pixels in the source photo)


@dataclass(frozen=True)
class Source:
    name: str
    face_box: tuple[int, int, int, int]  # left, top, right, bottom: dlib HOG detection (tests check it)
    cheeks: tuple[tuple[int, int], ...]  # (x, y) centres of the skin reference patches (68-point landmarks)


SOURCES = (
    Source("astronaut", (175, 76, 265, 166), ((193, 120), (255, 123))),
    Source("grace_hopper", (180, 139, 366, 325), ((209, 230), (325, 225))),
)


@lru_cache(maxsize=None)
def source_rgb(name: str) -> np.ndarray:
    if name == "astronaut":
        import skimage.data

        return skimage.data.astronaut()
    if name == "grace_hopper":
        import matplotlib.cbook
        from PIL import Image

        with Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg")) as img:
            return np.asarray(img.convert("RGB"))
    raise ValueError(f"unknown packaged photo '{name}'")


def patch_mask(shape: tuple[int, int], centres, half: int = PATCH) -> np.ndarray:
    mask = np.zeros(shape, dtype=bool)
    for x, y in centres:
        mask[max(0, y - half):y + half + 1, max(0, x - half):x + half + 1] = True
    return mask


def mean_lab(rgb: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of the mean sRGB colour under `mask` (the same definition the faces stage uses)."""
    from skimage.color import rgb2lab

    mean_rgb = rgb[mask].reshape(-1, 3).astype(np.float64).mean(axis=0) / 255.0
    return rgb2lab(mean_rgb[None, None, :])[0, 0]


def _apply_gamma(lab: np.ndarray, gamma: float) -> np.ndarray:
    """CIELAB → uint8 sRGB after L' = 100·(L/100)^γ (a*, b* kept; out-of-gamut colours clipped)."""
    import warnings

    from skimage.color import lab2rgb

    out = lab.copy()
    out[..., 0] = 100.0 * np.clip(lab[..., 0] / 100.0, 1e-6, 1.0) ** gamma
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "negative Z values clipped": expected when darkening
        return np.clip(np.round(lab2rgb(out) * 255.0), 0, 255).astype(np.uint8)


def shift_lightness(rgb: np.ndarray, mask: np.ndarray, target_l: float, tol: float = 0.05,
                    max_iter: int = 40) -> tuple[np.ndarray, float]:
    """Apply L' = 100·(L/100)^γ to the whole image, γ found by bisection (on the patch pixels only)
    so that the mean colour of the masked pixels has L* = target_l (±tol). Returns (uint8 image, γ)."""
    from skimage.color import rgb2lab

    lab = rgb2lab(rgb)
    patch = lab[mask][None]  # 1×n×3
    lo, hi = 0.05, 20.0  # γ < 1 lightens, γ > 1 darkens
    gamma = 1.0
    for _ in range(max_iter):
        gamma = float(np.sqrt(lo * hi))
        shifted = _apply_gamma(patch, gamma)[0]
        got = mean_lab(shifted[None], np.ones((1, len(shifted)), dtype=bool))[0]
        if abs(got - target_l) <= tol:
            break
        if got > target_l:
            lo = gamma
        else:
            hi = gamma
    return _apply_gamma(lab, gamma), gamma


def random_crop(rng: np.random.Generator, src: Source, shape: tuple[int, int], max_side: int | None = None
                ) -> tuple[int, int, int]:
    """(x0, y0, side) of a seeded square crop that contains the face box with a 15% margin; its side is
    at most `max_side` (default: the photo's shorter side)."""
    h, w = shape
    l, t, r, b = src.face_box
    margin = int(0.15 * (r - l))
    c_min = max(r - l, b - t) + 2 * margin
    c = int(rng.integers(c_min, max(c_min, min(h, w, max_side or min(h, w))) + 1))
    x0 = int(rng.integers(max(0, r + margin - c), min(l - margin, w - c) + 1))
    y0 = int(rng.integers(max(0, b + margin - c), min(t - margin, h - c) + 1))
    return x0, y0, c


def make_variant(seed: int, width: int, height: int, l_range: tuple[float, float] = L_RANGE
                 ) -> tuple[np.ndarray, dict[str, Any]]:
    """The seeded variant: (H×W×3 uint8, what was done)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    src = SOURCES[int(rng.integers(len(SOURCES)))]
    rgb = source_rgb(src.name)
    x0, y0, c = random_crop(rng, src, rgb.shape[:2])
    crop = rgb[y0:y0 + c, x0:x0 + c]
    cheeks = tuple((x - x0, y - y0) for x, y in src.cheeks)
    flip = bool(rng.integers(2))
    target = float(rng.uniform(*l_range))
    mask = patch_mask(crop.shape[:2], cheeks)
    before = float(mean_lab(crop, mask)[0])
    shifted, gamma = shift_lightness(crop, mask, target)
    if flip:
        shifted = shifted[:, ::-1]
    out = np.asarray(Image.fromarray(np.ascontiguousarray(shifted)).resize((width, height), Image.LANCZOS))
    info = {"source_photo": src.name, "crop_xywh": [x0, y0, c, c], "flip": flip, "target_L": round(target, 3),
            "source_patch_L": round(before, 3), "gamma": round(gamma, 5)}
    return out, info


@register("generator", "packaged-photos")
class PackagedPhotosGenerator(Generator):
    backend = "packaged-photos"
    stand_in = True


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        import matplotlib
        import skimage

        return f"scikit-image {skimage.__version__}; matplotlib {matplotlib.__version__}; variants v1", []
    def __init__(self, name: str, spec: GeneratorSpec):
        import matplotlib
        import skimage

        super().__init__(name, "packaged-photos: skimage astronaut + matplotlib grace_hopper (public domain)",
                         f"scikit-image {skimage.__version__}; matplotlib {matplotlib.__version__}; variants v1")
        self.spec = spec

    def settings(self) -> dict[str, Any]:
        return {"width": self.spec.width, "height": self.spec.height, "l_range": list(L_RANGE), "variants": "v1",
                "note": "stand-in: seeded variants of two real photos; the prompt is ignored"}

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        out = []
        for req in requests:
            try:
                rgb, info = make_variant(req.seed, req.width, req.height)
                out.append(GenResult(rgb, extra=info))
            except Exception as exc:
                out.append(GenResult.failed(f"{type(exc).__name__}: {exc}"))
        return out
