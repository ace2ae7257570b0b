"""Source photos for face-only counterfactuals: import, validate, record reasons for rejects.

Expected layout of a user folder (params `sources.input_dir`):

    <input_dir>/<occupation>/<base_id>.<jpg|jpeg|png|webp|tif|bmp>

one real photograph per file, of one person doing or dressed for that occupation. A good source photo:
one dominant, roughly frontal face (the largest face at least `dominance_ratio` times the area of any
other), a face box of at least `min_face_side` pixels, an image side of at least `min_side` pixels,
the face not covered (no sunglasses/mask), and context (clothing, workplace) that signals the occupation,
since only the face will be edited. Photos must be licensed for this use.

Accepted photos are copied, as 8-bit sRGB PNG, to `data/vlm/sources/<occupation>/<base_id>.png`;
`data/vlm/sources/manifest.parquet` lists every file found with status (ok | rejected | not_used |
skipped) and reason: a file that is not a photo format (a .gif, a note) or lies outside the occupation
folders is `skipped` with why, as is a broken link, a link loop or a folder named like a photo
(`biasaudit.pipeline.entries`: "broken link", "link loop", "a directory, not a file"); a grayscale photo is `rejected` (the edits change skin colour, so a
source needs colour); `conversion` records what loading changed (CMYK→RGB, EXIF rotation, alpha). Base ids are unique (a colliding file name gets a `-2` suffix, noted in `id_note`); photos are
checked in name order until `photos_per_occupation` are accepted, so a rejected one does not count.

The offline profile (`source: packaged`) uses the public-domain photos shipped in packages
(scikit-image's astronaut, matplotlib's grace_hopper) and seeded crops of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from biasaudit.pipeline.entries import DIRECTORY, entry_problem
from biasaudit.pipeline.images import load_rgb
from biasaudit.pipeline.provenance import derive_seed

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import Sources

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".bmp")
# a photo whose every pixel has max(R,G,B) − min(R,G,B) at most this is gray (2: the rounding a JPEG
# of an R = G = B image shows)
GRAY_SPREAD = 2


def grayscale_reason(rgb: np.ndarray | None, conversion: str = "") -> str:
    """Why `rgb` cannot be a source because it has no colour ('' when it has some)."""
    if rgb is None or not rgb.size:
        return ""
    spread = int((rgb.max(axis=2) - rgb.min(axis=2)).max())  # uint8: max ≥ min, no wrap-around
    if spread > GRAY_SPREAD:
        return ""
    how = f"; {conversion}" if conversion else ""
    return (f"grayscale photo (colour spread {spread} ≤ {GRAY_SPREAD}{how}): the edits change skin colour, "
            "so a source photo needs colour")


def packaged_photos() -> dict[str, np.ndarray]:
    """The public-domain face photos that ship in installed packages (name → RGB uint8)."""
    import matplotlib.cbook as cbook
    from skimage import data

    photos = {"astronaut": data.astronaut()}
    loaded = load_rgb(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    if loaded.ok:
        photos["grace_hopper"] = loaded.rgb
    return photos


def seeded_crop(rgb: np.ndarray, seed: int, keep: float = 0.9) -> np.ndarray:
    """A crop keeping `keep` of each side at a seeded offset (k = 0 of a photo is the photo itself)."""
    rng = np.random.default_rng(seed)
    h, w = rgb.shape[:2]
    ch, cw = int(h * keep), int(w * keep)
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    return np.ascontiguousarray(rgb[y:y + ch, x:x + cw])


def downscaled(rgb: np.ndarray, max_side: int) -> np.ndarray:
    """`rgb` with its longer side at most `max_side` (LANCZOS; 0 or a smaller image: unchanged)."""
    h, w = rgb.shape[:2]
    if not max_side or max(h, w) <= max_side:
        return rgb
    from PIL import Image

    k = max_side / max(h, w)
    return np.asarray(Image.fromarray(rgb).resize((round(w * k), round(h * k)), Image.Resampling.LANCZOS))


def packaged_candidates(occupations: list[str], per_occupation: int, seed: int, max_side: int = 0
                        ) -> list[dict[str, Any]]:
    """Offline sources: photo k of occupation i = packaged photo (i + k) mod n, seeded-cropped for k > 0,
    then downscaled to `max_side` (sources.packaged_max_side)."""
    photos = packaged_photos()
    names = sorted(photos)
    out = []
    for i, occ in enumerate(occupations):
        for k in range(per_occupation):
            name = names[(i + k) % len(names)]
            rgb = photos[name] if k == 0 else seeded_crop(photos[name], derive_seed(seed, occ, k))
            out.append({"occupation": occ, "base_id": f"{name.replace('_', '-')}-{k}", "rgb": downscaled(rgb, max_side),
                        "origin": f"packaged:{name}" + (f" crop seed={derive_seed(seed, occ, k)}" if k else ""),
                        "reason": ""})
    return out


def safe_id(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "photo"


def unique_ids(names: list[str]) -> list[tuple[str, str]]:
    """A collision-free base id per file name (in the given order) and a note when it had to change:
    `p q.png` and `p-q.png` both make `p-q`, `photo.jpg` and `photo.png` both `photo`; the later one
    gets the first free `-2`, `-3`, … suffix and the note says from what and why."""
    taken: dict[str, str] = {}
    out = []
    for name in names:
        base = safe_id(Path(name).stem)
        candidate, k = base, 1
        while candidate.lower() in taken:  # case-insensitive: file systems that fold case must not merge two
            k += 1
            candidate = f"{base}-{k}"
        note = "" if k == 1 else f"id '{base}' already used by '{taken[base.lower()]}': '{name}' is '{candidate}'"
        taken[candidate.lower()] = name
        out.append((candidate, note))
    return out


def folder_candidates(input_dir: str | Path, occupations: list[str]) -> list[dict[str, Any]]:
    """Every photo under input_dir/<occupation>/, sorted by name, with a unique base id; loaded
    later by select_sources (only as many as the quota needs). Every other file under input_dir is
    a candidate too, with `skip` saying why it is not used (its format, or where it lies)."""
    root = Path(input_dir)
    out = []

    def skipped(path: Path, occ: str, why: str) -> dict[str, Any]:
        return {"occupation": occ, "base_id": path.name, "path": None, "rgb": None, "origin": str(path),
                "reason": "", "id_note": "", "skip": why}

    for occ in occupations:
        folder = root / occ
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
        problem = {p: entry_problem(p, root) for p in entries}
        files = [p for p in entries if not problem[p] and p.suffix.lower() in IMAGE_SUFFIXES]
        for path, (base_id, note) in zip(files, unique_ids([p.name for p in files])):
            out.append({"occupation": occ, "base_id": base_id, "path": path, "rgb": None, "origin": str(path),
                        "reason": "", "id_note": note})
        for path in entries:
            if problem[path] == DIRECTORY:
                if path.suffix.lower() in IMAGE_SUFFIXES:  # named like a photo: say why it is none
                    out.append(skipped(path, occ, f"{DIRECTORY}: '{path.name}' is a folder"))
                for f in sorted(p for p in path.rglob("*") if not p.is_dir()):
                    why = entry_problem(f, root)
                    out.append(skipped(f, occ, f"in a subfolder of {occ}/: photos lie directly in {occ}/"
                                               + (f"; {why}" if why else "")))
            elif problem[path]:
                out.append(skipped(path, occ, problem[path]))
            elif path not in files:
                out.append(skipped(path, occ, f"not a photo format: '{path.suffix or path.name}' "
                                              f"(read: {', '.join(IMAGE_SUFFIXES)})"))
    if root.is_dir():
        for path in sorted(root.iterdir()):
            if not path.is_dir():
                why = entry_problem(path, root)
                out.append(skipped(path, "", "outside the occupation folders: photos lie in "
                                             f"{root}/<occupation>/" + (f"; {why}" if why else "")))
            elif path.name not in occupations:
                for f in sorted(p for p in path.rglob("*") if not p.is_dir()):
                    out.append(skipped(f, path.name, f"occupation '{path.name}' is not in sources.occupations"))
    return out


def select_sources(candidates: list[dict[str, Any]], detector: Any, params: Sources):
    """Check candidates in order and accept up to `photos_per_occupation` per occupation: a rejected
    photo does not use up the quota, the next one is tried. Yields (candidate with its pixels, record);
    candidates left once the quota is met are recorded as `not_used` without being read."""
    accepted: dict[str, int] = {}
    for c in candidates:
        occ = c["occupation"]
        if c.get("skip"):
            yield c, {"status": "skipped", "reason": c["skip"], "conversion": ""}
            continue
        if accepted.get(occ, 0) >= params.photos_per_occupation:
            yield c, {"status": "not_used", "reason": f"photos_per_occupation ({params.photos_per_occupation}) "
                                                       f"already accepted for {occ}", "conversion": ""}
            continue
        if c.get("rgb") is None and c.get("path") is not None:
            loaded = load_rgb(c["path"])
            c = c | {"rgb": loaded.rgb, "reason": loaded.reason, "conversion": loaded.note}
        gray = grayscale_reason(c["rgb"], c.get("conversion", ""))
        rec = check_photo(None if gray else c["rgb"], detector, params, gray or c.get("reason", ""))
        if gray and c["rgb"] is not None:
            rec |= {"width": int(c["rgb"].shape[1]), "height": int(c["rgb"].shape[0])}
        rec["conversion"] = c.get("conversion", "")
        if rec["status"] == "ok":
            accepted[occ] = accepted.get(occ, 0) + 1
        yield c, rec


def candidates_for(params: Sources) -> list[dict[str, Any]]:
    """The candidate photos `sources:` names: packaged (a few spare seeded crops per occupation, tried in
    order when one is rejected) or a folder (a FileNotFoundError naming the key when it has none)."""
    if params.source == "packaged":
        return packaged_candidates(params.occupations, 3 * params.photos_per_occupation, params.seed,
                                   params.packaged_max_side)
    found = folder_candidates(params.input_dir, params.occupations)
    if not found:
        raise FileNotFoundError(f"sources.input_dir: no photos under {params.input_dir}/<occupation>/ "
                                f"for occupations {params.occupations}")
    return found


def build_sources(params: Sources, out_dir: str | Path, detector: Any = None):
    """The sources stage: check every candidate, copy the accepted ones as 8-bit sRGB PNG to
    `out_dir/<occupation>/<base_id>.png` (atomically) and return the manifest, rejects with their reason."""
    import pandas as pd
    from PIL import Image

    from biasaudit.faces.detect import make_detector
    from biasaudit.pipeline.io import atomic_path
    from biasaudit.pipeline.provenance import sha256_file

    detector = detector or make_detector("dlib", dlib_upsample=params.detector_upsample)
    rows = []
    for c, rec in select_sources(candidates_for(params), detector, params):
        path = Path(out_dir) / c["occupation"] / f"{c['base_id']}.png"
        ok = rec["status"] == "ok"
        if ok:
            with atomic_path(path) as tmp:
                Image.fromarray(c["rgb"]).save(tmp, format="PNG")
        rows.append({"occupation": c["occupation"], "base_id": c["base_id"], "origin": c["origin"],
                     "id_note": c.get("id_note", ""), "path": str(path) if ok else "", **rec,
                     "sha256": sha256_file(path) if ok else "", "detector": detector.name,
                     # packaged: seeded crops of two public-domain photos, near-duplicates of each other; they
                     # are independent source photos only in the planted VLM's draws (STAND-IN units, not a sample)
                     "stand_in": params.source == "packaged"})
    return pd.DataFrame(rows)


def iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    x0, y0, x1, y1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def dedupe(faces: list[Any], max_iou: float = 0.3) -> list[Any]:
    """Drop detections overlapping a larger one (the same face found twice at two scales)."""
    kept: list[Any] = []
    for f in faces:  # largest first
        if all(iou(f.bbox, k.bbox) <= max_iou for k in kept):
            kept.append(f)
    return kept


def competing_faces(faces: list[Any], threshold: float) -> list[Any]:
    """Detections at or above the detector's score threshold, one per face (dedupe), strongest first
    by area × score: a weak false detection (a 0.07-score pattern on a shirt) weighs little, a real
    second face a lot."""
    kept = dedupe(sorted((f for f in faces if float(f.score) >= threshold), key=lambda f: f.area, reverse=True))
    return sorted(kept, key=lambda f: f.area * max(float(f.score), 0.0), reverse=True)


def check_photo(rgb: np.ndarray | None, detector: Any, params: Sources, load_reason: str = "") -> dict[str, Any]:
    """status ok | rejected with a reason: readable, big enough, one dominant face of sufficient size.

    Dominance compares detections by area × score (ignoring those below the detector's threshold):
    the main face must weigh at least `dominance_ratio` times the next one."""
    rec: dict[str, Any] = {"n_faces": 0, "face_side": None, "dominance": None, "det_score": None,
                           "width": None, "height": None}
    if rgb is None:
        return rec | {"status": "rejected", "reason": load_reason or "unreadable"}
    h, w = rgb.shape[:2]
    rec |= {"width": int(w), "height": int(h)}
    if min(h, w) < params.min_side:
        return rec | {"status": "rejected", "reason": f"too small: {w}×{h} (minimum side {params.min_side})"}
    faces = competing_faces(detector.detect(rgb), float(getattr(detector, "threshold", 0.0) or 0.0))
    rec["n_faces"] = len(faces)
    if not faces:
        return rec | {"status": "rejected", "reason": "no face detected"}
    x0, y0, x1, y1 = faces[0].bbox
    rec["face_side"] = float(min(x1 - x0, y1 - y0))
    rec["det_score"] = float(faces[0].score)
    if len(faces) > 1:
        weight = [f.area * max(float(f.score), 0.0) for f in faces[:2]]
        rec["dominance"] = float(weight[0] / weight[1]) if weight[1] > 0 else float("inf")
        if rec["dominance"] < params.dominance_ratio:
            return rec | {"status": "rejected",
                          "reason": f"no dominant face: {len(faces)} faces, the strongest (area × score) only "
                                    f"{rec['dominance']:.1f}× the next"}
    if rec["face_side"] < params.min_face_side:
        return rec | {"status": "rejected", "reason": f"face too small: {rec['face_side']:.0f} px (minimum {params.min_face_side})"}
    return rec | {"status": "ok", "reason": ""}
