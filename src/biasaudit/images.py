"""Load any image file as 8-bit sRGB, upright (EXIF orientation applied), or say why not. Bad input
is a reason, never a crash."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULT_MAX_PIXELS = 64_000_000  # decompression-bomb guard (8000×8000)
DEFAULT_MIN_SIDE = 32


@dataclass(frozen=True)
class Loaded:
    rgb: np.ndarray | None  # H×W×3 uint8, or None when unusable
    reason: str = ""  # why unusable ('' when fine)
    note: str = ""  # what was converted (e.g. 'CMYK→RGB'), for provenance

    @property
    def ok(self) -> bool:
        return self.rgb is not None


def _to_rgb(img: Image.Image) -> tuple[np.ndarray, str]:
    mode = img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        scale = 65535.0 if arr.max() > 255 else 255.0
        arr8 = np.clip(np.round(arr / scale * 255.0), 0, 255).astype(np.uint8)
        return np.repeat(arr8[..., None], 3, axis=2), f"{mode}→8-bit gray"
    if mode == "F":
        raise ValueError("floating-point image")
    if mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in img.info):
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float64)
        alpha = rgba[..., 3:4] / 255.0
        if alpha.min() < 1.0:
            # Composite on white so transparent pixels never pass as dark skin.
            rgb = rgba[..., :3] * alpha + 255.0 * (1 - alpha)
            return np.round(rgb).astype(np.uint8), f"{mode}: alpha composited on white"
        return rgba[..., :3].astype(np.uint8), f"{mode}: opaque alpha dropped"
    if mode == "RGB":
        return np.asarray(img, dtype=np.uint8), ""
    return np.asarray(img.convert("RGB"), dtype=np.uint8), f"{mode}→RGB"


def load_rgb(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, min_side: int = DEFAULT_MIN_SIDE) -> Loaded:
    path = Path(path)
    if not path.is_file():
        return Loaded(None, "missing file")
    try:
        with Image.open(path) as img:
            width, height = img.size
            if width * height > max_pixels:
                return Loaded(None, f"too large: {width}×{height} exceeds {max_pixels:,} pixels")
            if min(width, height) < min_side:
                return Loaded(None, f"too small: {width}×{height} (minimum side {min_side})")
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img.load()
            if getattr(img, "n_frames", 1) > 1:
                img.seek(0)
            orientation = img.getexif().get(0x0112, 1)  # EXIF Orientation: how the camera was held
            if orientation not in (1, None):
                img = ImageOps.exif_transpose(img)
            rgb, note = _to_rgb(img)
            if orientation not in (1, None):
                note = "; ".join(x for x in (f"EXIF orientation {orientation} applied", note) if x)
    except UnidentifiedImageError:
        return Loaded(None, "not an image")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return Loaded(None, f"unreadable image: {type(exc).__name__}: {exc}")
    return Loaded(np.ascontiguousarray(rgb), "", note)
