"""Image controls of a face edit beyond "only the face changed" (validate_edits; beyond the paper).

Skin seam (face vs neck/body skin). A face-only edit towards a darker or lighter target leaves the
neck and hands as they were, so the edited face can stop matching the person's body. For the source
and the edit, the mean CIELAB (D65, 2°; mean of per-pixel L*a*b*) of
- face skin: the landmark skin mask (faces/segment.py) of that image;
- neck skin: the region below the jaw (dlib jaw points 3…13, shifted down by NECK_DEPTH × the jaw
  width), outside the face mask grown by `border_px`, restricted to skin pixels;
- other skin (hands, arms): every other pixel outside the grown face mask that passes the skin rule.
Skin rule (fitted to the source face's own skin, so it works for any skin tone): a pixel is skin
when its CIELAB hue angle lies within the 5th–95th percentile of the face skin's hue deviations from
their circular median widened by HUE_MARGIN degrees, its chroma C*ab within the face skin's 5th–95th
percentile ± CHROMA_MARGIN (and ≥ MIN_CHROMA: greys have no reliable hue), and its L* within the face
skin's 5th percentile − L_BELOW (a neck lies in the chin's shadow) and 95th + L_ABOVE. The neck/other
pixel sets are chosen on the source and used unchanged in the edit (a clean edit leaves them as they
were). ΔE2000 (scikit-image) between the face and each body region, source and edit; `seam_de_increase`
= the larger increase (edit − source) over the regions found. The judged `seam_de_relative` is the
larger, over the regions, of ΔE2000(edit face, source face + (region in the edit − region in the source)):
how far the face's colour moved away from where the body skin would have taken it. It keeps the source's
own face-neck offset (the chin's shadow) out, and, unlike the raw increase, it does not depend on the
direction: a darker face over a neck that was darker than the face lowers the raw ΔE (measured on the
packaged astronaut photo: −11) yet is a seam. Fewer than MIN_SKIN_PIXELS in both regions → NaN with
`seam_reason`. Limits: skin-hued clothing or background passes the rule.

LPIPS (Zhang et al. 2018, package `lpips` 0.1.4, AlexNet trunk, v0.1 linear layers shipped in the
package): `lpips_whole` on the whole image, `lpips_outside` between the source and the edit with the
grown face region pasted back from the source, so only changes outside the face count. The AlexNet
ImageNet trunk (torchvision IMAGENET1K_V1) is read from a declared file or the torch hub cache, never
downloaded; `random` builds a seeded random trunk (STAND-IN, said in `lpips_weights_used`); `none` skips LPIPS
(the offline demo: a random trunk measures nothing; `Params.skipped` puts it in the report's banner). Without
weights or the package every row says "LPIPS not computed: <reason>".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from biasaudit.faces.colour import chroma, delta_e2000, hue_degrees, srgb_to_lab

NECK_DEPTH = 0.5          # neck region depth below the jaw, in jaw widths (lm 0 → lm 16)
HUE_MARGIN = 10.0         # degrees added to each side of the face skin's hue range
CHROMA_MARGIN = 5.0
MIN_CHROMA = 5.0
L_BELOW, L_ABOVE = 25.0, 15.0
MIN_SKIN_PIXELS = 100     # fewer body-skin pixels than this: no seam measured (reason recorded)
RANDOM_WEIGHTS = "random"
SKIP = "none"  # validate_edits.lpips_weights: LPIPS not measured (Params.skipped lists it)
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"  # torchvision AlexNet_Weights.IMAGENET1K_V1 (sha256 prefix in the name)


# ------------------------------------------------------------------------------------- skin seam

def neck_region(shape: tuple[int, int], lm: np.ndarray) -> np.ndarray:
    """Boolean mask of the band below the lower jaw (dlib points 3…13) NECK_DEPTH jaw widths deep."""
    jaw = lm[3:14]
    depth = NECK_DEPTH * float(np.linalg.norm(lm[16] - lm[0]))
    poly = np.vstack([jaw, (jaw + [0.0, depth])[::-1]])
    mask = np.zeros(shape, np.uint8)
    cv2.fillPoly(mask, [np.round(poly).astype(np.int32).reshape(-1, 1, 2)], 1)
    return mask.astype(bool)


def _hue_dev(hue: np.ndarray, centre: float) -> np.ndarray:
    return (hue - centre + 180.0) % 360.0 - 180.0


def skin_rule(face_lab: np.ndarray):
    """The declared skin-pixel rule fitted to face skin pixels (N×3 CIELAB): a function Lab (…×3) → bool."""
    hue, c, L = hue_degrees(face_lab), chroma(face_lab), face_lab[:, 0]
    centre = float(np.degrees(np.arctan2(np.sin(np.radians(hue)).mean(), np.cos(np.radians(hue)).mean())))
    h_lo, h_hi = np.percentile(_hue_dev(hue, centre), [5, 95]) + [-HUE_MARGIN, HUE_MARGIN]
    c_lo, c_hi = np.percentile(c, [5, 95]) + [-CHROMA_MARGIN, CHROMA_MARGIN]
    l_lo, l_hi = np.percentile(L, 5) - L_BELOW, np.percentile(L, 95) + L_ABOVE

    def is_skin(lab: np.ndarray) -> np.ndarray:
        d, cc = _hue_dev(hue_degrees(lab), centre), chroma(lab)
        return ((d >= h_lo) & (d <= h_hi) & (cc >= max(c_lo, MIN_CHROMA)) & (cc <= c_hi)
                & (lab[..., 0] >= l_lo) & (lab[..., 0] <= l_hi))

    return is_skin


@dataclass
class BodySkin:
    """Skin pixels outside the face of a source photo: below the jaw, and anywhere else."""
    neck: np.ndarray
    other: np.ndarray


def body_skin(rgb: np.ndarray, face_skin: np.ndarray, outside: np.ndarray, lm: np.ndarray | None) -> BodySkin:
    """Neck and other skin pixels (outside = pixels beyond the grown face mask) by the skin rule
    fitted to `face_skin` of this (source) image. Without landmarks there is no neck region."""
    lab = srgb_to_lab(rgb)
    candidate = outside & skin_rule(lab[face_skin])(lab)
    neck = candidate & neck_region(rgb.shape[:2], lm) if lm is not None else np.zeros_like(candidate)
    return BodySkin(neck, candidate & ~neck)


def mean_lab(rgb: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of the per-pixel CIELAB values over the mask."""
    return srgb_to_lab(rgb[mask]).mean(axis=0)


def seam_metrics(src: np.ndarray, edit: np.ndarray, src_face_skin: np.ndarray | None,
                 edit_face_skin: np.ndarray | None, body: BodySkin | None) -> dict[str, Any]:
    """ΔE2000 between face skin and neck / other skin, in the source and in the edit, and the increase."""
    out: dict[str, Any] = {"skin_neck_pixels": 0, "skin_other_pixels": 0, "seam_reason": ""}
    for region in ("neck", "other"):
        out |= {f"seam_de_{region}_source": np.nan, f"seam_de_{region}_edit": np.nan}
    out["seam_de_increase"] = out["seam_de_relative"] = np.nan
    if src_face_skin is None or not src_face_skin.any() or body is None:
        out["seam_reason"] = "no face skin mask in the source"
        return out
    edit_face_skin = src_face_skin if edit_face_skin is None or not edit_face_skin.any() else edit_face_skin
    face_src, face_edit = mean_lab(src, src_face_skin), mean_lab(edit, edit_face_skin)
    increases, relative = [], []
    for region, mask in (("neck", body.neck), ("other", body.other)):
        n = int(mask.sum())
        out[f"skin_{region}_pixels"] = n
        if n < MIN_SKIN_PIXELS:
            continue
        region_src, region_edit = mean_lab(src, mask), mean_lab(edit, mask)
        de_src = float(delta_e2000(face_src, region_src))
        de_edit = float(delta_e2000(face_edit, region_edit))
        out[f"seam_de_{region}_source"], out[f"seam_de_{region}_edit"] = de_src, de_edit
        increases.append(de_edit - de_src)
        relative.append(float(delta_e2000(face_edit, face_src + (region_edit - region_src))))
    if increases:
        out["seam_de_increase"] = float(max(increases))
        out["seam_de_relative"] = float(max(relative))
    else:
        out["seam_reason"] = (f"no neck or other skin outside the face (fewer than {MIN_SKIN_PIXELS} pixels "
                              f"pass the skin rule: neck {out['skin_neck_pixels']}, other {out['skin_other_pixels']})")
    return out


# ------------------------------------------------------------------------------------------ LPIPS

@dataclass
class LPIPSModel:
    """A loaded LPIPS network, or None with the reason; `weights` says which trunk (STAND-IN for random)."""
    net: Any
    weights: str
    reason: str = ""


def alexnet_path(declared: str) -> Path:
    """The AlexNet ImageNet checkpoint: the declared file, or torchvision's name in the torch hub cache."""
    if declared:
        return Path(declared).expanduser()
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE


def _random_trunk_lpips(seed: int):
    """LPIPS(net='alex') with the package's v0.1 linear layers on a seeded random trunk (no download)."""
    import warnings

    import lpips
    import torch

    torch.manual_seed(seed)
    with warnings.catch_warnings():  # lpips 0.1.4 passes torchvision's deprecated `pretrained=False`
        warnings.simplefilter("ignore", UserWarning)
        return lpips.LPIPS(net="alex", pnet_rand=True, pretrained=True, verbose=False).eval()


def load_lpips(weights: str = "", seed: int = 0) -> LPIPSModel:
    """LPIPS(net='alex') with its trunk from `weights` ('' = torch hub cache, a file path, or 'random'
    for a seeded random trunk: a STAND-IN; 'none': not measured). Never downloads: a missing file gives the
    reason instead."""
    if weights == SKIP:
        return LPIPSModel(None, "", "LPIPS not computed: skipped (validate_edits.lpips_weights: none)")
    try:
        import lpips  # noqa: F401  (present: _random_trunk_lpips builds the network)
        import torch
        import torchvision
    except ImportError as e:
        return LPIPSModel(None, "", f"LPIPS not computed: package missing ({e})")
    if weights == RANDOM_WEIGHTS:
        return LPIPSModel(_random_trunk_lpips(seed), f"STAND-IN: random AlexNet trunk (torch seed {seed}), lpips v0.1 linear layers")
    path = alexnet_path(weights)
    if not path.is_file():
        return LPIPSModel(None, "", f"LPIPS not computed: AlexNet ImageNet weights not found at {path} "
                                    f"(torchvision {ALEXNET_FILE}; set validate_edits.lpips_weights)")
    try:
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        trunk = torchvision.models.alexnet()
        trunk.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        net = _random_trunk_lpips(seed)
        for part in (net.net.slice1, net.net.slice2, net.net.slice3, net.net.slice4, net.net.slice5):
            for index, layer in part.named_children():  # lpips keeps torchvision's feature indices as names
                layer.load_state_dict(trunk.features[int(index)].state_dict())
    except Exception as e:  # a corrupt or foreign checkpoint: measured as missing, not a crash
        return LPIPSModel(None, "", f"LPIPS not computed: {path}: {type(e).__name__}: {e}")
    return LPIPSModel(net, f"AlexNet ImageNet {path} (sha256 {digest[:12]}), lpips v0.1 linear layers")


def _tensor(rgb: np.ndarray):
    import torch

    return torch.from_numpy(np.array(rgb, dtype=np.float32)).permute(2, 0, 1)[None] / 127.5 - 1.0


def lpips_distance(model: LPIPSModel, a: np.ndarray, b: np.ndarray) -> float:
    import torch

    with torch.no_grad():
        return float(model.net(_tensor(a), _tensor(b)).item())


def lpips_metrics(model: LPIPSModel, src: np.ndarray, edit: np.ndarray, grown_face: np.ndarray) -> dict[str, Any]:
    """LPIPS of the whole image and outside the (grown) face: the edit with its face pasted from the source."""
    if model.net is None:
        return {"lpips_whole": np.nan, "lpips_outside": np.nan, "lpips_weights_used": "", "lpips_reason": model.reason}
    outside_only = edit.copy()
    outside_only[grown_face] = src[grown_face]
    return {"lpips_whole": lpips_distance(model, src, edit), "lpips_outside": lpips_distance(model, src, outside_only),
            "lpips_weights_used": model.weights, "lpips_reason": ""}
