"""Skin and face-region masks: BiSeNet face parsing (skin = class 1) or the 68-landmark polygon.

`landmarks` skin mask = the face polygon (jaw line up to the eyebrows) minus eyes, brows, mouth
and nostrils. Optional removal of specular highlights and deep shadows by L* percentiles inside the
mask (off by default, as in the paper). `face_region_mask` (whole face incl. eyes/brows/mouth) is the
mask Method B uses to restrict counterfactual edits and to check them.
"""

from __future__ import annotations

import cv2
import numpy as np

from biasaudit.faces.colour import srgb_to_lab

JAW = list(range(0, 17))
BROW_R, BROW_L = list(range(17, 22)), list(range(22, 27))
NOSTRILS = list(range(31, 36))
EYE_R, EYE_L = list(range(36, 42)), list(range(42, 48))
MOUTH = list(range(48, 60))


def _fill(shape: tuple[int, int], pts: np.ndarray) -> np.ndarray:
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [np.round(pts).astype(np.int32).reshape(-1, 1, 2)], 1)
    return mask


def face_polygon(lm: np.ndarray) -> np.ndarray:
    """Jaw line (0→16) closed over the top of the eyebrows (26→17): the face region polygon."""
    return np.concatenate([lm[JAW], lm[BROW_L][::-1], lm[BROW_R][::-1]])


def _face_width(lm: np.ndarray) -> float:
    return float(np.linalg.norm(lm[16] - lm[0])) or 1.0


def face_region_from_landmarks(shape: tuple[int, int], lm: np.ndarray) -> np.ndarray:
    return _fill(shape, face_polygon(lm)).astype(bool)


def landmark_skin_from_landmarks(shape: tuple[int, int], lm: np.ndarray) -> np.ndarray:
    """Face polygon minus (slightly dilated) eyes, brows, mouth and nostrils."""
    face = _fill(shape, face_polygon(lm))
    holes = np.zeros(shape, np.uint8)
    width = _face_width(lm)
    for part in (EYE_R, EYE_L, MOUTH):
        cv2.fillPoly(holes, [np.round(lm[part]).astype(np.int32).reshape(-1, 1, 2)], 1)
    cv2.fillPoly(holes, [cv2.convexHull(np.round(lm[NOSTRILS + [30]]).astype(np.int32))], 1)
    thick = max(2, int(round(0.06 * width)))
    for brow in (BROW_R, BROW_L):
        cv2.polylines(holes, [np.round(lm[brow]).astype(np.int32).reshape(-1, 1, 2)], False, 1, thickness=thick)
    pad = max(1, int(round(0.02 * width)))
    holes = cv2.dilate(holes, np.ones((2 * pad + 1, 2 * pad + 1), np.uint8))
    return (face.astype(bool)) & ~holes.astype(bool)


def remove_extremes(rgb: np.ndarray, mask: np.ndarray, low_pct: float = 0.0, high_pct: float = 100.0) -> np.ndarray:
    """Drop mask pixels whose L* is below the `low_pct` or above the `high_pct` percentile (shadows,
    specular highlights). (0, 100) returns the mask unchanged."""
    if low_pct <= 0 and high_pct >= 100:
        return mask
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return mask
    L = srgb_to_lab(rgb.reshape(-1, 3)[idx])[:, 0]
    lo, hi = np.percentile(L, [low_pct, high_pct])
    out = np.zeros(mask.size, bool)
    out[idx[(L >= lo) & (L <= hi)]] = True
    return out.reshape(mask.shape)


def crop_box(bbox: tuple[float, float, float, float], shape: tuple[int, int], margin: float = 0.5) -> tuple[int, int, int, int]:
    """A square box around the face, enlarged by `margin` of its size on each side, clipped to the image."""
    x0, y0, x1, y1 = bbox
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    half = max(x1 - x0, y1 - y0) * (0.5 + margin)
    h, w = shape
    return (max(0, int(cx - half)), max(0, int(cy - half)), min(w, int(np.ceil(cx + half))), min(h, int(np.ceil(cy + half))))


def bisenet_masks(net, rgb: np.ndarray, bboxes: list[tuple[float, float, float, float]], margin: float = 0.5,
                  classes: tuple[int, ...] | None = None) -> list[np.ndarray]:
    """Full-image masks of the given BiSeNet classes (None: skin) for each face box, parsed in a batch."""
    from biasaudit.faces.bisenet import SKIN_CLASS, parse

    classes = (SKIN_CLASS,) if classes is None else classes
    boxes = [crop_box(b, rgb.shape[:2], margin) for b in bboxes]
    crops = [rgb[y0:y1, x0:x1] for x0, y0, x1, y1 in boxes]
    out = []
    for (x0, y0, x1, y1), lab in zip(boxes, parse(net, crops)):
        mask = np.zeros(rgb.shape[:2], bool)
        mask[y0:y1, x0:x1] = np.isin(lab, classes)
        out.append(mask)
    return out


def _largest_face_landmarks(rgb: np.ndarray, detector: str) -> tuple[np.ndarray | None, str]:
    from biasaudit.faces.detect import landmarks68, make_detector

    faces = make_detector(detector).detect(rgb)
    if not faces:
        return None, "no face detected"
    return landmarks68(rgb, faces[0].bbox), ""


def not_rgb(rgb: np.ndarray) -> str:
    """Why `rgb` is not an H×W×3 uint8 RGB image, or '' when it is."""
    ok = rgb.ndim == 3 and rgb.shape[2] == 3 and rgb.dtype == np.uint8
    return "" if ok else f"expected an H×W×3 uint8 RGB image, got {rgb.dtype} {rgb.shape}"


def face_region_mask(rgb: np.ndarray, detector: str = "dlib") -> tuple[np.ndarray | None, str]:
    """Boolean H×W mask of the largest face's whole region (jaw line + forehead up to the brows,
    including eyes, brows and mouth), or (None, reason)."""
    rgb = np.asarray(rgb)
    if not_rgb(rgb):
        return None, not_rgb(rgb)
    lm, reason = _largest_face_landmarks(rgb, detector)
    if lm is None:
        return None, reason
    mask = face_region_from_landmarks(rgb.shape[:2], lm)
    return (mask, "") if mask.any() else (None, "empty face polygon")


def skin_mask(rgb: np.ndarray, detector: str = "dlib", method: str = "landmarks", bisenet=None,
              low_pct: float = 0.0, high_pct: float = 100.0) -> tuple[np.ndarray | None, str]:
    """Boolean skin mask of the largest face (landmarks polygon or BiSeNet skin class), or (None, reason)."""
    rgb = np.asarray(rgb)
    if not_rgb(rgb):
        return None, not_rgb(rgb)
    from biasaudit.faces.detect import make_detector

    faces = make_detector(detector).detect(rgb)
    if not faces:
        return None, "no face detected"
    if method == "landmarks":
        from biasaudit.faces.detect import landmarks68

        mask = landmark_skin_from_landmarks(rgb.shape[:2], landmarks68(rgb, faces[0].bbox))
    elif method == "bisenet":
        if bisenet is None:
            return None, "bisenet method needs a loaded network"
        mask = bisenet_masks(bisenet, rgb, [faces[0].bbox])[0]
    else:
        raise ValueError(f"unknown skin mask method {method!r} (landmarks | bisenet)")
    mask = remove_extremes(rgb, mask, low_pct, high_pct)
    return (mask, "") if mask.any() else (None, "empty skin mask")


def outline_overlay(rgb: np.ndarray, mask: np.ndarray, bbox=None, colour=(0, 255, 0)) -> np.ndarray:
    """Copy of the image with the mask outline (and the face box) drawn, for reviewer overlays."""
    out = np.ascontiguousarray(rgb.copy())
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_LIST, cv2.CHAIN_APPROX_NONE)
    thick = max(1, min(rgb.shape[:2]) // 256)
    cv2.drawContours(out, contours, -1, colour, thick)
    if bbox is not None:
        x0, y0, x1, y1 = (int(round(v)) for v in bbox)
        cv2.rectangle(out, (x0, y0), (x1, y1), (255, 0, 0), thick)
    return out
