"""`biasaudit profile <name>` stashes the outputs of the profile it leaves and restores those of the one
it switches to, so switching back runs no stage (DVC's run cache cannot: every output is persist).
On a toy DVC project with this repository's params.yaml and profiles, the real dvc and git: what DVC
itself reports (`dvc status`, the stages `dvc repro` runs) is the oracle, never the stash's own word."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from biasaudit import cli

from .conftest import ROOT

MAKE = """import sys, pathlib
out, inputs = pathlib.Path(sys.argv[1]), sys.argv[2:]
with open("runs.log", "a") as log:  # not an output: which stages ran, in order
    log.write(out.as_posix() + "\\n")
body = out.as_posix() + "|" + pathlib.Path("params.yaml").read_text().count("\\n").__str__() + "|" + "".join(
    p.read_text() for i in inputs for p in sorted(pathlib.Path(i).rglob("*")) if p.is_file())
if out.suffix:
    out.parent.mkdir(parents=True, exist_ok=True); out.write_text(body)
else:
    out.mkdir(parents=True, exist_ok=True); (out / "image.txt").write_text(body)
"""


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=root,
                          capture_output=True, text=True, check=True)
    return done.stdout


def dvc(root: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def ran(root: Path, since: int) -> list[str]:
    return (root / "runs.log").read_text().splitlines()[since:] if (root / "runs.log").exists() else []


def status(root: Path) -> dict:
    return json.loads(dvc(root, "status", "--json").stdout or "{}")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """params.yaml and profiles/ of this repository; a stage per model (a folder each) and a summary
    (a file, cache: false) with a metrics file that git tracks, as the report stage's headline."""
    root = tmp_path / "p"
    root.mkdir()
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    shutil.copytree(ROOT / "profiles", root / "profiles")
    (root / "make.py").write_text(MAKE)
    (root / "lib.py").write_text("version = 1\n")
    py = sys.executable
    spec = {"stages": {
        "gen": {"foreach": "${models}", "do": {
            "cmd": f"{py} make.py out/gen/${{key}}", "deps": ["make.py"], "params": ["profile", "models.${key}"],
            "outs": [{"out/gen/${key}": {"persist": True}}]}},
        "summary": {"cmd": f"{py} make.py out/summary.txt out/gen lib.py && {py} make.py metrics/m.json out/summary.txt",
                    "deps": ["make.py", "lib.py", "out/gen"], "params": ["profile", "analyze.n_boot"],
                    "outs": [{"out/summary.txt": {"persist": True, "cache": False}}],
                    "metrics": [{"metrics/m.json": {"persist": True, "cache": False}}]}}}
    (root / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (root / ".gitignore").write_text("/out/\n/runs.log\n/.params-restore.yaml\n")
    git(root, "init", "-q")
    dvc(root, "init", "-q")
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    dvc(root, "repro", "--quiet")
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    lock = parse_yaml_for_update((root / "dvc.lock").read_text(), "dvc.lock")  # a stage dvc.yaml no longer has
    lock["stages"].insert(0, "gone", {"cmd": "echo gone", "outs": [{"path": "gone.txt", "hash": "md5", "md5": "0" * 32}]})
    (root / "dvc.lock").write_text(dumps_yaml(lock))  # (DVC keeps such entries; the lock is restored with it)
    git(root, "add", "-A")
    git(root, "commit", "-qm", "offline run")
    assert ran(root, 0) == ["out/gen/planted-a", "out/gen/planted-b", "out/summary.txt", "metrics/m.json"]
    return root


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for top in ("out", "metrics") for p in (root / top).rglob("*")
            if p.is_file()}


@pytest.mark.slow
def test_switching_back_restores_the_outputs_and_runs_no_stage(project, capsys):
    root = project
    offline = tree(root)
    lock = (root / "dvc.lock").read_bytes()

    assert cli.main(["profile", "paper"]) == 0
    out = capsys.readouterr().out
    assert "stashed the outputs of profile 'offline' (4 outputs of 3 stages)" in out
    assert "no stash of profile 'paper'" in out
    assert not (root / "out/gen/planted-a").exists() and not (root / "out/summary.txt").exists()  # moved away
    assert (root / "metrics/m.json").read_text() == offline["metrics/m.json"]  # git tracks it: copied
    stashed = root / ".dvc/tmp/profile-stash/offline/outs"
    assert sorted(p.name for p in stashed.iterdir()) == ["0", "1", "2", "3"]
    assert git(root, "status", "--porcelain", "--", "out", ".dvc") == ""  # the stash is ignored by git
    n = len(ran(root, 0))
    dvc(root, "repro", "--quiet")  # the paper profile's run
    assert sorted(ran(root, n)) == sorted(["out/gen/sd35-large-turbo", "out/gen/flux-schnell", "out/gen/imagen-4-fast",
                                           "out/summary.txt", "metrics/m.json"])
    paper = tree(root)

    assert cli.main(["profile", "offline"]) == 0
    out = capsys.readouterr().out
    assert "stashed the outputs of profile 'paper' (5 outputs of 4 stages)" in out
    assert "restored the outputs of profile 'offline' (4 outputs of 3 stages)" in out
    assert "DVC finds every one up to date" in out
    assert status(root) == {}
    n = len(ran(root, 0))
    dvc(root, "repro")
    assert ran(root, n) == []  # no stage ran
    assert tree(root) == offline and (root / "dvc.lock").read_bytes() == lock
    assert git(root, "status", "--porcelain") == ""  # params.yaml, dvc.lock and the tracked metrics as committed
    assert not (root / ".dvc/tmp/profile-stash/offline").exists()  # a restored stash is consumed

    assert cli.main(["profile", "paper"]) == 0  # and forth: the paper outputs come back the same way
    assert "DVC finds every one up to date" in capsys.readouterr().out
    assert status(root) == {} and tree(root) == paper


@pytest.mark.slow
def test_a_stash_made_stale_by_a_code_change_is_not_served_as_current(project, capsys):
    root = project
    assert cli.main(["profile", "paper"]) == 0
    dvc(root, "repro", "--quiet")
    (root / "lib.py").write_text("version = 2\n")  # the summary's code changed while the paper profile ran
    capsys.readouterr()
    assert cli.main(["profile", "offline"]) == 0
    out = capsys.readouterr().out
    assert "DVC finds 1 of them changed since they were stashed" in out and ": summary;" in out
    assert sorted(status(root)) == ["summary"]  # DVC's verdict: only the stage whose code changed
    n = len(ran(root, 0))
    dvc(root, "repro", "--quiet")
    assert ran(root, n) == ["out/summary.txt", "metrics/m.json"]  # re-made, the generators' folders reused
    assert status(root) == {}


@pytest.mark.slow
def test_an_invalid_profile_moves_nothing(project, capsys):
    root = project
    (root / "profiles/broken.yaml").write_text("analyze.n_boot: -1\n")
    before = tree(root)
    assert cli.main(["profile", "broken"]) == 2
    assert tree(root) == before and not (root / ".dvc/tmp/profile-stash").exists()
    assert git(root, "status", "--porcelain") == "?? profiles/broken.yaml\n"


@pytest.mark.slow
def test_an_older_stash_of_the_current_profile_is_put_back_not_deleted(project, capsys):
    """params.yaml switched back by hand (git checkout) while the offline outputs wait in their stash:
    the next switch puts them back first (nothing holds their paths), stashes them again with the lock
    entries, and switching back then finds them all up to date."""
    root = project
    offline = tree(root)
    assert cli.main(["profile", "paper"]) == 0
    capsys.readouterr()
    git(root, "checkout", "--", "params.yaml", "dvc.lock")  # back to offline without the command
    (root / ".params-restore.yaml").unlink()
    assert not (root / "out/summary.txt").exists()
    assert cli.main(["profile", "paper"]) == 0
    assert "(4 outputs of 3 stages)" in capsys.readouterr().out  # the older stash's outputs, stashed again
    assert cli.main(["profile", "offline"]) == 0
    assert "DVC finds every one up to date" in capsys.readouterr().out
    assert status(root) == {} and tree(root) == offline


class Killed(BaseException):
    """Stands for a SIGKILL: no `except Exception` in the code under test catches it."""


def kill_at(monkeypatch, step: int | None) -> list[str]:
    """Count the steps that change files during a switch (each rename, copy, removal, atomic write) and
    raise Killed before step number `step` (1-based; None: count only). Returns the steps seen."""
    import biasaudit.pipeline.io as bio
    from biasaudit.pipeline import profile_stash as ps
    seen: list[str] = []

    def wrap(name, fn):
        def step_fn(*a, **kw):
            seen.append(name)
            if step is not None and len(seen) == step:
                raise Killed(f"killed before step {step} ({name})")
            return fn(*a, **kw)
        return step_fn

    for mod, name in ((ps, "_move"), (ps, "_copy"), (ps, "_remove"), (bio, "atomic_write_text")):
        monkeypatch.setattr(mod, name, wrap(name, getattr(mod, name)))
    return seen


@pytest.mark.slow
def test_a_switch_killed_at_any_step_is_finished_by_the_next_one_and_loses_no_lock_entry(project, capsys):
    """Kill `biasaudit profile` before each of several steps, in both directions; the next switch (to the
    same target or back) finishes it. DVC is the oracle: after it, and after switching to the other
    profile, `dvc status` finds every stage up to date and the outputs are those of the profile's run."""
    root = project
    trees = {"offline": tree(root)}
    assert cli.main(["profile", "paper"]) == 0
    dvc(root, "repro", "--quiet")
    trees["paper"] = tree(root)
    other = {"offline": "paper", "paper": "offline"}
    steps = {}
    for target in ("offline", "paper"):  # a whole switch in each direction, counted
        with pytest.MonkeyPatch.context() as mp:
            seen = kill_at(mp, None)
            assert cli.main(["profile", target]) == 0
        steps[target] = len(seen)
    assert min(steps.values()) >= 10
    capsys.readouterr()
    current = "paper"
    n_runs = len(ran(root, 0))
    for i, fourteenths in enumerate((1, 3, 5, 7, 9, 11, 13)):  # 7 points spread over the switch
        target = other[current]
        k = max(1, round(fourteenths / 14 * steps[target]))
        with pytest.MonkeyPatch.context() as mp:
            kill_at(mp, k)
            with pytest.raises(Killed):
                cli.main(["profile", target])
        then = target if i % 2 == 0 else current  # the next switch: the same target, or back
        assert cli.main(["profile", then]) == 0, f"kill before step {k} of {current} -> {target}"
        assert status(root) == {} and tree(root) == trees[then], f"kill before step {k} of {current} -> {target}"
        assert cli.main(["profile", other[then]]) == 0
        assert status(root) == {} and tree(root) == trees[other[then]], f"kill before step {k} of {current} -> {target}"
        current = other[then]
        assert not list((root / ".dvc/tmp/profile-stash").glob(f"{current}*"))  # nothing of it left in a stash
    assert ran(root, n_runs) == []  # no stage ran again


def test_a_copy_killed_halfway_leaves_the_original_intact(project):
    """A kill inside the copy of a git-tracked output (half its bytes written): the next switch, back or to the
    same target, keeps the intact original; DVC finds every stage up to date."""
    from biasaudit.pipeline import profile_stash as ps

    root = project
    before = tree(root)
    real = shutil.copy2

    def half(src, dst, *a, **kw):
        data = Path(src).read_bytes()
        Path(dst).write_bytes(data[: len(data) // 2])
        raise Killed("killed inside a copy")

    for then in ("offline", "paper"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ps.shutil, "copy2", half)
            with pytest.raises(Killed):
                cli.main(["profile", "paper"])
        assert shutil.copy2 is real
        assert cli.main(["profile", then]) == 0
        if then == "offline":
            assert tree(root) == before and status(root) == {}
        else:
            assert cli.main(["profile", "offline"]) == 0
            assert tree(root) == before and status(root) == {}
