"""`tiny` stand-in editor (offline profile, tests): a seeded colour and texture transform of the face
region only, per target group. It is no face editor — its edits say nothing about any model — but it
changes only pixels inside the feathered face mask, so the pipeline and the edit checks can run offline.
Every row it produces is marked stand-in."""

from __future__ import annotations

import warnings

import numpy as np
from scipy import ndimage
from skimage.color import lab2rgb

from biasaudit.backends.editors.base import EditRequest, EditResult, ImageEditor, composite, feathered_alpha
from biasaudit.faces.colour import srgb_to_lab
from biasaudit.pipeline.images import load_rgb
from biasaudit.registry import register

# Stand-in target skin tones (CIELAB L*, a*, b*) per race: spread from dark to light so the skin-tone
# checks have something to measure. Not a claim about any group.
STANDIN_LAB = {"Asian": (62.0, 10.0, 20.0), "Black": (36.0, 12.0, 18.0), "Latino": (55.0, 13.0, 21.0),
               "MiddleEastern": (57.0, 12.0, 20.0), "White": (70.0, 11.0, 16.0)}


@register("editor", "tiny", cpu_bound=True, stand_in=True)  # numpy recolouring: the local process pool helps
def make_tiny_editor(spec) -> "TinyEditor":
    return TinyEditor(spec.model_id, spec.mask_dilate_px, spec.mask_feather_px)


class TinyEditor(ImageEditor):
    name = "tiny"
    stand_in = True
    uses_mask = True

    def __init__(self, model_id: str = "tiny-face-recolour", dilate_px: int = 6, feather_px: float = 2.0):
        self.model_id, self.revision = model_id, "v1"
        self.dilate_px, self.feather_px = dilate_px, feather_px

    def settings(self) -> dict:
        return {"dilate_px": self.dilate_px, "feather_px": self.feather_px, "targets_lab": STANDIN_LAB}

    def edit_array(self, rgb: np.ndarray, mask: np.ndarray, target: str, seed: int) -> np.ndarray:
        race, _, gender = target.rpartition("_")  # target 'null': the null edit (same person)
        rng = np.random.default_rng(seed)
        face = mask.astype(bool)
        alpha = feathered_alpha(face, self.dilate_px, self.feather_px)
        ys, xs = np.nonzero(alpha)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1  # work on the face's box only
        lab = srgb_to_lab(rgb[y0:y1, x0:x1])
        face_box = face[y0:y1, x0:x1]
        # the null edit recolours the face to its own measured colour: only the jitter and the round trip remain
        L_t, a_t, b_t = lab[face_box].mean(axis=0) if target == "null" else STANDIN_LAB[race]
        jitter = rng.normal(0, 1.5, 3)
        out = lab.copy()
        for ch, t in enumerate((L_t, a_t, b_t)):
            out[..., ch] += (t + jitter[ch]) - lab[..., ch][face_box].mean()
        # texture: seeded low-frequency shading for 'man', smoothing for 'woman', none for the null edit
        if target == "null":
            pass
        elif gender == "man":
            noise = ndimage.gaussian_filter(rng.normal(0, 1, lab.shape[:2]), 3)
            out[..., 0] += 6.0 * noise / (noise.std() + 1e-9)
        else:
            out[..., 0] = ndimage.gaussian_filter(out[..., 0], 1.5)
        out[..., 0] = np.clip(out[..., 0], 0, 100)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # out-of-gamut colours are clipped, as intended
            box = np.round(np.clip(lab2rgb(out), 0, 1) * 255).astype(np.uint8)
        generated = rgb.copy()
        generated[y0:y1, x0:x1] = box
        return composite(rgb, generated, alpha)

    def edit(self, requests: list[EditRequest]) -> list[EditResult]:
        results = []
        for req in requests:
            try:
                if req.mask is None:
                    results.append(EditResult.failed("tiny editor needs the face mask"))
                    continue
                loaded = load_rgb(req.source)
                if not loaded.ok:
                    results.append(EditResult.failed(f"source: {loaded.reason}"))
                    continue
                results.append(EditResult(self.edit_array(loaded.rgb, req.mask, req.target, req.seed), "ok"))
            except Exception as exc:
                results.append(EditResult.failed(f"{type(exc).__name__}: {exc}"))
        return results
