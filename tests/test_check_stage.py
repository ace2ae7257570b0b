"""Validation before deletion: with an invalid parameter, `dvc repro` stops at the check stage and
nothing in data/ or reports/ is removed (many outputs are cache: false / persist and could not be
restored). Runs the real dvc on a copy of the pipeline whose every output already exists."""

import hashlib
from pathlib import Path

import pytest
import yaml

from .pipeline_copy import dvc, make_pipeline_copy, set_params


def tree_hash(root: Path) -> dict[str, str]:
    out = {}
    for top in ("data", "reports"):
        for p in sorted((root / top).rglob("*")):
            if p.is_file():
                out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def pipeline_copy(tmp_path):
    root, env = make_pipeline_copy(tmp_path)
    # every output of every stage exists (a finished earlier run), as a file or a folder with a file
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        outs = [str(o.def_path) for s in repo.index.stages for o in s.outs]
    for out in outs:
        path = root / out
        if path.suffix:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"finished result {out}\n")
        else:
            path.mkdir(parents=True, exist_ok=True)
            (path / "result.txt").write_text(f"finished result {out}\n")
    return root, env


@pytest.mark.slow
@pytest.mark.parametrize("dotted, value", [("analyze.ci_level", 1.5), ("classify.vlm.backend", "nope"),
                                           ("profile", "nosuch")])  # a profile that does not exist (issue #46)
def test_invalid_params_stop_dvc_repro_before_any_output_is_removed(pipeline_copy, dotted, value):
    root, env = pipeline_copy
    set_params(root / "params.yaml", **{dotted.replace(".", "__"): value})
    before = tree_hash(root)
    run = dvc(root, env, "repro")
    log = run.stdout + run.stderr
    assert run.returncode != 0
    assert dotted in log and "failed to reproduce 'check'" in log
    after = tree_hash(root)
    # nothing removed or changed, the check stage's own folder included (every output is persist: true),
    # so its message "no output was touched" is true
    assert before == after and any(k.startswith("data/check/") for k in after)
    assert "no output was touched" in log


def test_fingerprints_follow_the_content_of_input_folders(tmp_path):
    """A folder generator's folder and mapping CSV, and sources.input_dir, are hashed file by file:
    changing one photo changes exactly the fingerprints of the stages that read it."""
    from biasaudit.check import external_inputs, refresh
    from biasaudit.config import load_params, validate
    from biasaudit.params import Params

    from .conftest import ROOT

    photos, imported = tmp_path / "photos", tmp_path / "imported"
    (photos / "doctor").mkdir(parents=True)
    imported.mkdir()
    (photos / "doctor" / "a.jpg").write_bytes(b"photo a")
    (imported / "x.png").write_bytes(b"image x")
    (tmp_path / "map.csv").write_text("file,prompt_id\nx.png,occ_x\n")
    raw = load_params(ROOT / "params.yaml").model_dump()
    raw["models"]["mine"] = {"backend": "folder", "folder": str(imported), "mapping_csv": str(tmp_path / "map.csv")}
    raw["sources"] |= {"source": "folder", "input_dir": str(photos)}
    cfg: Params = validate(raw)
    inputs = external_inputs(cfg)
    assert inputs["generate_mine"] == [str(imported), str(tmp_path / "map.csv")] and inputs["generate_planted-a"] == []
    assert inputs["sources"] == [str(photos)]

    def snapshot():
        out = tmp_path / "check"
        refresh(cfg, out)
        return {p.name: p.read_text() for p in out.iterdir()}

    first = snapshot()
    assert first["params.ok"] == "valid\n"
    (photos / "doctor" / "a.jpg").write_bytes(b"photo a, retouched")
    second = snapshot()
    assert [k for k in first if first[k] != second[k]] == ["sources.inputs.json"]
    (tmp_path / "map.csv").write_text("file,prompt_id\nx.png,occ_y\n")
    third = snapshot()
    assert [k for k in first if second[k] != third[k]] == ["generate_mine.inputs.json"]


@pytest.mark.slow
def test_check_names_unusable_entries_and_missing_folders_of_a_folder_generator(tmp_path, capsys):
    """`check` walks a folder generator's folder as it does sources.input_dir: broken links and link
    loops (real symlinks) are named per entry, a missing folder or mapping CSV is a missing input, and
    `biasaudit check` fails on either."""
    from biasaudit import weights
    from biasaudit.check import input_problems
    from biasaudit.cli import main as cli_main
    from biasaudit.config import load_params, validate

    from .conftest import ROOT

    imported, photos = tmp_path / "imported", tmp_path / "photos"
    (imported / "sub").mkdir(parents=True)
    (photos / "doctor").mkdir(parents=True)
    (imported / "x.png").write_bytes(b"image x")
    (imported / "gone.png").symlink_to("deleted.png")
    (imported / "sub" / "loop.png").symlink_to("loop.png")
    (photos / "doctor" / "a.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "map.csv").write_text("file,prompt_id\nx.png,occ_x\n")
    raw = load_params(ROOT / "params.yaml").model_dump()
    raw["models"]["mine"] = {"backend": "folder", "folder": str(imported), "mapping_csv": str(tmp_path / "map.csv")}
    raw["models"]["lost"] = {"backend": "folder", "folder": str(tmp_path / "no-such"),
                             "mapping_csv": str(tmp_path / "map.csv")}
    raw["sources"] |= {"source": "folder", "input_dir": str(photos)}
    cfg = validate(raw)
    problems = input_problems(cfg)
    assert len(problems) == 3
    assert f"{imported.as_posix()}/gone.png: broken link: 'gone.png' → 'deleted.png', which does not exist" in problems
    assert any(p.startswith(f"{imported.as_posix()}/sub/loop.png: link loop") for p in problems)
    assert any(p.startswith(f"{photos.as_posix()}/doctor/a.jpg: broken link") for p in problems)
    assert input_problems(cfg, "generate@mine") == [p for p in problems if p.startswith(imported.as_posix())]
    lacking = {(n.kind, n.what, n.used_by) for n in weights.missing(cfg)}
    assert ("input", str(tmp_path / "no-such"), "models.lost.folder") in lacking
    assert not any(what == str(imported) for _, what, _ in lacking)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert cli_main(["check", "--params", str(tmp_path / "params.yaml"), "--stage", "generate@mine"]) == 1
    assert "gone.png: broken link" in capsys.readouterr().out


@pytest.mark.slow
def test_nothing_changed_runs_no_stage_and_a_changed_photo_only_its_reader(pipeline_copy):
    """`check` is not always_changed: with nothing changed DVC finds every stage up to date, `check`
    included; a photo edited inside sources.input_dir (a folder DVC cannot list: params name it) is
    seen once `biasaudit check` refreshed the fingerprints (as `make demo` does first): then exactly
    `check` and the one stage that reads the folder are changed. A plain `dvc repro` does not see it."""
    import json
    import subprocess
    import sys

    root, env = pipeline_copy
    photos = root / "photos" / "doctor"
    photos.mkdir(parents=True)
    (photos / "a.jpg").write_bytes(b"photo a")
    set_params(root / "params.yaml", sources__source="folder", sources__input_dir="photos")
    (root / "benchmarks/results").mkdir(parents=True)
    (root / "benchmarks/results/calibration.csv").write_text("finished result\n")  # analyze's input

    def biasaudit_check():
        done = subprocess.run([sys.executable, "-m", "biasaudit", "check"], cwd=root, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        return done.stderr

    def changed() -> dict:
        done = dvc(root, env, "status", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout or "{}")

    biasaudit_check()
    assert dvc(root, env, "commit", "--force", "--quiet").returncode == 0  # every stage recorded as run
    assert changed() == {}  # nothing changed: `dvc repro` runs no stage, not even check
    fingerprints = {p.name: p.stat().st_mtime_ns for p in (root / "data/check").iterdir()}
    assert "inputs changed" not in biasaudit_check()
    assert {p.name: p.stat().st_mtime_ns for p in (root / "data/check").iterdir()} == fingerprints  # not rewritten
    assert changed() == {}

    (photos / "a.jpg").write_bytes(b"photo a, retouched")
    assert changed() == {}  # what a plain `dvc repro` misses (README): the folder is no dep of any stage
    assert "inputs changed for sources" in biasaudit_check()
    status = changed()
    assert sorted(status) == ["check", "sources"], status
    assert status["sources"] == [{"changed deps": {"data/check/sources.inputs.json": "modified"}}]
