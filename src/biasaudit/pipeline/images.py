"""Load any image file as 8-bit sRGB, upright (EXIF orientation applied), or say why not. Bad input
is a reason, never a crash.

With a pixel budget (`max_side`), an image whose longer side exceeds it is decoded small and resized to
that side before any array is made: a JPEG decodes at 1/2, 1/4 or 1/8 size in the DCT (PIL's
`draft`), so its full-size pixels never exist; other formats decode once at full size inside PIL
(at most `max_pixels` × 4 bytes) and are resized there, never widened to float. `Loaded.scale` says
by how much (1.0 = as stored)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

DEFAULT_MAX_PIXELS = 64_000_000  # decompression-bomb guard (8000×8000)
DEFAULT_MIN_SIDE = 32


@dataclass(frozen=True)
class Loaded:
    rgb: np.ndarray | None  # H×W×3 uint8, or None when unusable
    reason: str = ""  # why unusable ('' when fine)
    note: str = ""  # what was converted (e.g. 'CMYK→RGB'), for provenance
    scale: float = 1.0  # working size / stored size (longer sides) under a pixel budget; 1.0 = as stored

    @property
    def ok(self) -> bool:
        return self.rgb is not None


def _has_alpha(img: Image.Image) -> bool:
    return img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info)


def _to_rgb(img: Image.Image, stored: str = "") -> tuple[np.ndarray, str]:
    """8-bit RGB and what was converted; `stored` is the file's mode when `_shrink` changed it."""
    mode, stored = img.mode, stored or img.mode
    if mode in ("I;16", "I;16B", "I;16L", "I"):
        arr = np.asarray(img, dtype=np.float64)
        scale = 65535.0 if arr.max() > 255 else 255.0
        arr8 = np.clip(np.round(arr / scale * 255.0), 0, 255).astype(np.uint8)
        return np.repeat(arr8[..., None], 3, axis=2), f"{stored}→8-bit gray"
    if mode == "F":
        raise ValueError("floating-point image")
    if _has_alpha(img):
        rgba = np.asarray(img.convert("RGBA"), dtype=np.float64)
        alpha = rgba[..., 3:4] / 255.0
        if alpha.min() < 1.0:
            # Composite on white so transparent pixels never pass as dark skin.
            rgb = rgba[..., :3] * alpha + 255.0 * (1 - alpha)
            return np.round(rgb).astype(np.uint8), f"{stored}: alpha composited on white"
        return rgba[..., :3].astype(np.uint8), f"{stored}: opaque alpha dropped"
    if mode == "RGB":
        return np.asarray(img, dtype=np.uint8), "" if stored == "RGB" else f"{stored}→RGB"
    return np.asarray(img.convert("RGB"), dtype=np.uint8), f"{stored}→RGB"


# modes PIL resizes with a real filter, keeping what _to_rgb reads (16-bit gray becomes 32-bit I)
_RESIZABLE = {"L": "L", "LA": "LA", "RGB": "RGB", "RGBA": "RGBA", "CMYK": "CMYK", "I": "I", "F": "F",
              "I;16": "I", "I;16B": "I", "I;16L": "I", "1": "L"}


def _shrink(img: Image.Image, size: tuple[int, int]) -> Image.Image:
    """`img` resized to `size` in PIL (alpha premultiplied by PIL, palettes expanded first)."""
    mode = _RESIZABLE.get(img.mode) or ("RGBA" if _has_alpha(img) else "RGB")
    if img.mode != mode:
        img = img.convert(mode)
    return img.resize(size, Image.Resampling.LANCZOS, reducing_gap=2.0)


def working_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size an image of `width`×`height` is measured at under a pixel budget of `max_side` (the
    longer side; 0 = no budget): the stored size when it fits, else scaled down to fit."""
    if max_side <= 0 or max(width, height) <= max_side:
        return width, height
    f = max_side / max(width, height)
    return max(1, round(width * f)), max(1, round(height * f))


_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}  # EXIF orientation → the transposition that makes it upright


def load_rgb(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS, min_side: int = DEFAULT_MIN_SIDE,
             max_side: int = 0) -> Loaded:
    """The image at `path` as upright 8-bit sRGB, or why not; `max_side` > 0 is a pixel budget: the
    longer side it is measured at (see the module docstring)."""
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
            target = working_size(width, height, max_side)
            if target != (width, height) and img.format == "JPEG":
                img.draft(None, target)  # DCT scaling: decodes at the smallest 1/2^k size ≥ target
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                img.load()
            if getattr(img, "n_frames", 1) > 1:
                img.seek(0)
            orientation = img.getexif().get(0x0112, 1)  # EXIF Orientation: how the camera was held
            stored = img.mode
            if img.size != target:
                img = _shrink(img, target)
            if orientation in _TRANSPOSE:
                img = img.transpose(_TRANSPOSE[orientation])
            rgb, note = _to_rgb(img, stored)
            if orientation not in (1, None):
                note = "; ".join(x for x in (f"EXIF orientation {orientation} applied", note) if x)
    except UnidentifiedImageError:
        return Loaded(None, "not an image")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        return Loaded(None, f"unreadable image: {type(exc).__name__}: {exc}")
    return Loaded(np.ascontiguousarray(rgb), "", note, max(target) / max(width, height))
