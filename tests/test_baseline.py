"""The real-portrait baseline of the homogeneity gap: folder import and relative gaps."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.contracts import GROUPS
from biasaudit.stats.homogeneity import relative_gaps
from biasaudit.t2i import baseline as bl


def test_portrait_manifest_reads_group_folders_and_records_rejects(tmp_path):
    rng = np.random.default_rng(0)
    for group, name in (("black", "a.jpg"), ("white", "b.png"), ("martian", "c.png")):
        (tmp_path / group).mkdir()
        Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / group / name)
    (tmp_path / "loose.png").write_bytes(b"not an image")
    (tmp_path / "asian").mkdir()
    (tmp_path / "asian" / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    m = bl.portrait_manifest(tmp_path, GROUPS).set_index("path")
    assert len(m) == 5 and m["image_id"].is_unique
    ok = m[m["status"] == "ok"]
    assert sorted(ok["group"]) == ["black", "white"] and (ok["width"] == 64).all()
    assert "not in a group folder" in m.loc[(tmp_path / "martian" / "c.png").as_posix(), "reason"]
    assert "not in a group folder" in m.loc[(tmp_path / "loose.png").as_posix(), "reason"]
    assert m.loc[(tmp_path / "asian" / "broken.jpg").as_posix(), "status"] == "failed"
    assert m["model_revision"].nunique() == 1 and m["model_revision"].iloc[0].startswith("files:")
    # the revision follows the files' content
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "black" / "a.jpg")
    assert bl.portrait_manifest(tmp_path, GROUPS)["model_revision"].iloc[0] != m["model_revision"].iloc[0]


def test_relative_gaps_subtract_the_baseline_per_space_and_group():
    model = pd.DataFrame({"model": ["m1", "m1", "m2"], "space": ["face", "clip", "face"],
                          "group": ["black", "black", "white"], "gap": [0.11, 0.05, 0.02], "n": [40, 40, 90]})
    base = pd.DataFrame({"space": ["face", "clip"], "group": ["black", "black"], "gap": [0.04, 0.01], "n": [30, 30]})
    rel = relative_gaps(model, base).set_index(["model", "space", "group"])
    assert rel.loc[("m1", "face", "black"), "gap_minus_baseline"] == pytest.approx(0.07)
    assert rel.loc[("m1", "clip", "black"), "gap_minus_baseline"] == pytest.approx(0.04)
    assert np.isnan(rel.loc[("m2", "face", "white"), "gap_minus_baseline"])  # no baseline for that group


@pytest.mark.slow
def test_standin_portraits_are_labelled_and_measurable(tmp_path):
    folder = bl.build_standin_portraits(tmp_path / "p", GROUPS, per_group=2, seed=1, size=128)
    assert "Stand-in" in (folder / "STAND-IN.txt").read_text()
    m = bl.portrait_manifest(folder, GROUPS, stand_in=True)
    assert len(m) == 10 and (m["status"] == "ok").all() and m["stand_in"].all()
    assert m.groupby("group").size().eq(2).all()
