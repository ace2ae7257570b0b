"""The instrument sweep: known truth per image (target L*, face box, skin mask) and the summary tables."""

import numpy as np
import pandas as pd
import pytest

from biasaudit.faces.colour import describe_rgb
from biasaudit.t2i import instruments as ins


@pytest.mark.parametrize("mode", ["skin", "whole"])
def test_sweep_image_truth_is_consistent(mode):
    rgb, truth = ins.sweep_image(3, 40.0, mode, 160, 2.0)
    assert rgb.shape == (160, 160, 3) and truth.mask.shape == (160, 160) and truth.mask.sum() > 500
    # the truth mask carries the target L* (up to resizing of the recoloured photo)
    L = describe_rgb(rgb[truth.mask].reshape(-1, 3).astype(np.float64).mean(axis=0))["L"]
    assert abs(L - 40.0) < 1.5
    ys, xs = np.nonzero(truth.mask)
    l, t, r, b = truth.box
    assert l <= xs.mean() <= r and t <= ys.mean() <= b  # the mask lies inside the true face box


def test_box_iou():
    assert ins.box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert ins.box_iou((0, 0, 10, 10), (5, 0, 15, 10)) == pytest.approx(50 / 150)
    assert ins.box_iou((0, 0, 1, 1), (2, 2, 3, 3)) == 0.0


@pytest.mark.slow
def test_sweep_rows_and_summary():
    sweep = ins.run_sweep([20.0, 60.0], 1, ["skin"], size=160, seed=5, mediapipe_dir=None)
    assert set(sweep["method"]) == {"dlib-hog", "dlib-cnn", "landmarks68"}
    assert "mediapipe" in sweep.attrs["methods"]
    assert len(sweep) == 2 * 3
    found = sweep[sweep["method"].isin(["dlib-hog", "dlib-cnn"])]
    assert found["detected"].all() and (found["L_error"].abs() < 3).all()
    summary = ins.summarize(sweep, [0.0, 0.5])
    assert {"detection_rate", "detection_rate_at_0.5", "mean_L_error", "mask_area_ratio"} <= set(summary.columns)
    assert summary.loc[summary["method"] == "landmarks68", "detection_rate"].isna().all()
    hog = summary[summary["method"] == "dlib-hog"].set_index("target_L")
    # the detection rate at a score threshold never exceeds the rate at dlib's default threshold
    assert (hog["detection_rate_at_0.5"] <= hog["detection_rate"]).all()
    dark = ins.dark_rates(summary, 25.0)
    assert set(dark["L_range"]) == {"L*<=25", "L*>25"}


def test_blazeface_anchor_layout():
    from biasaudit.faces.mediapipe_lite import blazeface_anchors

    a = blazeface_anchors()
    assert a.shape == (896, 2)  # 16·16·2 + 8·8·6, the short-range model's regressor rows
    np.testing.assert_allclose(a[0], [0.5 / 16, 0.5 / 16]) and np.testing.assert_allclose(a[512], [0.5 / 8, 0.5 / 8])


def test_mediapipe_finds_the_packaged_face_when_its_models_are_there():
    from pathlib import Path

    pytest.importorskip("ai_edge_litert")
    from biasaudit.faces import mediapipe_lite as mp

    directory = Path("models/mediapipe")
    if not all((directory / n).is_file() for n in mp.FILES):
        pytest.skip("models/mediapipe/*.tflite not extracted yet (make setup does it)")
    paths, _ = mp.ensure_models(directory)
    rgb, truth = ins.sweep_image(1, 55.0, "skin", 160, 2.0)
    faces = mp.BlazeFaceDetector(paths).detect(rgb)
    assert faces and ins.box_iou(faces[0].bbox, truth.box) > 0.4
    pts, flag = mp.FaceMesh(paths).landmarks(rgb, truth.box)
    mask = mp.mesh_skin_mask(rgb.shape[:2], pts)
    assert flag > 0.5 and (mask & truth.mask).sum() / truth.mask.sum() > 0.7


def test_sweep_on_the_process_pool_gives_the_serial_rows():
    """workers > 1 sends the mode × L* cells to the local process pool; the rows, their order and the
    status are those of the serial sweep."""
    args = dict(levels=[20.0, 45.0, 70.0], recolourings=1, modes=["skin", "whole"], size=160, seed=5, mediapipe_dir=None)
    serial = ins.run_sweep(**args)
    pooled = ins.run_sweep(**args, workers=2)
    pd.testing.assert_frame_equal(serial, pooled)
    assert serial.attrs["methods"] == pooled.attrs["methods"]
