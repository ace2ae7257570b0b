"""Image controls of a face edit (vlm/edit_quality.py): the face-vs-neck/hand skin seam on a synthetic
image with declared colours (expected ΔE2000 from colour-science, an implementation independent of the
scikit-image one the code uses), and LPIPS on the real loading code with a random trunk."""

import colour
import numpy as np
import pytest

from biasaudit.faces.segment import face_region_from_landmarks, landmark_skin_from_landmarks
from biasaudit.vlm import edit_quality as Q
from biasaudit.vlm import validate as V

FACE, NECK, HAND, DARK = (205, 160, 130), (185, 140, 112), (198, 152, 122), (120, 80, 60)  # sRGB, declared
GREY = (128, 128, 128)  # chroma 0: never skin
BORDER = 4


def oracle_de(rgb1, rgb2) -> float:
    """ΔE2000 of two sRGB uint8 colours by colour-science (D65)."""
    lab1, lab2 = (colour.XYZ_to_Lab(colour.sRGB_to_XYZ(np.array(c) / 255.0)) for c in (rgb1, rgb2))
    return float(colour.delta_E(lab1, lab2, method="CIE 2000"))


def landmarks() -> np.ndarray:
    """68 dlib-ordered points of a schematic face centred at (100, 80): jaw a lower half circle, brows a
    line above, eyes, nose and mouth inside."""
    lm = np.zeros((68, 2))
    t = np.linspace(np.pi, 0, 17)
    lm[0:17] = np.c_[100 + 40 * np.cos(t), 70 + 40 * np.sin(t)]
    lm[17:27] = np.c_[np.linspace(65, 135, 10), np.full(10, 50)]
    lm[27:36] = np.c_[np.full(9, 100), np.linspace(62, 85, 9)]
    for k, cx in ((36, 82), (42, 118)):
        lm[k:k + 6] = np.c_[cx + 6 * np.cos(np.linspace(0, 2 * np.pi, 6, endpoint=False)),
                            65 + 3 * np.sin(np.linspace(0, 2 * np.pi, 6, endpoint=False))]
    lm[48:68] = np.c_[100 + 12 * np.cos(np.linspace(0, 2 * np.pi, 20, endpoint=False)),
                      95 + 4 * np.sin(np.linspace(0, 2 * np.pi, 20, endpoint=False))]
    return lm


def scene(neck=True, hand=True, face_colour=FACE):
    """200×200: grey background, a neck patch below the jaw, a 'hand' patch far away, the face on top."""
    lm = landmarks()
    img = np.full((200, 200, 3), GREY, np.uint8)
    if neck:
        img[100:135, 80:121] = NECK  # inside the neck band below the jaw
    if hand:
        img[150:195, 5:45] = HAND
    face = face_region_from_landmarks(img.shape[:2], lm)
    img[face] = face_colour
    return img, face, landmark_skin_from_landmarks(img.shape[:2], lm), lm


def seam(src, edit, face, skin, lm):
    body = Q.body_skin(src, skin, ~V.grow(face, BORDER), lm)
    return Q.seam_metrics(src, edit, skin, skin, body), body


def test_seam_delta_e_matches_colour_science_on_declared_patches():
    src, face, skin, lm = scene()
    edit, *_ = scene(face_colour=DARK)
    m, body = seam(src, edit, face, skin, lm)
    assert m["skin_neck_pixels"] > 500 and m["skin_other_pixels"] == 40 * 45  # the hand patch, exactly
    assert not (body.neck & body.other).any() and not body.neck[face].any()
    assert m["seam_de_neck_source"] == pytest.approx(oracle_de(FACE, NECK), abs=0.02)
    assert m["seam_de_neck_edit"] == pytest.approx(oracle_de(DARK, NECK), abs=0.02)
    assert m["seam_de_other_source"] == pytest.approx(oracle_de(FACE, HAND), abs=0.02)
    assert m["seam_de_other_edit"] == pytest.approx(oracle_de(DARK, HAND), abs=0.02)
    want_increase = max(oracle_de(DARK, NECK) - oracle_de(FACE, NECK), oracle_de(DARK, HAND) - oracle_de(FACE, HAND))
    assert m["seam_de_increase"] == pytest.approx(want_increase, abs=0.03)
    # body skin unchanged: the face's colour moved by ΔE(FACE, DARK) away from where it would be
    assert m["seam_de_relative"] == pytest.approx(oracle_de(FACE, DARK), abs=0.02) and m["seam_reason"] == ""


def test_body_that_moves_with_the_face_leaves_no_seam():
    """A global colour change (face, neck and hand alike) moves the face with the body: no seam,
    though the raw face-neck ΔE of the edit differs from the source's."""
    src, face, skin, lm = scene()
    edit = np.clip(src.astype(float) * [0.8, 0.8, 0.8], 0, 255).round().astype(np.uint8)
    m, _ = seam(src, edit, face, skin, lm)
    # (0.8 × sRGB is no constant shift in CIELAB: a residue remains, far below the 3.0 threshold)
    assert m["seam_de_relative"] < 1.5 and oracle_de(FACE, tuple(edit[60, 100])) > 5


def test_no_neck_or_hand_skin_gives_a_reason_not_a_number():
    src, face, skin, lm = scene(neck=False, hand=False)
    edit, *_ = scene(neck=False, hand=False, face_colour=DARK)
    m, _ = seam(src, edit, face, skin, lm)
    assert m["skin_neck_pixels"] == m["skin_other_pixels"] == 0
    assert np.isnan(m["seam_de_relative"]) and np.isnan(m["seam_de_increase"])
    assert m["seam_reason"].startswith("no neck or other skin")


def test_neck_only_found_below_the_jaw():
    """The same patch beside the face (not below the jaw) is 'other' skin, not neck."""
    src, face, skin, lm = scene(neck=False, hand=False)
    src[20:60, 150:190] = NECK
    m, body = seam(src, src, face, skin, lm)
    assert m["skin_neck_pixels"] == 0 and m["skin_other_pixels"] == 40 * 40
    assert m["seam_de_other_source"] == pytest.approx(oracle_de(FACE, NECK), abs=0.02)


def test_skin_seam_judged_against_the_threshold():
    from biasaudit.params.vlm import ValidateEdits

    params = ValidateEdits(skin_seam_delta_e_max=3.0)
    assert "skin_seam" in V.failed_checks({"seam_de_relative": 3.5}, params)
    assert "skin_seam" not in V.failed_checks({"seam_de_relative": 2.5}, params)
    assert "skin_seam" not in V.failed_checks({"seam_de_relative": np.nan}, params)  # not measured: no verdict


# ------------------------------------------------------------------------------------------ LPIPS

@pytest.fixture(scope="module")
def random_lpips():
    model = Q.load_lpips(Q.RANDOM_WEIGHTS)
    assert model.net is not None and model.weights.startswith("STAND-IN")
    return model


@pytest.fixture(scope="module")
def photo():
    from skimage import data
    from skimage.transform import resize

    return (resize(data.astronaut(), (128, 128), anti_aliasing=True) * 255).round().astype(np.uint8)


def test_lpips_identical_images_are_zero(random_lpips, photo):
    assert Q.lpips_distance(random_lpips, photo, photo) == 0.0


def test_lpips_grows_with_a_stronger_distortion(random_lpips, photo):
    rng = np.random.default_rng(1)
    noise = rng.normal(size=photo.shape)
    d = [Q.lpips_distance(random_lpips, photo, np.clip(photo + s * noise, 0, 255).astype(np.uint8)) for s in (5, 20, 60)]
    assert 0 < d[0] < d[1] < d[2]


def test_a_change_inside_the_face_leaves_outside_lpips_alone(random_lpips, photo):
    yy, xx = np.mgrid[:128, :128]
    face = (yy - 45) ** 2 + (xx - 64) ** 2 < 20 ** 2
    elsewhere = np.zeros_like(face)
    elsewhere[90:126, 2:38] = True  # a region outside the grown face, about as large as the face
    grown = V.grow(face, 4)
    assert not (elsewhere & grown).any()
    inside, outside = photo.copy(), photo.copy()
    inside[face] = 255 - inside[face]
    outside[elsewhere] = 255 - outside[elsewhere]
    m_in, m_out = Q.lpips_metrics(random_lpips, photo, inside, grown), Q.lpips_metrics(random_lpips, photo, outside, grown)
    assert m_in["lpips_whole"] > 0 and m_in["lpips_outside"] < m_out["lpips_outside"]
    assert m_in["lpips_outside"] == 0.0 and m_out["lpips_outside"] == pytest.approx(m_out["lpips_whole"])
    assert m_in["lpips_weights_used"].startswith("STAND-IN")


def test_imagenet_trunk_is_loaded_from_a_declared_file(tmp_path, photo):
    """The real-weights path on a file we write (a seeded torchvision AlexNet): every trunk layer of the
    LPIPS network holds that file's tensors, and the row names the file and its hash."""
    import torch
    import torchvision

    torch.manual_seed(7)
    trunk = torchvision.models.alexnet()
    path = tmp_path / Q.ALEXNET_FILE
    torch.save(trunk.state_dict(), path)
    model = Q.load_lpips(str(path))
    assert model.net is not None and str(path) in model.weights and "sha256" in model.weights
    slices = [model.net.net.slice1, model.net.net.slice2, model.net.net.slice3, model.net.net.slice4,
              model.net.net.slice5]
    for part, index in zip(slices, ("0", "3", "6", "8", "10")):
        conv = dict(part.named_children())[index]
        assert torch.equal(conv.weight, trunk.features[int(index)].weight)
        assert torch.equal(conv.bias, trunk.features[int(index)].bias)
    assert Q.lpips_distance(model, photo, photo) == 0.0


def test_missing_or_corrupt_weights_give_a_reason_per_row(tmp_path, photo):
    missing = Q.load_lpips(str(tmp_path / "absent.pth"))
    assert missing.net is None and missing.reason.startswith("LPIPS not computed") and "not found" in missing.reason
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    corrupt = Q.load_lpips(str(bad))
    assert corrupt.net is None and corrupt.reason.startswith("LPIPS not computed")
    row = Q.lpips_metrics(missing, photo, photo, np.zeros(photo.shape[:2], bool))
    assert np.isnan(row["lpips_outside"]) and row["lpips_reason"] == missing.reason and row["lpips_weights_used"] == ""


def test_lpips_skipped_by_declaration_gives_its_reason_per_row(photo):
    """validate_edits.lpips_weights 'none': no network, every row says LPIPS was skipped; other spellings of
    'off' are refused by the schema rather than read as a file name."""
    from pydantic import ValidationError

    from biasaudit.params.vlm import ValidateEdits

    skipped = Q.load_lpips(Q.SKIP)
    assert skipped.net is None and "skipped" in skipped.reason
    row = Q.lpips_metrics(skipped, photo, photo, np.zeros(photo.shape[:2], bool))
    assert np.isnan(row["lpips_whole"]) and row["lpips_reason"] == skipped.reason and row["lpips_weights_used"] == ""
    assert ValidateEdits(lpips_weights="none").lpips_weights == "none"
    for bad in ("None", "skip", "off", " none"):
        with pytest.raises(ValidationError, match="lpips_weights"):
            ValidateEdits(lpips_weights=bad)
