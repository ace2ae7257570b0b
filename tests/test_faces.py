"""Face detection + skin measurement on real packaged photos (dlib's packaged models) and on inputs
whose answer is known: the astronaut's face darkened in linear light across the whole L* range."""

from pathlib import Path

import matplotlib
import numpy as np
import pytest
import skimage.data
from PIL import Image

from biasaudit.faces import colour, detect, segment


@pytest.fixture(scope="module")
def astronaut():
    return skimage.data.astronaut()


@pytest.fixture(scope="module")
def hopper():
    return np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB"))


@pytest.mark.parametrize("name", ["astronaut", "hopper"])
def test_packaged_photos_face_found_and_plausible(name, request):
    rgb = request.getfixturevalue(name)
    faces = detect.DlibDetector().detect(rgb)
    assert faces, "dlib found no face"
    mask, reason = segment.skin_mask(rgb)
    assert reason == "" and mask.sum() > 1000
    d = colour.describe_rgb(colour.mean_skin_rgb(rgb, mask))
    # both are light-skinned portraits: L* in a light range, warm hue, positive ITA
    assert 55 < d["L"] < 85 and 20 < d["h"] < 90 and d["ita"] > 0 and d["b"] > 5


def _darkened(rgb, region, k):
    lin = (rgb / 255.0) ** 2.2
    out = rgb.copy()
    out[region] = np.round(255 * np.clip(lin[region] * k, 0, 1) ** (1 / 2.2))
    return out


@pytest.mark.parametrize("k, expected_bin", [(0.03, "<40"), (0.1, "<40"), (0.2, "<40"), (0.4, "[40,55)"),
                                             (0.7, "[55,70)"), (1.0, "≥70")])
def test_known_colour_across_L_range(astronaut, k, expected_bin):
    """Darken the face region in linear light (a skin-tone shift that keeps its texture); the true skin
    colour is the mean over the original landmark skin mask. Measured vs true: ΔE2000 < 1.5."""
    face = detect.DlibDetector().detect(astronaut)[0]
    lm = detect.landmarks68(astronaut, face.bbox)
    true_mask = segment.landmark_skin_from_landmarks(astronaut.shape[:2], lm)
    region = segment.face_region_from_landmarks(astronaut.shape[:2], lm)
    img = _darkened(astronaut, region, k)
    true = colour.srgb_to_lab(img[true_mask].astype(float).mean(0) / 255)
    mask, reason = segment.skin_mask(img)
    assert mask is not None, reason
    got = colour.srgb_to_lab(colour.mean_skin_rgb(img, mask) / 255)
    assert float(colour.delta_e2000(got, true)) < 1.5
    assert colour.l_bin(got[0])[0] == expected_bin


def test_no_face_is_a_reason_not_an_error():
    flat = np.full((128, 128, 3), 127, np.uint8)
    assert segment.skin_mask(flat) == (None, "no face detected")
    assert segment.face_region_mask(flat) == (None, "no face detected")
    mask, reason = segment.face_region_mask(np.zeros((10, 10), np.uint8))
    assert mask is None and "H×W×3" in reason


def test_face_region_contains_skin_and_features(astronaut):
    region, reason = segment.face_region_mask(astronaut)
    skin, _ = segment.skin_mask(astronaut)
    assert reason == "" and region.dtype == bool and region.shape == astronaut.shape[:2]
    assert not (skin & ~region).any()  # skin ⊂ face region
    lm = detect.landmarks68(astronaut, detect.DlibDetector().detect(astronaut)[0].bbox)
    for part in (segment.EYE_L, segment.EYE_R, segment.MOUTH):
        cx, cy = np.round(lm[part].mean(0)).astype(int)
        assert region[cy, cx] and not skin[cy, cx]  # eyes/mouth: in the region, not in the skin


def test_remove_extremes_by_L_percentile():
    rgb = np.zeros((10, 10, 3), np.uint8)
    rgb[..., :] = np.arange(100, dtype=np.uint8).reshape(10, 10, 1) * 2 + 20  # 100 grey levels
    mask = np.ones((10, 10), bool)
    assert segment.remove_extremes(rgb, mask, 0, 100) is mask
    kept = segment.remove_extremes(rgb, mask, 10, 90)
    assert 78 <= kept.sum() <= 82 and not kept.flat[0] and not kept.flat[-1] and kept.flat[50]


def test_crop_box_square_and_clipped():
    assert segment.crop_box((10, 10, 30, 50), (100, 100), margin=0.5) == (0, 0, 60, 70)


def test_outline_overlay_draws_on_copy(astronaut):
    mask = np.zeros(astronaut.shape[:2], bool)
    mask[100:200, 100:200] = True
    out = segment.outline_overlay(astronaut, mask, (100, 100, 200, 200))
    assert out.shape == astronaut.shape and (out != astronaut).any()


def test_dlib_face_descriptor_separates_people(astronaut, hopper):
    from biasaudit.faces.embeddings import DlibFaceEmbedder

    emb = DlibFaceEmbedder()
    a = emb.embed(astronaut, detect.DlibDetector().detect(astronaut)[0].bbox)
    mirror = np.ascontiguousarray(astronaut[:, ::-1])
    m = emb.embed(mirror, detect.DlibDetector().detect(mirror)[0].bbox)
    h = emb.embed(hopper, detect.DlibDetector().detect(hopper)[0].bbox)
    assert a.shape == (128,) and a.dtype == np.float32 and abs(np.linalg.norm(a) - 1) < 1e-5
    assert float(a @ m) > float(a @ h) + 0.1  # same person (mirrored) closer than another person


def test_unknown_backends_rejected():
    with pytest.raises(ValueError, match="unknown face detector"):
        detect.make_detector("mtcnn")
    with pytest.raises(ValueError, match="hog"):
        detect.DlibDetector(kind="yolo")


@pytest.mark.slow
def test_insightface_path_with_tiny_onnx_stand_in(tmp_path, astronaut):
    from biasaudit.tiny.insightface import build_tiny_insightface

    root = build_tiny_insightface(tmp_path)
    det = detect.InsightFaceDetector(name="tiny_buffalo", root=str(root), threshold=0.85, det_size=256, stand_in=True)
    faces = det.detect(astronaut)
    assert det.stand_in and faces  # the stand-in's score head is biased so boxes pass 0.85
    h, w = astronaut.shape[:2]
    for f in faces:
        x0, y0, x1, y1 = f.bbox
        assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h and f.score > 0.85
    assert faces[0].embedding.shape == (512,) and abs(np.linalg.norm(faces[0].embedding) - 1) < 1e-4
    assert faces[0].area >= faces[-1].area
    assert det.device == "cpu"  # no CUDA provider on this machine: the CPU, said so
    # strictly above the threshold: a face scoring exactly the threshold is dropped
    top = max(f.score for f in faces)
    det.threshold = top
    assert all(f.score > top for f in det.detect(astronaut))


def test_onnx_providers_and_no_download_at_run_time(tmp_path):
    import onnxruntime as ort

    assert detect.onnx_providers("cpu") == (["CPUExecutionProvider"], -1)
    providers, ctx = detect.onnx_providers("cuda:1")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert providers[0] == ("CUDAExecutionProvider", {"device_id": 1}) and ctx == 1
    else:
        assert providers == ["CPUExecutionProvider"] and ctx == -1
    with pytest.raises(FileNotFoundError, match="biasaudit weights fetch --only insightface-buffalo_l"):
        detect.InsightFaceDetector(name="buffalo_l", root=str(tmp_path))
    assert not any(tmp_path.rglob("*.zip"))  # nothing was downloaded


def test_order_faces_breaks_size_ties_by_score_not_threshold():
    badge = detect.Face((342, 378, 450, 486), 0.01)  # 108×108 false positive
    face = detect.Face((270, 68, 378, 175), 0.12)  # 108×107 real (very dark) face with a low HOG score
    small = detect.Face((0, 0, 50, 50), 2.0)
    assert detect.order_faces([badge, small, face]) == [face, badge, small]
    big = detect.Face((0, 0, 200, 200), 0.05)  # clearly larger: wins regardless of score
    assert detect.order_faces([face, big])[0] is big
    assert detect.order_faces([]) == []
