"""The faces stage end to end on images made here (real faces, no face, bad files, a refused row):
contract columns, reasons, aligned L2-normalised embeddings, resumability."""

import numpy as np
import pandas as pd
import pytest
import skimage.data
from PIL import Image

from biasaudit.faces.stage import FACES_COLUMNS, FaceMeasurer, assemble, write_overlays
from biasaudit.params.execution import Execution
from biasaudit.params.faces import Faces
from biasaudit.pipeline.engine import run_local
from biasaudit.pipeline.io import RecordLog


@pytest.fixture
def manifest(tmp_path):
    rng = np.random.default_rng(0)
    astro = skimage.data.astronaut()
    dark = np.round(255 * ((astro / 255.0) ** 2.2 * 0.08) ** (1 / 2.2)).astype(np.uint8)
    img_dir = tmp_path / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    files = {"m-p1-000": Image.fromarray(astro), "m-p1-001": Image.fromarray(np.ascontiguousarray(astro[:, ::-1])),
             "m-p2-000": Image.fromarray(dark), "m-p2-001": Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)),
             "m-p3-000": Image.fromarray(astro).convert("L")}
    rows = []
    for image_id, img in files.items():
        img.save(img_dir / f"{image_id}.png")
        rows.append({"image_id": image_id, "status": "ok", "reason": ""})
    (img_dir / "m-p3-001.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    rows += [{"image_id": "m-p3-001", "status": "ok", "reason": ""},
             {"image_id": "m-p4-000", "status": "refused", "reason": "safety filter"}]
    df = pd.DataFrame(rows)
    df["model"] = "m"
    df["prompt_id"] = df["image_id"].str.split("-").str[1]
    df["path"] = "data/t2i/images/m/" + df["image_id"] + ".png"
    df["stand_in"] = True
    return df


@pytest.mark.slow
def test_stage_records_measures_and_resumes(tmp_path, manifest, monkeypatch):
    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(tmp_path / "tiny"))
    params = Faces(clip_pretrained="tiny", batch_size=3, measure_multi_face=True)
    measurer = FaceMeasurer(params)
    log = RecordLog(tmp_path / "work/records.jsonl", key="image_id")
    items = manifest.to_dict("records")
    fn = measurer.batch_fn(tmp_path / "work/parts", root=tmp_path)
    first = run_local(items[:4], fn, log, batch_size=3, progress=False, execution=Execution())
    second = run_local(items, fn, log, batch_size=3, progress=False, execution=Execution())  # resumes: only the rest
    assert first.processed == 4 and second.already_done == 4 and second.processed == 3
    faces, index, clip, face = assemble(log.to_frame(), manifest["image_id"].tolist(), tmp_path / "work/parts")

    assert list(faces.columns) == FACES_COLUMNS and list(faces["image_id"]) == list(manifest["image_id"])
    by = faces.set_index("image_id")
    assert by.loc["m-p1-000", "status"] == "ok" and by.loc["m-p1-000", "n_faces"] >= 1
    assert 60 < by.loc["m-p1-000", "L"] < 85 and by.loc["m-p2-000", "L"] < 40  # darkened copy: L* < 40
    assert by.loc["m-p2-000", "L_bin"] == "<40"
    assert by.loc["m-p2-001", "status"] == "no_face" and by.loc["m-p2-001", "reason"] == "no face detected"
    # grayscale: the face is found, but no skin tone is read from a gray image
    assert by.loc["m-p3-000", "status"] == "not_measurable" and "grayscale" in by.loc["m-p3-000", "reason"]
    assert np.isnan(by.loc["m-p3-000", "L"]) and "L→RGB" in by.loc["m-p3-000", "reason"]
    assert by.loc["m-p3-001", "status"] == "bad_image" and by.loc["m-p3-001", "reason"]
    assert by.loc["m-p4-000", "status"] == "skipped" and "refused" in by.loc["m-p4-000", "reason"]
    assert by["stand_in"].all() and (by["face_backend"] == "dlib-hog").all()
    assert "2 faces: largest measured" in by.loc["m-p1-000", "reason"]

    # embeddings: one CLIP row per readable image, one face row per measured face, unit norm, aligned
    idx = index.set_index("image_id")
    assert (idx.loc[["m-p3-001", "m-p4-000"], "clip_row"] == -1).all()
    assert idx.loc["m-p2-001", "clip_row"] >= 0 and idx.loc["m-p2-001", "face_row"] == -1
    assert clip.shape == (5, 32) and face.shape[1] == 128 and clip.dtype == face.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(clip, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(face, axis=1), 1, atol=1e-5)
    a, m = face[idx.loc["m-p1-000", "face_row"]], face[idx.loc["m-p1-001", "face_row"]]
    g = face[idx.loc["m-p3-000", "face_row"]]
    assert a @ m > 0.9 and a @ g > 0.9  # mirror and grayscale copies: same person in dlib's space

    written = write_overlays(measurer, faces, manifest, tmp_path / "overlays", 2, seed=1, root=tmp_path)
    assert len(written) == 2 and all(p.exists() for p in written)


@pytest.mark.slow
def test_an_image_whose_worker_died_is_a_failed_row(tmp_path, manifest, monkeypatch):
    """The record Stage.on_death gives the faces stage: a failed row with the pool's reason, no
    embedding rows, and the other images assembled as usual."""
    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(tmp_path / "tiny"))
    measurer = FaceMeasurer(Faces(clip_pretrained="tiny"))
    items = manifest.to_dict("records")
    fn = measurer.batch_fn(tmp_path / "parts", root=tmp_path)
    records = fn(items[:2]) + [measurer.failed_record(items[2], "worker process killed by SIGKILL")]
    faces, index, clip, _ = assemble(pd.DataFrame(records), [it["image_id"] for it in items[:3]], tmp_path / "parts")
    assert list(faces.columns) == FACES_COLUMNS
    row = faces.set_index("image_id").loc[items[2]["image_id"]]
    assert row["status"] == "failed" and "SIGKILL" in row["reason"] and np.isnan(row["L"])
    assert (index.set_index("image_id").loc[items[2]["image_id"], ["clip_row", "face_row"]] == -1).all()
    assert len(clip) == 2 and (faces["status"].iloc[:2] == "ok").all()


def test_params_validation_names_the_key():
    with pytest.raises(ValueError, match="shadow_percentile"):
        Faces(shadow_percentile=60.0, highlight_percentile=55.0)
    with pytest.raises(ValueError, match="insightface"):
        Faces(face_embedding="insightface", detector="dlib")
    with pytest.raises(ValueError, match="skin_method"):
        Faces(skin_method="pixels")


def test_the_clip_model_is_loaded_on_first_embed_only(tmp_path):
    """A driver whose pool workers embed names the CLIP model without importing torch or open_clip; the
    revision is the checkpoint file's sha256 (hashlib on its bytes), and the first embed loads the model."""
    import hashlib
    import subprocess
    import sys
    import textwrap

    from biasaudit.tiny.clip import build_tiny_open_clip

    _, ckpt = build_tiny_open_clip(tmp_path)
    probe = textwrap.dedent("""
        import sys
        import numpy as np
        from biasaudit.faces.embeddings import ClipEmbedder
        emb = ClipEmbedder("ViT-B-32", "tiny", device="cpu", batch_size=2)
        print(emb.revision, emb.model_id, emb.stand_in, "torch" in sys.modules, "open_clip" in sys.modules)
        X = emb.embed([np.zeros((40, 30, 3), np.uint8)] * 3)
        print(X.shape, "open_clip" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "BIASAUDIT_TINY_DIR": str(tmp_path)})
    named, embedded = out.stdout.strip().splitlines()
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()[:16]
    assert named == f"sha256:{digest} biasaudit-tiny-clip True False False"
    assert embedded == "(3, 32) True"
