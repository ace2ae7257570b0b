"""Skin colour in CIELAB (D65, 2° observer) with scikit-image: L*, a*, b*, C*, hue, ITA, ΔE2000.

Definitions (docs/architecture.md, as the paper): mean sRGB over skin pixels → CIE XYZ (D65) → CIELAB; C* = √(a²+b²);
h = atan2(b, a) in degrees [0, 360); ITA = atan2(L*−50, b)·180/π; L* bins <40, [40,55), [55,70), ≥70.
The mean is taken in sRGB (as the paper does), then converted once.
"""

from __future__ import annotations

import numpy as np
from skimage.color import deltaE_ciede2000, rgb2lab

from biasaudit.contracts import L_BIN_EDGES, L_BIN_LABELS, l_bin  # noqa: F401  (the one definition)


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (…×3; uint8 0–255 or float 0–1) → CIELAB (…×3, float64), D65 illuminant, 2° observer."""
    arr = np.asarray(rgb)
    if arr.shape[-1] != 3:
        raise ValueError(f"expected a last axis of 3 channels, got shape {arr.shape}")
    if np.issubdtype(arr.dtype, np.integer):
        arr = arr.astype(np.float64) / 255.0
    else:
        arr = arr.astype(np.float64)
    if arr.size and (arr.min() < 0 or arr.max() > 1):
        raise ValueError("float sRGB values must lie in [0, 1]")
    return rgb2lab(arr, illuminant="D65", observer="2", channel_axis=-1)


def chroma(lab: np.ndarray) -> np.ndarray:
    lab = np.asarray(lab, dtype=np.float64)
    return np.hypot(lab[..., 1], lab[..., 2])


def wrap_degrees(angle: np.ndarray) -> np.ndarray:
    """Angles mapped into [0, 360). np.mod alone returns 360.0 for a tiny negative angle
    (−1e-14 % 360 rounds to 360.0), which is outside the range."""
    h = np.mod(np.asarray(angle, dtype=np.float64), 360.0)
    return np.where(h >= 360.0, 0.0, h)


def hue_degrees(lab: np.ndarray) -> np.ndarray:
    """CIELAB hue angle h_ab = atan2(b*, a*) in degrees, in [0, 360)."""
    lab = np.asarray(lab, dtype=np.float64)
    return wrap_degrees(np.degrees(np.arctan2(lab[..., 2], lab[..., 1])))


def ita_degrees(lab: np.ndarray) -> np.ndarray:
    """Individual Typology Angle ITA = atan2(L* − 50, b*) in degrees (−90, 90] for b* ≥ 0."""
    lab = np.asarray(lab, dtype=np.float64)
    return np.degrees(np.arctan2(lab[..., 0] - 50.0, lab[..., 2]))



def delta_e2000(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """CIEDE2000 colour difference (kL = kC = kH = 1) from scikit-image, broadcast over rows."""
    return deltaE_ciede2000(np.asarray(lab1, dtype=np.float64), np.asarray(lab2, dtype=np.float64),
                            channel_axis=-1)


def describe_rgb(mean_rgb: np.ndarray) -> dict[str, float | str]:
    """All colour columns of the faces table for one mean sRGB colour (0–255 floats)."""
    mean_rgb = np.asarray(mean_rgb, dtype=np.float64)
    lab = srgb_to_lab(np.clip(mean_rgb / 255.0, 0.0, 1.0))
    return {
        "mean_r": float(mean_rgb[0]), "mean_g": float(mean_rgb[1]), "mean_b": float(mean_rgb[2]),
        "L": float(lab[0]), "a": float(lab[1]), "b": float(lab[2]),
        "C": float(chroma(lab)), "h": float(hue_degrees(lab)), "ita": float(ita_degrees(lab)),
        "L_bin": str(l_bin(lab[0])[0]),
    }


# A colour reading needs colour: an image whose pixels are (nearly) gray, or skin pixels without
# chroma, would give C* ≈ 0 and ITA ≈ ±90°, a skin tone of nobody. Grayscale: 99% of the image's pixels
# have channels within GRAY_SPREAD of each other (JPEG noise on a gray photo stays below it).
# Near-achromatic skin: the median per-pixel C* of the skin pixels below MIN_SKIN_CHROMA (measured skin
# of every tone has C* well above it: the darkest Monk/Fitzpatrick swatches sit near 10–20).
GRAY_SPREAD = 6
MIN_SKIN_CHROMA = 4.0


def achromatic_reason(rgb: np.ndarray, mask: np.ndarray | None = None) -> str:
    """Why no skin tone can be read from this image (grayscale, or near-achromatic skin), or ''."""
    arr = np.asarray(rgb)
    spread = arr.max(axis=-1).astype(np.int16) - arr.min(axis=-1).astype(np.int16)
    if np.percentile(spread, 99) <= GRAY_SPREAD:
        return f"grayscale image (99% of pixels within {GRAY_SPREAD} levels across R, G, B): no skin tone"
    if mask is not None:
        pixels = arr[np.asarray(mask, dtype=bool)]
        if len(pixels):
            c = float(np.median(chroma(srgb_to_lab(pixels.reshape(-1, 3)))))
            if c < MIN_SKIN_CHROMA:
                return f"near-achromatic skin (median C* {c:.1f} < {MIN_SKIN_CHROMA}): no skin tone"
    return ""


def mean_skin_rgb(rgb: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean sRGB (0–255 float64) of the pixels where `mask` is True."""
    pixels = np.asarray(rgb)[np.asarray(mask, dtype=bool)]
    if pixels.size == 0:
        raise ValueError("empty skin mask")
    return pixels.reshape(-1, 3).astype(np.float64).mean(axis=0)
