"""The PLANTED-truth generator and the SIMULATED classifier: their truth follows the declared parameters.

Expected values come from the definitions (the declared distortion, the declared confusion matrix,
CIELAB of the mean sRGB colour), and frequencies are checked against them with binomial tolerances.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit import GROUPS
from biasaudit.backends.generators.packaged_photos import source_rgb
from biasaudit.backends.generators.planted import (
    draw_truth,
    planted_distribution,
    recolour_skin,
    render,
    source_regions,
)
from biasaudit.config import ParamsError, validate
from biasaudit.faces.colour import describe_rgb
from biasaudit.params.generate import GeneratorSpec, PlantedSpec
from biasaudit.stats.tvd import tvd

from .conftest import ROOT


def test_planted_distribution_is_the_declared_distortion():
    bench = np.array([[0.5, 0.3, 0.1, 0.05, 0.05], [0.1, 0.8, 0.05, 0.03, 0.02]])
    p = planted_distribution(bench, {"black": 0.5}, "white", GROUPS)
    np.testing.assert_allclose(p, [[0.65, 0.15, 0.1, 0.05, 0.05], [0.5, 0.4, 0.05, 0.03, 0.02]])
    np.testing.assert_allclose(tvd(p, bench), [0.15, 0.4])  # exactly the moved mass
    two = planted_distribution(bench, {"black": 0.0, "asian": 0.5}, "hispanic", GROUPS)
    np.testing.assert_allclose(two[0], [0.5, 0.0, 0.05, 0.05 + 0.3 + 0.05, 0.05])


def test_planted_labels_and_skin_follow_the_declared_distributions():
    spec = PlantedSpec()
    p = np.array([0.5, 0.2, 0.1, 0.15, 0.05])
    n = 4000
    draws = [draw_truth(np.random.default_rng([s, 0]), p, spec, GROUPS) for s in range(n)]
    labels = np.array([d[0] for d in draws])
    for g, share in zip(GROUPS, p):
        assert abs((labels == g).mean() - share) < 4 * np.sqrt(share * (1 - share) / n), g
    L = np.array([d[1] for d in draws])
    for g in ("white", "black"):
        sub = L[labels == g]
        assert abs(sub.mean() - spec.L_mean[g]) < 4 * spec.L_sd[g] / np.sqrt(len(sub)) + 0.05
        assert sub.min() >= spec.L_range[0] and sub.max() <= spec.L_range[1]


def test_planted_spec_rejects_bad_declarations():
    with pytest.raises(ValueError, match="receiver"):
        PlantedSpec(scale={"white": 0.5}, receiver="white")
    with pytest.raises(ValueError, match="unknown group"):
        PlantedSpec(scale={"purple": 0.5})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        PlantedSpec(scale={"black": 1.5})
    assert GeneratorSpec(backend="planted").planted == PlantedSpec()
    # other backends keep their config hash: no planted key in their output settings
    assert "planted" not in GeneratorSpec(backend="packaged-photos").output_settings()


@pytest.mark.parametrize("target", [20.0, 45.0, 70.0])
def test_recolour_hits_the_target_L_on_the_skin_mask(target):
    rgb = source_rgb("astronaut")
    mask, weight = source_regions("astronaut")
    out, info = recolour_skin(rgb, mask, weight, target, 60.0)
    got = describe_rgb(out[mask].reshape(-1, 3).astype(np.float64).mean(axis=0))
    assert abs(got["L"] - target) < 0.3  # uint8 rounding after the bisection on floats
    assert abs(((got["h"] - 60.0 + 180) % 360) - 180) < 6.0
    assert np.array_equal(out[weight == 0], rgb[weight == 0])  # outside the skin region: untouched


def test_faces_stage_measures_the_planted_L(tmp_path):
    """The real detector + landmark mask on rendered planted images recover the planted L* (L* ≥ 30)."""
    from biasaudit.faces.detect import DlibDetector, landmarks68
    from biasaudit.faces.segment import landmark_skin_from_landmarks

    det = DlibDetector("hog", 1)
    for seed, target in enumerate([32.0, 48.0, 66.0, 74.0]):
        rgb, _ = render(seed, 160, 160, target, 58.0)
        faces = det.detect(rgb)
        assert faces, target
        mask = landmark_skin_from_landmarks(rgb.shape[:2], landmarks68(rgb, faces[0].bbox))
        L = describe_rgb(rgb[mask].reshape(-1, 3).astype(np.float64).mean(axis=0))["L"]
        assert abs(L - target) < 3.0, (target, L)


@pytest.fixture
def planted_run(tmp_path, monkeypatch):
    """generate@planted and classify@planted (simulated) on three prompts, in a temporary folder."""
    from biasaudit.config import load_params
    from biasaudit.t2i.generate import run_generate

    monkeypatch.chdir(tmp_path)
    prompts = pd.DataFrame({"prompt_id": ["p1", "p2", "p3"], "prompt": ["a", "b", "c"], "category": "occupation",
                            "white": [0.6, 0.2, 0.1], "black": [0.3, 0.7, 0.1], "asian": [0.05, 0.05, 0.6],
                            "hispanic": [0.03, 0.03, 0.1], "other": [0.02, 0.02, 0.1], "template_version": "v1"})
    prompts.to_csv("prompts.csv", index=False)
    raw = load_params(ROOT / "params.yaml").model_dump()
    raw["models"] = {"pl": {"backend": "planted", "width": 128, "height": 128,
                            "planted": {"prompts_file": "prompts.csv", "scale": {"black": 0.5}}}}
    raw["generate"].update(prompts_file="prompts.csv", images_per_prompt=4, images_dir="images")
    cfg = validate(raw)
    return cfg, run_generate("pl", cfg, progress=False), prompts


def test_generate_records_the_planted_truth(planted_run):
    cfg, res, prompts = planted_run
    m = res.manifest
    assert (m["status"] == "ok").all() and m["planted_label"].isin(GROUPS).all()
    assert m["planted_L"].between(15, 80).all() and m["stand_in"].all()
    extra = json.loads(m.loc[m["prompt_id"] == "p1", "extra"].iloc[0])
    np.testing.assert_allclose(extra["planted_shares"], [0.75, 0.15, 0.05, 0.03, 0.02], atol=1e-6)
    with Image.open(m["path"].iloc[0]) as img:
        assert img.text["biasaudit:note"].startswith("PLANTED") and img.text["biasaudit:planted_label"] in GROUPS


def test_planted_backend_needs_its_benchmark_file(planted_run):
    from biasaudit.t2i.generate import preflight

    cfg, _, _ = planted_run
    raw = cfg.model_dump()
    raw["models"]["pl"]["planted"]["prompts_file"] = "absent.csv"
    with pytest.raises(ParamsError, match="models.pl.planted.prompts_file"):
        preflight("pl", validate(raw))


def test_simulated_classifier_reads_the_planted_label(planted_run):
    from biasaudit.backends.vlm import VLMRequest, make_vlm_backend
    from biasaudit.params.classify import VLMSpec

    _, res, _ = planted_run
    identity = {t: {c: float(t == c) for c in GROUPS} for t in GROUPS}
    backend = make_vlm_backend(VLMSpec(backend="simulated", sim_confusion=identity), GROUPS)
    out = backend.generate([VLMRequest(images=(p,), prompt="race?") for p in res.manifest["path"]])
    assert [r.text for r in out] == list(res.manifest["planted_label"])  # identity matrix: the truth
    assert backend.stand_in
    (res.out_dir / "stray.png").write_bytes(b"")
    bad = backend.generate([VLMRequest(images=(str(res.out_dir / "stray.png"),), prompt="race?")])[0]
    assert bad.status == "failed" and "no planted label" in bad.reason


def test_simulated_classifier_follows_the_declared_confusion():
    from biasaudit.backends.vlm.simulated import SimulatedClassifier
    from biasaudit.known_truth import confusion_array
    from biasaudit.params.classify import VLMSpec

    spec = VLMSpec(backend="simulated")
    clf = SimulatedClassifier(spec, GROUPS)
    M = confusion_array(spec.sim_confusion, GROUPS)
    n = 3000
    said = np.array([clf.answer(f"img-{i}", "hispanic") for i in range(n)])
    for j, g in enumerate(GROUPS):
        p = M[GROUPS.index("hispanic"), j]
        assert abs((said == g).mean() - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-9, g
    assert clf.answer("img-7", "white") == clf.answer("img-7", "white")  # seeded per image
    from biasaudit.params import Params
    from biasaudit.params.classify import Classify

    partial = VLMSpec(backend="simulated", sim_confusion={"white": {"white": 1.0}})  # a valid spec on its own …
    with pytest.raises(ValueError, match="sim_confusion: rows and columns must be the groups"):
        Params(classify=Classify(vlm=partial))  # … but not the active set's five groups
    with pytest.raises(ValueError, match="sim_confusion: columns must be among"):
        VLMSpec(backend="simulated", sim_confusion={"white": {"white": 0.5, "black": 0.5}})


def test_cross_detector_measures_faces_the_main_detector_lost():
    """faces.cross_detector: a face the main detector missed still gets an L* from the second detector."""
    from biasaudit.faces.detect import DlibDetector
    from biasaudit.faces.stage import FaceMeasurer
    from biasaudit.params.faces import Faces

    measurer = object.__new__(FaceMeasurer)  # only the detector and mask parts (no CLIP load)
    measurer.p, measurer.bisenet = Faces(cross_detector="dlib-hog"), None
    measurer.cross = DlibDetector("hog", 1)
    rgb, _ = render(11, 160, 160, 50.0, 58.0)
    lost = measurer.cross_check(rgb, {"n_faces": 0})
    assert lost["cross_detector"] == "dlib-hog" and lost["cross_n_faces"] == 1 and abs(lost["cross_L"] - 50.0) < 3
    found = measurer.cross_check(rgb, {"n_faces": 1})
    assert found["cross_n_faces"] == 1 and np.isnan(found["cross_L"])  # measured by the main detector already
    measurer.cross = None
    assert measurer.cross_check(rgb, {"n_faces": 0}) == {}


def test_planted_images_on_the_process_pool_are_the_serial_ones(planted_run):
    """generate@planted is CPU-bound (execution.local_workers > 1 renders on the local process pool):
    the same images, byte for byte, and the same manifest rows as one process."""
    import hashlib

    from biasaudit.t2i.generate import run_generate

    cfg, pooled, _ = planted_run
    assert cfg.execution.local_workers == 2
    raw = cfg.model_dump()
    raw["execution"]["local_workers"] = 1
    raw["generate"]["images_dir"] = "serial"
    serial = run_generate("pl", validate(raw), progress=False).manifest

    def digest(m):
        return m.set_index("image_id")["path"].map(lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest())

    pd.testing.assert_series_equal(digest(pooled.manifest).sort_index(), digest(serial).sort_index())
    cols = ["image_id", "prompt_id", "status", "planted_label", "planted_L", "seed"]
    pd.testing.assert_frame_equal(pooled.manifest[cols].sort_values("image_id").reset_index(drop=True),
                                  serial[cols].sort_values("image_id").reset_index(drop=True))
