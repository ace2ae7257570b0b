"""Proof that a counterfactual edit changed only the face (beyond the paper).

For each edited image against its source photo, with the source's face-region mask M
(faces/segment.py `face_region_mask`) and `outside` = pixels farther than `border_px` from M
(the band lets the editor's dilated, feathered mask and the 7×7 SSIM window settle):
- ssim_outside: mean of scikit-image's SSIM map (7×7, per channel, data range 255) over `outside`;
- ssim_global: scikit-image's SSIM of the whole image (the mean of the same map, its edges cropped), the
  global score the seed's rebuttal promises beside the one outside the face (reported, judges nothing);
- psnr_outside: PSNR (dB) over the `outside` pixels (scikit-image; ∞ when identical);
- delta_e_outside / delta_e_inside: mean CIEDE2000 (scikit-image) between source and edit, outside/inside M;
- identity_distance: Euclidean distance of dlib's 128-D face descriptors (largest face) of source and
  edit (dlib's same-person threshold is 0.6); identity_cosine beside it;
- target attainment: a classifier backend's race and gender answers vs the target (optional);
- skin L* shift: L* of the mean sRGB over the skin mask, edit − source (skin-lightening shows here);
- skin seam: ΔE2000 between face skin and the unedited neck / other skin (hands), source and edit, and
  its increase (vlm/edit_quality.py: the declared skin-pixel rule); `skin_seam` fails when the face's
  colour moved away from the body skin's (`seam_de_relative`) by more than `skin_seam_delta_e_max`;
- LPIPS (AlexNet) of the whole image and outside the face (vlm/edit_quality.py), beside SSIM; the
  trunk's weights are recorded per row (`lpips_weights_used`, STAND-IN when random).
A failing check is named in `failed_checks`; `action` is keep | flag | exclude (params `on_fail`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from biasaudit import contracts as C
from biasaudit.faces.colour import delta_e2000, srgb_to_lab
from biasaudit.pipeline.engine import per_item
from biasaudit.vlm import edit_quality as Q
from biasaudit.vlm.groups import CONTROL_ARMS

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params import Params
    from biasaudit.params.vlm import ValidateEdits

PIXEL_CHECKS = ("ssim_outside", "psnr_outside", "delta_e_outside", "no_face_change")


def grow(mask: np.ndarray, px: int) -> np.ndarray:
    """Mask dilated by a disc of radius `px` (exact Euclidean distance)."""
    if px <= 0:
        return mask.astype(bool)
    return ndimage.distance_transform_edt(~mask.astype(bool)) <= px


def match_size(edit: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, str]:
    """Resize an edit to the source's size (API editors may return another size); note when done."""
    if edit.shape[:2] == tuple(shape):
        return edit, ""
    h, w = shape
    note = f"edit resized from {edit.shape[1]}×{edit.shape[0]} to {w}×{h}"
    return np.asarray(Image.fromarray(edit).resize((w, h), Image.Resampling.LANCZOS)), note


def pixel_metrics(src: np.ndarray, edit: np.ndarray, face: np.ndarray, border_px: int, *,
                  src_lab: np.ndarray | None = None, grown: np.ndarray | None = None) -> dict[str, float]:
    """SSIM/PSNR/ΔE2000 outside the (grown) face mask, ΔE2000 inside it and the global SSIM of the whole image.
    Same-size uint8 RGB inputs. `src_lab` (srgb_to_lab(src)) and `grown` (grow(face, border_px)), when given,
    are the source's own, computed once for all its edits (SourceInfo)."""
    if src.shape != edit.shape:
        raise ValueError(f"source {src.shape} and edit {edit.shape} differ in size")
    inside = face.astype(bool)
    outside = ~(grow(inside, border_px) if grown is None else grown)
    out: dict[str, float] = {"face_pixels": int(inside.sum()), "outside_pixels": int(outside.sum())}
    ssim_global, ssim_map = structural_similarity(src, edit, channel_axis=2, data_range=255, full=True)
    out["ssim_global"] = float(ssim_global)  # the whole image, as the seed's rebuttal promises ("globally")
    ssim_map = ssim_map.mean(axis=2)
    out["ssim_outside"] = float(ssim_map[outside].mean()) if outside.any() else np.nan
    if outside.any():
        a, b = src[outside], edit[outside]
        out["psnr_outside"] = float("inf") if np.array_equal(a, b) else float(
            peak_signal_noise_ratio(a, b, data_range=255))
    else:
        out["psnr_outside"] = np.nan
    de = delta_e2000(srgb_to_lab(src) if src_lab is None else src_lab, srgb_to_lab(edit))
    out["delta_e_outside"] = float(de[outside].mean()) if outside.any() else np.nan
    out["delta_e_inside"] = float(de[inside].mean()) if inside.any() else np.nan
    out["changed_frac_outside"] = float((de[outside] > 2.3).mean()) if outside.any() else np.nan  # 2.3 ≈ 1 JND
    return out


def mean_skin_L(rgb: np.ndarray, mask: np.ndarray | None) -> float:
    """L* of the mean sRGB over the mask (the skin-colour definition of faces.colour)."""
    if mask is None or not mask.any():
        return np.nan
    mean_rgb = rgb[mask.astype(bool)].astype(np.float64).mean(axis=0) / 255.0
    return float(srgb_to_lab(mean_rgb)[0])


def failed_checks(m: dict[str, Any], params: ValidateEdits, target_race: str | None = None) -> list[str]:
    """Names of the checks a metrics record fails under the `validate_edits` thresholds."""
    bad = []
    if not m.get("ssim_outside", np.nan) >= params.ssim_outside_min:
        bad.append("ssim_outside")
    if not m.get("psnr_outside", np.nan) >= params.psnr_outside_min:
        bad.append("psnr_outside")
    if not m.get("delta_e_outside", np.nan) <= params.delta_e_outside_max:
        bad.append("delta_e_outside")
    if not m.get("delta_e_inside", np.nan) >= params.delta_e_inside_min:
        bad.append("no_face_change")
    identity = m.get("identity_distance")
    if params.check_identity and identity is not None and not identity <= params.identity_max_distance:
        bad.append("identity")
    if m.get("target_race_ok") is False:
        bad.append("target_race")
    if m.get("target_gender_ok") is False:
        bad.append("target_gender")
    shift = m.get("skin_L_shift")
    if (target_race in params.darker_targets and shift is not None and np.isfinite(shift)
            and shift > params.lightening_tolerance):
        bad.append("skin_lightening")
    seam = m.get("seam_de_relative")
    if seam is not None and np.isfinite(seam) and seam > params.skin_seam_delta_e_max:
        bad.append("skin_seam")
    return bad


# ----------------------------------------------------------------------------- face identity (dlib)

@lru_cache(maxsize=1)
def _face_encoder():
    import dlib

    from biasaudit.faces.detect import dlib_model_path

    return dlib.face_recognition_model_v1(str(dlib_model_path("dlib_face_recognition_resnet_model_v1.dat")))


def face_analysis(rgb: np.ndarray, detector: Any, with_descriptor: bool = True) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """One detection of the largest face → (dlib 128-D descriptor, landmark skin mask), or Nones + reason
    (the reason is '' when a face was found; without `with_descriptor` the descriptor is None)."""
    desc, skin, _, reason = face_parts(rgb, detector, with_descriptor)
    return desc, skin, reason


def face_parts(rgb: np.ndarray, detector: Any, with_descriptor: bool = True) -> tuple[Any, Any, Any, str]:
    """face_analysis and the 68 dlib landmarks (the neck lies below their jaw line)."""
    import dlib

    from biasaudit.faces.detect import shape_predictor
    from biasaudit.faces.segment import landmark_skin_from_landmarks

    faces = detector.detect(rgb)
    if not faces:
        return None, None, None, "no face detected"
    x0, y0, x1, y1 = (int(round(v)) for v in faces[0].bbox)
    img = np.ascontiguousarray(rgb)
    shape = shape_predictor()(img, dlib.rectangle(x0, y0, x1, y1))
    lm = np.array([(q.x, q.y) for q in shape.parts()], dtype=np.float64)
    d = np.asarray(_face_encoder().compute_face_descriptor(img, shape), dtype=np.float64) if with_descriptor else None
    return d, landmark_skin_from_landmarks(rgb.shape[:2], lm), lm, ""


def identity_scores(src_desc: np.ndarray | None, edit_desc: np.ndarray | None) -> dict[str, float | None]:
    """dlib descriptor distance (Euclidean) and cosine similarity; None when a face is missing."""
    if src_desc is None or edit_desc is None:
        return {"identity_distance": None, "identity_cosine": None}
    cos = float(np.dot(src_desc, edit_desc) / (np.linalg.norm(src_desc) * np.linalg.norm(edit_desc)))
    return {"identity_distance": float(np.linalg.norm(src_desc - edit_desc)), "identity_cosine": cos}


# -------------------------------------------------------------------------------------- one edit

@dataclass
class SourceInfo:
    """What validation needs from a source photo, computed once per photo."""
    rgb: np.ndarray
    face: np.ndarray | None
    skin: np.ndarray | None
    descriptor: np.ndarray | None
    reason: str = ""
    landmarks: np.ndarray | None = None
    body: Q.BodySkin | None = None  # neck / other skin pixels, chosen once per source (edit_quality.body_skin)
    lab: np.ndarray | None = None  # srgb_to_lab(rgb), on first use
    grown: dict[int, np.ndarray] = field(default_factory=dict)  # border_px → grow(face, border_px), on first use

    def lab_image(self) -> np.ndarray:
        if self.lab is None:
            self.lab = srgb_to_lab(self.rgb)
        return self.lab

    def grown_face(self, border_px: int) -> np.ndarray:
        if border_px not in self.grown:
            self.grown[border_px] = grow(self.face, border_px)
        return self.grown[border_px]


def prepare_source(rgb: np.ndarray, detector_name: str = "dlib", with_identity: bool = True) -> SourceInfo:
    """The source's face region (faces/segment.py face_region_from_landmarks), landmark skin mask and, with
    `with_identity`, dlib descriptor, from one detection of its largest face."""
    from biasaudit.faces.detect import make_detector
    from biasaudit.faces.segment import face_region_from_landmarks, not_rgb

    rgb = np.asarray(rgb)
    if not_rgb(rgb):
        return SourceInfo(rgb, None, None, None, f"source: {not_rgb(rgb)}")
    desc, skin, lm, reason = face_parts(rgb, make_detector(detector_name), with_identity)
    if lm is None:
        return SourceInfo(rgb, None, None, None, f"source: {reason}")
    face = face_region_from_landmarks(rgb.shape[:2], lm)
    if not face.any():
        return SourceInfo(rgb, None, None, None, "source: empty face polygon")
    return SourceInfo(rgb, face, skin, desc, landmarks=lm)


def body_skin_of(source: SourceInfo, border_px: int) -> Q.BodySkin | None:
    """The source's neck and other skin pixels outside the grown face mask (computed once, kept)."""
    if source.body is None and source.skin is not None and source.skin.any():
        source.body = Q.body_skin(source.rgb, source.skin, ~source.grown_face(border_px), source.landmarks)
    return source.body


def validate_edit(source: SourceInfo, edit_rgb: np.ndarray, params: ValidateEdits, with_identity: bool = True,
                  detector: Any = None, lpips_model: Q.LPIPSModel | None = None) -> dict[str, Any]:
    """All pixel, identity, skin-tone, skin-seam and LPIPS checks of one edit. Returns a record with
    status/reason and the metrics; `judge` adds failed_checks/passed/action. Target attainment is added
    by the caller. Without `lpips_model` the LPIPS columns say why they are empty."""
    from biasaudit.faces.detect import make_detector

    if source.face is None:
        return {"status": "failed", "reason": source.reason}
    edit, note = match_size(edit_rgb, source.rgb.shape[:2])
    rec: dict[str, Any] = {"status": "ok", "reason": "", "note": note}
    grown = source.grown_face(params.border_px)
    rec |= pixel_metrics(source.rgb, edit, source.face, params.border_px, src_lab=source.lab_image(), grown=grown)
    desc, edit_skin, why = face_analysis(edit, detector or make_detector("dlib"), with_identity)
    if with_identity:
        rec |= identity_scores(source.descriptor, desc)
    if why:  # no face found in the edit
        rec["note"] = "; ".join(filter(None, [note, f"edit: {why} (identity measured as missing; skin from the "
                                                    f"source's mask)"]))
        edit_skin = source.skin  # same geometry when only the face changed
    rec["skin_L_source"] = mean_skin_L(source.rgb, source.skin)
    rec["skin_L_edit"] = mean_skin_L(edit, edit_skin)
    rec["skin_L_shift"] = rec["skin_L_edit"] - rec["skin_L_source"]
    rec |= Q.seam_metrics(source.rgb, edit, source.skin, edit_skin, body_skin_of(source, params.border_px))
    model = lpips_model or Q.LPIPSModel(None, "", "LPIPS not computed: no LPIPS model given")
    rec |= Q.lpips_metrics(model, source.rgb, edit, grown)
    return rec


def judge(rec: dict[str, Any], params: ValidateEdits, target_race: str | None) -> dict[str, Any]:
    """Add failed_checks, passed and action (keep | flag | exclude) to a validation record."""
    if rec.get("status") != "ok":
        return rec | {"passed": False, "failed_checks": rec.get("failed_checks", "") or "invalid",
                      "action": "exclude"}
    bad = failed_checks(rec, params, target_race)
    if rec.get("group") in CONTROL_ARMS:  # the null edit and the original are meant to leave the face as it is
        bad = [b for b in bad if b != "no_face_change"]
    action = "keep" if not bad else ("exclude" if params.on_fail == "exclude" else "flag")
    return rec | {"failed_checks": ",".join(bad), "passed": not bad, "action": action}


def judge_all(checks: Any, params: ValidateEdits) -> Any:
    """Every measured edit judged against the thresholds (its failed checks and action); unmeasured rows as they are."""
    import pandas as pd

    return pd.DataFrame([judge(r, params, r.get("race")) if r["status"] == "ok" else r
                         for r in checks.to_dict("records")])


def pixel_ok(src: np.ndarray, edit: np.ndarray, face: np.ndarray, params: ValidateEdits, *,
             src_lab: np.ndarray | None = None, grown: np.ndarray | None = None) -> tuple[bool, list[str], dict]:
    """The cheap pixel checks only (used by the counterfactuals stage to decide a regeneration); `src_lab` and
    `grown` as in pixel_metrics."""
    edit, _ = match_size(edit, src.shape[:2])
    m = pixel_metrics(src, edit, face, params.border_px, src_lab=src_lab, grown=grown)
    bad = [c for c in failed_checks(m, params) if c in PIXEL_CHECKS]
    return not bad, bad, m


# ------------------------------------------------------------------------------ target attainment

RACE_OPTION_TEXT = {"Asian": "Asian", "Black": "Black", "Latino": "Latino", "MiddleEastern": "Middle Eastern",
                    "White": "White"}


RACE_LETTERS = ("A", "B", "C", "D", "E")  # race options are lettered: one distinct first token each


def attainment_requests(paths: list[str], params: ValidateEdits) -> list[tuple[Any, Any]]:
    """(race request, gender request) per edited image, asking the classifier with the allowed options.
    Races are offered as letters ('A. Asian; B. Black; …') so every option has its own first token."""
    from biasaudit.backends.vlm.base import VLMRequest

    legend = "; ".join(f"{letter}. {name}" for letter, name in zip(RACE_LETTERS, RACE_OPTION_TEXT.values()))
    genders = ("man", "woman")
    out = []
    for p in paths:
        out.append((VLMRequest(images=(p,), prompt=params.race_prompt.format(options=legend), options=RACE_LETTERS),
                    VLMRequest(images=(p,), prompt=params.gender_prompt.format(options=", ".join(genders)),
                               options=genders)))
    return out


def target_attainment(vlm: Any, paths: list[str], targets: list[tuple[str, str]], params: ValidateEdits) -> list[dict[str, Any]]:
    """Ask a classifier (a CachedVLM) the race and gender of each edit; compare with the target.
    An unparseable answer or a refusal leaves *_ok as None (not measured) with the reason."""
    from biasaudit.backends.vlm.parse import parse_choice

    back = dict(zip(RACE_LETTERS, RACE_OPTION_TEXT))  # letter → race
    pairs = attainment_requests(paths, params)
    answers = vlm.generate([r for pair in pairs for r in pair])
    out = []
    for i, (race, gender) in enumerate(targets):
        ra, ga = answers[2 * i], answers[2 * i + 1]
        rec: dict[str, Any] = {"race_answer": ra.text, "gender_answer": ga.text}
        r_choice, r_why = parse_choice(ra.text, pairs[i][0].options) if ra.status == "ok" else (None, ra.reason)
        g_choice, g_why = parse_choice(ga.text, pairs[i][1].options) if ga.status == "ok" else (None, ga.reason)
        rec["race_pred"] = back.get(r_choice) if r_choice else None
        rec["gender_pred"] = g_choice
        rec["target_race_ok"] = None if r_choice is None else rec["race_pred"] == race
        rec["target_gender_ok"] = None if g_choice is None else g_choice == gender
        rec["attainment_reason"] = "; ".join(filter(None, [r_why and f"race: {r_why}", g_why and f"gender: {g_why}"]))
        lost = [a.reason for a in (ra, ga) if a.status == "failed"]
        if lost:
            rec["_api_failed"] = "; ".join(lost)
        rec["model_version"] = ra.meta.get("model_version", "")
        stop = [a.reason for a in (ra, ga) if a.meta.get("model_mismatch")]
        if stop:
            rec["stop_reason"] = stop[0]
        out.append(rec)
    return out


ATTAINMENT_FIELDS = ("model_version", "race_answer", "gender_answer", "race_pred", "gender_pred", "target_race_ok", "target_gender_ok",
                     "attainment_reason")


def make_attainment_fn(spec: Any, cache_path: str, params: ValidateEdits):
    """The batch function of the target check (built where it runs, with its own backend and cache
    connection; a module-level factory, so a functools.partial pickles). An answer lost to the API makes
    the item `failed` (asked again); a refusal or an unparseable answer is a measured None with its reason."""
    from biasaudit.backends.vlm import CachedVLM, make_vlm_backend

    cached = CachedVLM(make_vlm_backend(spec), cache_path)

    def fn(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        att = target_attainment(cached, [b["path"] for b in batch], [(b["race"], b["gender"]) for b in batch], params)
        out = []
        for item, rec in zip(batch, att):
            lost = rec.pop("_api_failed", "")
            out.append(item | rec | {"stand_in": bool(cached.backend.stand_in)}
                       | ({"status": "failed", "reason": lost} if lost else {"status": "ok", "reason": ""}))
        return out

    fn.vlm = cached  # type: ignore[attr-defined]
    return fn


def run_target_check(cfg: Params, checks: Any, params: ValidateEdits | None = None, progress: bool = True,
                     work_dir: str | Path = C.VLM / ".work" / "validate_edits") -> Any:
    """Ask `validate_edits.classifier` the race and gender of every measured edit, on the engine
    (resumable, answers cached by request content). Returns `checks` with the ATTAINMENT_FIELDS and the
    classifier's name and stand-in flag."""
    from functools import partial

    import pandas as pd

    from biasaudit import registry
    from biasaudit.backends.vlm import stage_probe
    from biasaudit.pipeline.engine import Stage, file_digest, run_stage
    from biasaudit.pipeline.provenance import stable_hash
    from biasaudit.vlm import tasks

    params = params or cfg.validate_edits
    if params.classifier not in cfg.vlms:
        raise KeyError(f"validate_edits.classifier: '{params.classifier}' is not a key of vlms: {sorted(cfg.vlms)}")
    spec = cfg.vlms[params.classifier]
    todo = checks[checks["status"] == "ok"]
    if "group" in todo:  # the null edit and the original have no target
        todo = todo[~todo["group"].isin(CONTROL_ARMS)]
    if spec.max_source_units:  # a wiring test (the tiny stand-in) asks about its first photos only
        todo = tasks.first_units(todo, spec.max_source_units)
    items = [{"edit_id": r["edit_id"], "path": r["path"], "race": r["race"], "gender": r["gender"],
              "base_id": r.get("base_id"), "occupation": r.get("occupation")} for r in todo.to_dict("records")]
    # the prompts' version is part of the settings: a new version redoes every record (it is each row's label)
    settings = stable_hash([spec.model_dump(), params.target_prompt_version, params.race_prompt, params.gender_prompt],
                           16)
    stage = Stage(f"target check {params.classifier}", items, "edit_id", settings,
                  partial(make_attainment_fn, spec, C.vlm_cache_path(params.classifier).as_posix(), params),
                  f"{work_dir}/target_{params.classifier}.jsonl", lambda item: {"image": file_digest(item["path"])},
                  batch_size=8, code=(registry.module_of("vlm", spec.backend),),  # cached answers are re-parsed
                  probe=stage_probe(spec))
    run = run_stage(stage, cfg.execution, progress)
    answers = pd.DataFrame(run.rows())
    out = checks.copy()
    if len(answers):
        answers = answers.set_index("edit_id")
        for col in ATTAINMENT_FIELDS:
            out[col] = out["edit_id"].map(answers[col]) if col in answers else None
    out["classifier"] = params.classifier
    out["target_prompt_version"] = params.target_prompt_version
    out["classifier_stand_in"] = bool(len(answers) and answers["stand_in"].astype(bool).any())
    return out, run


FAILURE_NAMES = ("ssim_outside", "psnr_outside", "delta_e_outside", "no_face_change", "identity", "target_race",
                 "target_gender", "skin_lightening", "skin_seam")


def by_group_table(checks: Any) -> Any:
    """Per target race × gender: edits measured, passed, the mean skin L* shift (skin-lightening shows
    here), outside ΔE mean, the lowest outside SSIM, the face-vs-neck/other-skin ΔE2000 (source, edit,
    increase; how many edits had no body skin to compare), mean LPIPS, and how often each check failed."""
    import pandas as pd

    ok = checks[checks["status"] == "ok"].copy()
    if not len(ok):
        return pd.DataFrame()
    failed = ok["failed_checks"].fillna("").str.split(",")
    for name in FAILURE_NAMES:
        ok[f"fail_{name}"] = failed.map(set).map(lambda xs, n=name: n in xs)
    agg = {"n": ("edit_id", "size"), "passed": ("passed", "sum"), "skin_L_shift_mean": ("skin_L_shift", "mean"),
           "delta_e_outside_mean": ("delta_e_outside", "mean"), "ssim_outside_min": ("ssim_outside", "min")}
    if "ssim_global" in ok:
        ok["ssim_global"] = pd.to_numeric(ok["ssim_global"], errors="coerce")
        agg["ssim_global_mean"] = ("ssim_global", "mean")
    for col in ("seam_de_neck_source", "seam_de_neck_edit", "seam_de_other_source", "seam_de_other_edit",
                "seam_de_increase", "seam_de_relative", "lpips_whole", "lpips_outside"):
        if col in ok:
            ok[col] = pd.to_numeric(ok[col], errors="coerce")
            agg[f"{col}_mean"] = (col, "mean")
    if "seam_de_relative" in ok:
        ok["seam_missing"] = ok["seam_de_relative"].isna()
        agg["seam_not_measured"] = ("seam_missing", "sum")
    agg |= {f"fail_{n}": (f"fail_{n}", "sum") for n in FAILURE_NAMES}
    return ok.groupby(["race", "gender"]).agg(**agg).reset_index()


def seam_summary(checks: Any) -> dict[str, Any]:
    """How many measured edits had a skin seam measured, how many not (and the commonest reason), how many failed it."""
    ok = checks[checks["status"] == "ok"]
    if "seam_de_relative" not in ok or not len(ok):
        return {"measured": 0, "not_measured": 0, "failed": 0, "reasons": {}}
    seam = ok["seam_de_relative"].astype(float)
    failed = ok["failed_checks"].fillna("").str.split(",").map(lambda xs: "skin_seam" in xs)
    return {"measured": int(seam.notna().sum()), "not_measured": int(seam.isna().sum()), "failed": int(failed.sum()),
            "reasons": ok.loc[seam.isna(), "seam_reason"].value_counts().head(3).to_dict()}


def lpips_summary(checks: Any) -> dict[str, Any]:
    """Which LPIPS weights the rows used (STAND-IN when random), and why rows have none."""
    ok = checks[checks["status"] == "ok"]
    if "lpips_weights_used" not in ok or not len(ok):
        return {"weights": [], "not_computed": {}}
    used = ok["lpips_weights_used"].fillna("")
    return {"weights": sorted(set(used) - {""}), "computed": int((used != "").sum()),
            "stand_in": bool(used.str.startswith("STAND-IN").any()),
            "not_computed": ok.loc[used == "", "lpips_reason"].value_counts().to_dict()}


# ----------------------------------------------------------------- controls: do the checks catch bad edits?

def control_edits(source: SourceInfo, border_px: int, seed: int = 0) -> list[tuple[str, np.ndarray, str | None]]:
    """Synthetic edits of a source photo with known truth: (name, image, the check that must fail or None).
    A recolour confined to the face must pass the only-the-face-changed checks, and fail skin_seam (a darker
    face over the unedited neck); each corruption must fail its check."""
    rgb, face = source.rgb, source.face
    out = ~source.grown_face(border_px)
    recolour = rgb.astype(np.float64)
    recolour[face] *= [0.7, 0.62, 0.55]
    recolour = recolour.astype(np.uint8)
    shifted = np.clip(rgb * np.array([1.06, 1.0, 0.94]), 0, 255).astype(np.uint8)
    background = recolour.copy()
    h, w = rgb.shape[:2]
    band = np.zeros((h, w), bool)
    band[:, : w // 5] = True
    band &= out
    background[band] = np.random.default_rng(seed).integers(0, 256, (int(band.sum()), 3))
    blurred = recolour.copy()
    blur = ndimage.gaussian_filter(rgb.astype(np.float64), sigma=(2, 2, 0)).astype(np.uint8)
    blurred[out] = blur[out]
    return [("recolour face only", recolour, None), ("darker face, body skin unchanged", recolour, "skin_seam"),
            ("global colour shift", shifted, "delta_e_outside"),
            ("background replaced", background, "ssim_outside"), ("blur outside the face", blurred, "ssim_outside"),
            ("face unchanged", rgb.copy(), "no_face_change")]


def first_source_with_face(manifest: Any, params: ValidateEdits) -> SourceInfo | None:
    """The first source photo of the FOCUS manifest (by path) whose face is found: what the controls edit."""
    from biasaudit.pipeline.images import load_rgb

    for path in sorted(p for p in manifest["source_path"].dropna().unique() if p):
        loaded = load_rgb(path)
        if loaded.ok:
            source = prepare_source(loaded.rgb, params.mask_detector, with_identity=False)  # the controls measure no identity
            if source.face is not None:
                return source
    return None


def run_controls(source: SourceInfo, params: ValidateEdits) -> list[dict[str, Any]]:
    rows = []
    for name, img, expect in control_edits(source, params.border_px):
        rec = judge(validate_edit(source, img, params.model_copy(update={"check_identity": False}),
                                  with_identity=False), params, None)
        bad = [b for b in rec.get("failed_checks", "").split(",") if b]
        note = ""
        if expect is None:  # a face-only recolour leaves a seam by design: that is the next control's
            caught = not [b for b in bad if b != "skin_seam"]
        elif expect == "skin_seam" and not np.isfinite(rec.get("seam_de_relative", np.nan)):
            caught, note = True, f"not measurable on this photo: {rec.get('seam_reason')}"
        else:
            caught = expect in bad
        rows.append({"control": name, "expected_failure": expect or "(none: must pass)", "failed_checks": ",".join(bad),
                     "as_expected": caught, "note": note, "ssim_outside": rec.get("ssim_outside"),
                     "psnr_outside": rec.get("psnr_outside"), "delta_e_outside": rec.get("delta_e_outside"),
                     "delta_e_inside": rec.get("delta_e_inside"), "seam_de_relative": rec.get("seam_de_relative")})
    return rows


# ----------------------------------------------------------------------- the stage, on the engine

BASE_FIELDS = ("edit_id", "occupation", "base_id", "race", "gender", "group", "path", "source_path", "backend",
               "model_id", "stand_in")
MEASURE_SETTINGS = ("mask_detector", "border_px", "check_identity", "lpips_weights")  # thresholds only judge


def validation_items(manifest: Any) -> list[dict[str, Any]]:
    """One item per FOCUS manifest row, with the sha256 of the edit and of its source as they are now."""
    from biasaudit.pipeline.engine import file_digest

    items = []
    for m in manifest.to_dict("records"):
        item = {k: m.get(k) for k in BASE_FIELDS} | {"status": m.get("status"), "reason": m.get("reason")}
        item["edit_sha"] = file_digest(m.get("path")) if m.get("status") == "ok" else ""
        item["source_sha"] = file_digest(m.get("source_path")) if m.get("source_path") else ""
        items.append(item)
    return items


def validation_content(item: dict[str, Any]) -> dict[str, Any]:
    return {"status": item["status"], "edit": item["edit_sha"], "source": item["source_sha"]}


def make_validate_fn(params: ValidateEdits):
    """The batch function (built where it runs: each worker its own detector and source cache)."""
    from biasaudit.faces.detect import make_detector
    from biasaudit.pipeline.images import load_rgb

    detector = make_detector(params.mask_detector)
    sources: dict[str, SourceInfo] = {}
    lpips_model = Q.load_lpips(params.lpips_weights)  # once per worker; a missing trunk: the reason per row

    def source_of(path: str) -> SourceInfo:
        if path not in sources:
            loaded = load_rgb(path)
            sources[path] = prepare_source(loaded.rgb, params.mask_detector, params.check_identity) if loaded.ok \
                else SourceInfo(None, None, None, None, f"source: {loaded.reason}")  # type: ignore[arg-type]
        return sources[path]

    def one(item: dict[str, Any]) -> dict[str, Any]:
        base = {k: item.get(k) for k in BASE_FIELDS}
        if item["status"] != "ok":
            return base | {"status": "skipped", "reason": f"no image: {item['status']} ({item['reason']})",
                           "passed": False, "failed_checks": "", "action": "exclude"}
        if not item.get("source_path"):
            return base | {"status": "skipped", "reason": "no source photo (imported set): pixel checks not possible",
                           "passed": None, "failed_checks": "", "action": "keep"}
        loaded = load_rgb(item["path"])
        if not loaded.ok:
            return base | {"status": "failed", "reason": loaded.reason, "passed": False, "failed_checks": "",
                           "action": "exclude"}
        return base | validate_edit(source_of(item["source_path"]), loaded.rgb, params, params.check_identity, detector,
                                    lpips_model)

    return per_item(one, lambda item, reason: {k: item.get(k) for k in BASE_FIELDS} | {
        "status": "failed", "reason": reason, "passed": False, "failed_checks": "", "action": "exclude"})


# what a pool worker needs anyway: imported (and the dlib models loaded) once, in the fork server
PRELOAD = ("biasaudit.vlm.validate", "biasaudit.faces.segment", "biasaudit.faces.preload_dlib")


def run_validation(cfg: Params, manifest: Any, params: ValidateEdits | None = None, progress: bool = True,
                   work_dir: str | Path = C.VLM / ".work" / "validate_edits") -> dict[str, Any]:
    """Measure every edit against its source (resumable on the engine; `execution:` local, local pool
    or Ray). Returns the per-edit records (item order; judge and target attainment come after) and the run."""
    from functools import partial

    import pandas as pd

    from biasaudit.pipeline.engine import INPUT_FIELD, SETTINGS_FIELD, Stage, run_stage
    from biasaudit.pipeline.provenance import stable_hash

    params = params or cfg.validate_edits
    items = validation_items(manifest)
    settings = stable_hash({k: getattr(params, k) for k in MEASURE_SETTINGS})
    stage = Stage("validate edits", items, "edit_id", settings, partial(make_validate_fn, params),
                  f"{work_dir}/records.jsonl", validation_content, batch_size=2, cpu_bound=True, preload=PRELOAD)
    run = run_stage(stage, cfg.execution, progress)
    rows = pd.DataFrame(run.rows()).drop(columns=[SETTINGS_FIELD, INPUT_FIELD], errors="ignore")
    return {"checks": rows, "run": run, "summary": run.summary, "execution": run.execution}
