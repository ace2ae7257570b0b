"""Edit validation on a real packaged photo (skimage's astronaut, public domain) with synthetic edits
whose truth is known: a recolour confined to the face mask passes the only-the-face checks (and leaves a
skin seam); a global colour shift, a background
change, a blur outside the mask, a lightened 'Black' edit and a different person fail the right check."""

import numpy as np
import pytest
from scipy import ndimage

from biasaudit.params.vlm import ValidateEdits
from biasaudit.vlm import validate as V


@pytest.fixture(scope="module")
def source():
    from skimage import data

    info = V.prepare_source(data.astronaut()[:460, :460].copy())
    assert info.face is not None and info.face.sum() > 3000 and info.descriptor is not None
    return info


@pytest.fixture(scope="module")
def params():
    return ValidateEdits()


def check(source, edit, params, target="Asian"):
    return V.judge(V.validate_edit(source, edit, params), params, target)


def test_recolour_inside_the_face_passes_and_leaves_a_seam(source, params):
    """Only the face changed (every pixel check passes), and the darker face no longer matches the
    unedited skin outside it: skin_seam is the one failed check."""
    edit = source.rgb.astype(float)
    edit[source.face] *= [0.7, 0.62, 0.55]
    rec = check(source, edit.astype(np.uint8), params, "Black")
    assert rec["failed_checks"] == "skin_seam" and rec["seam_de_relative"] > 10
    assert rec["ssim_outside"] == pytest.approx(1.0) and rec["psnr_outside"] == float("inf") and rec["delta_e_outside"] == 0
    assert rec["delta_e_inside"] > 10 and rec["skin_L_shift"] < -10
    assert rec["identity_distance"] < params.identity_max_distance


def test_global_colour_shift_fails_delta_e_outside(source, params):
    edit = np.clip(source.rgb * np.array([1.06, 1.0, 0.94]), 0, 255).astype(np.uint8)
    rec = check(source, edit, params)
    assert "delta_e_outside" in rec["failed_checks"].split(",") and not rec["passed"]


def test_background_change_fails_structure_and_colour(source, params):
    edit = source.rgb.copy()
    edit[:, :100] = np.random.default_rng(0).integers(0, 255, (edit.shape[0], 100, 3))
    edit[source.face] //= 2
    bad = check(source, edit, params)["failed_checks"].split(",")
    assert {"ssim_outside", "psnr_outside", "delta_e_outside"} <= set(bad)


def test_blur_outside_the_mask_fails_ssim(source, params):
    out = ~V.grow(source.face, params.border_px)
    blurred = ndimage.gaussian_filter(source.rgb.astype(float), sigma=(2, 2, 0)).astype(np.uint8)
    edit = source.rgb.copy()
    edit[out] = blurred[out]
    edit[source.face] //= 2
    rec = check(source, edit, params)
    assert "ssim_outside" in rec["failed_checks"].split(",")
    assert rec["delta_e_inside"] > 5  # the face did change: only the outside check fails for the blur


def test_unchanged_face_fails_no_face_change(source, params):
    assert check(source, source.rgb.copy(), params)["failed_checks"] == "no_face_change"


def test_lightened_black_edit_is_flagged(source, params):
    edit = source.rgb.astype(float)
    edit[source.face] = np.clip(edit[source.face] * 1.15 + 10, 0, 255)
    rec = check(source, edit.astype(np.uint8), params, "Black")
    assert rec["skin_L_shift"] > params.lightening_tolerance
    assert "skin_lightening" in rec["failed_checks"].split(",")
    assert "skin_lightening" not in check(source, edit.astype(np.uint8), params, "White")["failed_checks"]


def test_another_person_fails_identity(source, params):
    import matplotlib.cbook as cbook

    from biasaudit.pipeline.images import load_rgb
    from biasaudit.vlm.validate import match_size

    hopper = load_rgb(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).rgb
    rec = V.validate_edit(source, match_size(hopper, source.rgb.shape[:2])[0], params)
    assert rec["identity_distance"] > params.identity_max_distance
    assert "identity" in V.failed_checks(rec, params)


def test_exclude_policy_and_no_face_source(params):
    rec = V.judge({"status": "ok", "ssim_outside": 0.5, "psnr_outside": 40, "delta_e_outside": 0,
                   "delta_e_inside": 5}, params.model_copy(update={"on_fail": "exclude"}), "Asian")
    assert rec["action"] == "exclude" and rec["failed_checks"] == "ssim_outside"
    blank = V.prepare_source(np.full((300, 300, 3), 128, np.uint8))
    out = V.judge(V.validate_edit(blank, blank.rgb, params), params, "Asian")
    assert out["status"] == "failed" and "no face" in out["reason"] and out["action"] == "exclude"


def test_pixel_metrics_match_hand_values():
    src = np.zeros((40, 40, 3), np.uint8) + 100
    face = np.zeros((40, 40), bool)
    face[15:25, 15:25] = True
    edit = src.copy()
    edit[0, 0] = 110  # one outside pixel off by 10 in every channel
    m = V.pixel_metrics(src, edit, face, border_px=2)
    n_out = int((~V.grow(face, 2)).sum())
    assert m["outside_pixels"] == n_out
    assert m["psnr_outside"] == pytest.approx(10 * np.log10(255**2 / (100 / n_out)))
    assert m["delta_e_inside"] == 0


def test_a_source_prepared_once_measures_its_edits_as_from_scratch(source, params):
    """The source's face region is segment.face_region_mask's, and the CIELAB and grown mask it keeps for its
    edits give each edit the record computed from the two images alone (every value equal, not approximately)."""
    from biasaudit.faces.colour import srgb_to_lab
    from biasaudit.faces.segment import face_region_mask

    region, _ = face_region_mask(source.rgb)
    assert np.array_equal(source.face, region)
    rng = np.random.default_rng(5)
    for _ in range(3):
        edit = np.clip(source.rgb.astype(int) + rng.integers(-20, 21, source.rgb.shape), 0, 255).astype(np.uint8)
        scratch = V.pixel_metrics(source.rgb, edit, source.face, params.border_px)
        kept = V.pixel_metrics(source.rgb, edit, source.face, params.border_px, src_lab=source.lab_image(),
                               grown=source.grown_face(params.border_px))
        assert kept == scratch
    assert np.array_equal(source.lab_image(), srgb_to_lab(source.rgb))
    assert np.array_equal(source.grown_face(3), V.grow(source.face, 3))


def test_global_ssim_is_the_textbook_ssim_of_the_whole_image():
    """ssim_global against SSIM from its definition (Wang et al. 2004): per channel, every 7×7 window wholly
    inside the image, sample (co)variances, C1 = (0.01·255)², C2 = (0.03·255)², averaged over windows and
    channels."""
    rng = np.random.default_rng(2)
    src = rng.integers(0, 256, (16, 18, 3)).astype(np.uint8)
    edit = np.clip(src.astype(int) + rng.integers(-30, 31, src.shape), 0, 255).astype(np.uint8)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    vals = []
    for ch in range(3):
        for i in range(16 - 6):
            for j in range(18 - 6):
                x = src[i:i + 7, j:j + 7, ch].astype(float).ravel()
                y = edit[i:i + 7, j:j + 7, ch].astype(float).ravel()
                mx, my = x.mean(), y.mean()
                vx, vy, cxy = x.var(ddof=1), y.var(ddof=1), np.cov(x, y, ddof=1)[0, 1]
                vals.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2)))
    m = V.pixel_metrics(src, edit, np.zeros((16, 18), bool), border_px=0)
    assert m["ssim_global"] == pytest.approx(np.mean(vals), rel=1e-6)
    assert V.pixel_metrics(src, src.copy(), np.zeros((16, 18), bool), 0)["ssim_global"] == pytest.approx(1.0)


def test_target_attainment_with_scripted_classifier(params):
    from biasaudit.backends.vlm.base import VLMResponse

    class Scripted:
        def __init__(self, answers):
            self.answers = answers

        def generate(self, requests):
            return [VLMResponse(a, "ok") for a in self.answers[:len(requests)]]

    vlm = Scripted(["D", "woman", "**E**", "I cannot tell", "B.", "man"])  # D = Middle Eastern, E = White
    out = V.target_attainment(vlm, ["a.jpg", "b.jpg", "c.jpg"],
                              [("MiddleEastern", "woman"), ("Black", "man"), ("Black", "woman")], params)
    assert out[0]["target_race_ok"] is True and out[0]["target_gender_ok"] is True
    assert out[1]["target_race_ok"] is False and out[1]["target_gender_ok"] is None and "refusal" in out[1]["attainment_reason"]
    assert out[2]["target_race_ok"] is True and out[2]["target_gender_ok"] is False
    rec = V.failed_checks({"ssim_outside": 1, "psnr_outside": 99, "delta_e_outside": 0, "delta_e_inside": 9} | out[2], params)
    assert rec == ["target_gender"]


def test_target_check_runs_on_the_engine_resumes_and_asks_nothing_twice(tmp_path, monkeypatch):
    """validate_edits' classifier questions are a resumable engine stage: a second run asks 0 questions,
    a new edit is asked about alone, and an unknown classifier key stops the run naming the key."""
    import pandas as pd
    from PIL import Image

    from biasaudit import registry
    from biasaudit.backends.vlm.base import VLMBackend, VLMResponse
    from biasaudit.config import load_params
    from tests.conftest import ROOT

    asked: list[str] = []

    @registry.register("vlm", "scripted-attainment-test")
    class Scripted(VLMBackend):
        name, model_id, revision = "scripted-attainment-test", "scripted", "v1"

        def __init__(self, spec):
            super().__init__()

        def decoding_params(self):
            return {}

        def generate(self, requests, on_result=None):
            out = []
            for i, r in enumerate(requests):
                asked.append(r.prompt[:10])
                out.append(VLMResponse("B" if r.options[0] == "A" else "woman", "ok"))
                if on_result:
                    on_result(i, out[-1])
            return out

    cfg = load_params(ROOT / "params.yaml")
    spec = cfg.vlms["tiny"].model_copy(update={"backend": "scripted-attainment-test", "max_source_units": 0})
    cfg = cfg.model_copy(update={"vlms": {"scripted": spec}})
    params = cfg.validate_edits.model_copy(update={"classifier": "scripted"})
    monkeypatch.chdir(tmp_path)
    rows = []
    for i, (race, gender) in enumerate([("Black", "woman"), ("White", "man")]):
        path = tmp_path / f"e{i}.png"
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(path)
        rows.append({"edit_id": f"e{i}", "path": str(path), "race": race, "gender": gender, "status": "ok",
                     "base_id": f"b{i}", "occupation": "x"})
    checks = pd.DataFrame(rows + [{"edit_id": "e9", "path": "", "race": "Asian", "gender": "man", "status": "failed"}])
    out, _ = V.run_target_check(cfg, checks, params, progress=False, work_dir=tmp_path / "work")
    assert len(asked) == 4  # race + gender for the 2 measured edits; none for the failed one
    race_ok = out.set_index("edit_id")["target_race_ok"]
    assert race_ok[["e0", "e1"]].tolist() == [True, False] and pd.isna(race_ok["e9"])  # not asked: not measured
    assert list(out["target_gender_ok"][:2]) == [True, False] and out["classifier"].eq("scripted").all()
    again, _ = V.run_target_check(cfg, checks, params, progress=False, work_dir=tmp_path / "work")
    assert len(asked) == 4 and again["target_race_ok"][:2].tolist() == [True, False]
    path = tmp_path / "e2.png"
    Image.fromarray(np.full((8, 8, 3), 200, np.uint8)).save(path)
    more = pd.concat([checks, pd.DataFrame([{"edit_id": "e2", "path": str(path), "race": "Black", "gender": "man",
                                             "status": "ok", "base_id": "b2", "occupation": "x"}])], ignore_index=True)
    V.run_target_check(cfg, more, params, progress=False, work_dir=tmp_path / "work")
    assert len(asked) == 6  # only the new edit
    assert out["target_prompt_version"].eq("v1").all()
    bumped, run = V.run_target_check(cfg, more, params.model_copy(update={"target_prompt_version": "v2"}),
                                     progress=False, work_dir=tmp_path / "work")
    assert run.summary.stale["settings"] == 3 and run.summary.already_done == 0  # a new version redoes every record
    assert bumped["target_prompt_version"].eq("v2").all()
    with pytest.raises(KeyError, match="validate_edits.classifier"):
        V.run_target_check(cfg, checks, params.model_copy(update={"classifier": "nosuch"}), progress=False)
