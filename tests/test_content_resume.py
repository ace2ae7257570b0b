"""Content-addressed resume through the real stage functions: swap two images behind the same ids
and re-run classify and faces. Exactly those two items are recomputed and the measurements follow
the content (the no-face image is reported no_face, the face's L* moves with the face)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import skimage.data
from PIL import Image

from biasaudit.config import read_yaml, validate

from .conftest import ROOT
from .servers_vlm import VLMServer, label_for_pixels


def swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def write_images(root: Path) -> pd.DataFrame:
    img_dir = root / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    images = {"m-p0-000": skimage.data.astronaut()[:320, 60:380],  # a face
              "m-p1-000": np.full((96, 96, 3), 230, np.uint8),  # no face, light
              "m-p2-000": np.full((96, 96, 3), 70, np.uint8)}  # no face, dark
    rows = []
    for image_id, rgb in images.items():
        Image.fromarray(np.ascontiguousarray(rgb)).save(img_dir / f"{image_id}.png")
        rows.append({"image_id": image_id, "model": "m", "prompt_id": image_id.split("-")[1],
                     "path": f"data/t2i/images/m/{image_id}.png", "status": "ok", "reason": "", "stand_in": True})
    manifest = pd.DataFrame(rows)
    manifest.to_parquet(img_dir / "manifest.parquet", index=False)
    return manifest


def config(server_url: str):
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = {"m": {"backend": "packaged-photos", "width": 96, "height": 96}}
    raw["classify"] = {**raw["classify"], "batch_size": 2, "retry_failed": True,
                       "vlm": {**raw["classify"]["vlm"], "backend": "openai", "model_id": "m", "base_url": server_url,
                               "api_key_env": "NOPE", "concurrency": 1, "constrain": False, "batch_mode": False}}
    raw["faces"] = {**raw["faces"], "detector": "dlib", "skin_method": "landmarks", "face_embedding": "dlib",
                    "clip_pretrained": "tiny", "batch_size": 2, "device": "cpu", "limit": 0}
    return validate(raw)


@pytest.mark.slow
def test_swapped_images_are_remeasured_and_relabelled(tmp_path, monkeypatch):
    from biasaudit.faces.stage import run_faces
    from biasaudit.t2i.classify import run_classify

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(tmp_path / "tiny"))
    write_images(tmp_path)
    truth = {p.stem: label_for_pixels(Image.open(p)) for p in Path("data/t2i/images/m").glob("*.png")}
    with VLMServer() as server:
        cfg = config(server.openai_url)
        c1, f1 = run_classify("m", cfg, progress=False), run_faces("m", cfg, progress=False)
        labels1 = c1["table"].set_index("image_id")["label"]
        faces1 = f1["faces"].set_index("image_id")
        assert labels1.to_dict() == truth  # the server's truth is a function of the pixels
        assert faces1.loc["m-p0-000", "status"] == "ok" and faces1.loc["m-p1-000", "status"] == "no_face"

        swap(Path("data/t2i/images/m/m-p0-000.png"), Path("data/t2i/images/m/m-p1-000.png"))
        c2, f2 = run_classify("m", cfg, progress=False), run_faces("m", cfg, progress=False)
    for run in (c2["summary"], f2["summary"]):
        assert run.processed == 2 and run.already_done == 1 and run.stale["input"] == 2  # exactly the swapped two
    labels2 = c2["table"].set_index("image_id")["label"]
    assert labels2["m-p0-000"] == labels1["m-p1-000"] and labels2["m-p1-000"] == labels1["m-p0-000"]
    assert labels2["m-p2-000"] == labels1["m-p2-000"]
    faces2 = f2["faces"].set_index("image_id")
    assert faces2.loc["m-p0-000", "status"] == "no_face" and np.isnan(faces2.loc["m-p0-000", "L"])
    assert faces2.loc["m-p1-000", "status"] == "ok"
    assert faces2.loc["m-p1-000", "L"] == faces1.loc["m-p0-000", "L"]  # the same bytes, the same L*
    # the embeddings follow the content too: the face row now belongs to the other id
    idx1, idx2 = f1["index"].set_index("image_id"), f2["index"].set_index("image_id")
    assert idx2.loc["m-p0-000", "face_row"] == -1 and idx2.loc["m-p1-000", "face_row"] >= 0
    np.testing.assert_array_equal(f2["face"][idx2.loc["m-p1-000", "face_row"]],
                                  f1["face"][idx1.loc["m-p0-000", "face_row"]])
