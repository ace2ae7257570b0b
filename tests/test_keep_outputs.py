"""A stage that fails keeps its outputs: every output is persist (DVC never deletes one), and the runner
moves a stage's outputs aside while it runs and puts them back when it fails (biasaudit/pipeline/keep_outputs.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from biasaudit import contracts as C
from biasaudit.pipeline.keep_outputs import RESUME_LABEL, KeptOutputs, keep_outputs, stage_outputs

from .conftest import ROOT
from .pipeline_copy import dvc, make_pipeline_copy, set_params


def test_output_paths_are_the_ones_dvc_resolves_and_all_persist():
    """The runner's reading of dvc.yaml (foreach keys, ${section.name} from params.yaml) against DVC's own
    resolution, stage by stage; every output persists, and only the resumable ones are labelled."""
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        stages = {s.addressing: s for s in repo.index.stages}
    assert len(stages) > 10
    labelled = set()
    for address, stage in stages.items():
        ours = stage_outputs(address, ROOT)
        assert [o.path.as_posix() for o in ours] == [str(o.def_path) for o in stage.outs], address
        assert all(o.persist for o in stage.outs), address
        labelled |= {o.path.as_posix() for o in ours if RESUME_LABEL in o.labels}
    assert labelled == {"data/t2i/images/planted-a", "data/t2i/images/planted-b", "data/vlm/focus", "reports/thumbs"}


def make_outputs(root: Path) -> None:
    (root / "dvc.yaml").write_text(
        "stages:\n  s:\n    cmd: x\n    outs:\n      - out/table.csv:\n          persist: true\n"
        "      - out/folder:\n          persist: true\n      - out/work:\n          persist: true\n"
        "          labels: [resume]\n      - out/nb.ipynb:\n          persist: true\n")
    (root / "out/folder").mkdir(parents=True)
    (root / "out/work").mkdir()
    (root / "out/table.csv").write_text("old table\n")
    (root / "out/folder/a.txt").write_text("old a\n")
    (root / "out/work/log.jsonl").write_text("old log\n")
    (root / "out/nb.ipynb").write_text("old notebook\n")


def test_a_failed_run_gets_its_previous_outputs_back(tmp_path):
    make_outputs(tmp_path)
    kept = keep_outputs("s", keep=(Path("out/nb.ipynb"),), root=tmp_path)
    # as under DVC's deletion: the notebook starts without its outputs, except the resumable one
    assert not (tmp_path / "out/table.csv").exists() and not (tmp_path / "out/folder").exists()
    assert (tmp_path / "out/work/log.jsonl").read_text() == "old log\n"
    (tmp_path / "out/folder").mkdir()
    (tmp_path / "out/folder/partial.txt").write_text("half a run\n")
    (tmp_path / "out/work/log.jsonl").write_text("old log\nnew record\n")
    (tmp_path / "out/nb.ipynb").write_text("the traceback\n")
    back = kept.restore()
    assert sorted(p.relative_to(tmp_path).as_posix() for p in back) == ["out/folder", "out/table.csv"]
    assert (tmp_path / "out/table.csv").read_text() == "old table\n"
    assert sorted(os.listdir(tmp_path / "out/folder")) == ["a.txt"]  # the partial output is gone
    assert (tmp_path / "out/work/log.jsonl").read_text() == "old log\nnew record\n"  # resumed work kept
    assert (tmp_path / "out/nb.ipynb").read_text() == "the traceback\n"
    assert not (tmp_path / C.PREV_OUTS_DIR / "s").exists()


def test_a_successful_run_replaces_them_and_a_killed_one_is_undone_by_the_next(tmp_path):
    make_outputs(tmp_path)
    keep_outputs("s", root=tmp_path)  # ... and the runner is killed: nothing restored in this process
    (tmp_path / "out/table.csv").write_text("half-written\n")
    kept = keep_outputs("s", root=tmp_path)  # the next run first puts back what the killed one moved
    assert kept.moved and not (tmp_path / "out/table.csv").exists()
    (tmp_path / "out/table.csv").write_text("new table\n")
    kept.discard()
    assert (tmp_path / "out/table.csv").read_text() == "new table\n" and not (tmp_path / "out/folder").exists()
    assert not (tmp_path / C.PREV_OUTS_DIR).exists()
    assert not KeptOutputs("", tmp_path).restore()  # outside DVC (no stage): nothing moves, nothing restored


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_missing_photo_folder_keeps_the_sources_outputs(tmp_path):
    """The issue's case with the real dvc: a finished `sources` (outputs committed to dvc.lock), then
    sources.input_dir points at a missing folder. `dvc repro sources` fails in the notebook, and
    afterwards every output file is as before and `dvc status` shows no output deleted."""
    root, env = make_pipeline_copy(tmp_path)
    sources = root / "data/vlm/sources"
    (sources / "cook").mkdir(parents=True)
    (sources / "cook/a.png").write_bytes(b"a finished source photo")
    (sources / "manifest.parquet").write_bytes(b"a finished manifest")
    (root / "reports/notebooks").mkdir(parents=True)
    (root / "reports/notebooks/vlm_sources.ipynb").write_text("{}")
    assert dvc(root, env, "repro", "check").returncode == 0
    committed = dvc(root, env, "commit", "-f", "sources")
    assert committed.returncode == 0, committed.stderr
    before = tree(sources)
    # 1. the folder is missing: the stage cannot start (the runner's preflight stops it before the kernel)
    # 2. the folder exists but holds no photo: the notebook itself fails, after the runner moved the
    #    outputs aside, and the runner puts them back
    for folder, cause in (("data/vlm/no_such_folder", "missing input data/vlm/no_such_folder"),
                          ("data/vlm/empty_folder", "no photos under data/vlm/empty_folder")):
        (root / "data/vlm/empty_folder").mkdir(exist_ok=True)
        set_params(root / "params.yaml", sources__source="folder", sources__input_dir=folder)
        run = dvc(root, env, "repro", "sources")
        log = run.stdout + run.stderr
        assert run.returncode != 0 and cause in log, log[-3000:]
        assert tree(sources) == before, folder
        status = dvc(root, env, "status", "sources")
        assert status.returncode == 0 and "deleted" not in status.stdout, status.stdout
        assert not (root / C.PREV_OUTS_DIR).exists() or not any((root / C.PREV_OUTS_DIR).iterdir())
    assert "previous outputs are kept: data/vlm/sources" in log
