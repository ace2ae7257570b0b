"""counterfactuals and validate_edits on the stage engine: resumable, `execution:` aware, content-addressed
(a replaced source photo redoes exactly its edits, and their validation)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import skimage.data
from PIL import Image

from biasaudit.config import read_yaml, validate
from biasaudit.vlm import focus
from biasaudit.vlm import validate as V

from .conftest import ROOT


def config(local_workers: int = 1):
    raw = read_yaml(ROOT / "params.yaml")
    raw["counterfactuals"] = {**raw["counterfactuals"], "backend": "tiny", "races": ["Black", "White"],
                              "genders": ["man"], "max_attempts": 1}
    raw["validate_edits"] = {**raw["validate_edits"], "check_target": False}
    raw["execution"] = {**raw["execution"], "local_workers": local_workers}
    return validate(raw)


@pytest.mark.slow
def test_edits_and_their_validation_resume_by_content(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src_dir = tmp_path / "data/vlm/sources/doctor"
    src_dir.mkdir(parents=True)
    astro = skimage.data.astronaut()
    paths = {"a": src_dir / "a.png", "b": src_dir / "b.png"}
    Image.fromarray(astro).save(paths["a"])
    Image.fromarray(np.ascontiguousarray(astro[:, ::-1])).save(paths["b"])
    sources = pd.DataFrame([{"occupation": "doctor", "base_id": k, "path": str(p), "status": "ok"}
                            for k, p in paths.items()])
    cfg = config()
    first = focus.run_edits(cfg, sources, out_root="data/vlm/focus", progress=False)
    m1 = first["manifest"]
    # per photo 2 group edits, the null edit and the original (params.yaml: counterfactuals.null_edit)
    assert first["summary"].processed == 8 and (m1["status"] == "ok").all() and first["editor"]["backend"] == "tiny"
    assert sorted(m1["arm"].value_counts().items()) == [("counterfactual", 4), ("null_edit", 2), ("original", 2)]
    v1 = V.run_validation(cfg, m1, progress=False)
    assert v1["summary"].processed == 8 and (v1["checks"]["status"] == "ok").all()
    assert v1["checks"]["ssim_outside"].gt(0.9).all()

    again = focus.run_edits(cfg, sources, out_root="data/vlm/focus", progress=False)
    assert again["summary"].processed == 0 and again["summary"].already_done == 8
    assert V.run_validation(cfg, again["manifest"], progress=False)["summary"].processed == 0

    # replace source b's photo: exactly b's four images are redone, then exactly their validation
    Image.fromarray(np.ascontiguousarray(astro[40:, 40:])).save(paths["b"])
    redo = focus.run_edits(cfg, sources, out_root="data/vlm/focus", progress=False)
    redone = {r["edit_id"] for r in redo["run"].appended}
    assert redone == {"doctor/b/Black_man", "doctor/b/White_man", "doctor/b/null", "doctor/b/original"}
    assert redo["summary"].stale["input"] == 4
    v2 = V.run_validation(cfg, redo["manifest"], progress=False)
    assert {r["edit_id"] for r in v2["run"].appended} == redone
    # a threshold only judges: no re-measuring
    raw = cfg.model_dump() | {"validate_edits": cfg.validate_edits.model_dump() | {"ssim_outside_min": 0.5}}
    assert V.run_validation(validate(raw), redo["manifest"], progress=False)["summary"].processed == 0

    # the same records from the local process pool (another work folder)
    pooled = V.run_validation(config(local_workers=2), redo["manifest"], progress=False, work_dir="pool")
    assert pooled["run"].made == []
    cols = ["edit_id", "status", "ssim_outside", "psnr_outside", "delta_e_outside", "delta_e_inside", "skin_L_shift"]
    pd.testing.assert_frame_equal(pooled["checks"][cols], v2["checks"][cols])
