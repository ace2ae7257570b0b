"""Switching profiles back and forth is cheap: each profile's outputs wait in a stash while another runs.

DVC's run cache cannot bring a profile's outputs back: it skips every stage with a `persist: true`
output (dvc/stage/cache.py, `_can_hash`), and every output here is persist (biasaudit/pipeline/keep_outputs.py),
besides the `cache: false` ones it never saves. So `biasaudit profile <name>` does it itself:

1. **stash**: before params.yaml changes, every output of every stage instance of the current profile
   (as DVC resolves dvc.yaml for the current params.yaml) is *moved* (one rename each) into
   `.dvc/tmp/profile-stash/<profile>/` with the `dvc.lock` entries that vouch for them, and those entries
   leave `dvc.lock`. A file git tracks (metrics/headline.json) is copied instead, so the tree keeps it.
2. **restore**: after params.yaml changed, a stash of the new profile is moved back and its lock entries
   written back (the stashed `dvc.lock` text itself, byte for byte, when nothing else changed), then
   DVC is asked: `dvc status` names every restored stage whose code, parameters or inputs changed since
   it was stashed. Those are never served as current: `dvc repro` re-runs them (their lock entries say
   what they were made from) and what depends on them; the message names them. The others are up to
   date, so `dvc repro` after switching back runs no stage.

A stash is consumed when restored. A kill at any point of a switch loses no output and no lock entry:
each output's slot is recorded before its rename, the stash's copy of `dvc.lock` is written before
`dvc.lock` loses the entries, a restore takes the stash's entry or else keeps dvc.lock's, and a stash
is deleted last (renamed away first). The next `biasaudit profile`, whatever its target, first
finishes the switch (`resume`: a stash of the current profile is put back), and so does stashing a
profile that has an older stash (one made with `--no-stash`): what it holds goes back where nothing
holds its path now, with its lock entries, and the rest is dropped (the outputs in place supersede it). The stash lives in
DVC's scratch folder (ignored by git), on the same filesystem, so both steps are renames, not copies.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biasaudit import contracts as C

LOCK_FILE = "dvc.lock"


@dataclass
class Report:
    """What a stash or a restore did (for the command's message and the tests)."""

    profile: str
    stages: list[str] = field(default_factory=list)  # stage instances moved (stash) or put back (restore)
    outputs: int = 0
    changed: list[str] = field(default_factory=list)  # restored, but DVC finds them changed since
    skipped: list[str] = field(default_factory=list)  # dropped: gone from dvc.yaml, or an output's path is taken


def stash_dir(profile: str, root: str | os.PathLike = ".") -> Path:
    return Path(root) / C.PROFILE_STASH_DIR / profile


def is_dvc_project(root: str | os.PathLike = ".") -> bool:
    return (Path(root) / "dvc.yaml").is_file() and (Path(root) / ".dvc").is_dir()


def _stage_outputs(repo: Any) -> dict[str, list[str]]:
    """Stage instance → its outputs (outs, metrics, plots), as DVC resolves dvc.yaml now."""
    root = Path(repo.root_dir)
    return {stage.addressing: [Path(os.path.relpath(out.fs_path, root)).as_posix() for out in stage.outs]
            for stage in repo.index.stages if stage.cmd}


def _git_tracked(root: Path, paths: list[str]) -> set[str]:
    """The paths among `paths` that git tracks (copied, not moved: the tree keeps them)."""
    if not paths:
        return set()
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=root, capture_output=True, text=True,
                              check=False)
    except OSError:
        return set()
    return set(filter(None, done.stdout.split("\0"))) if done.returncode == 0 else set()


def _move(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError:  # another filesystem (an output path a parameter moved elsewhere)
        shutil.move(str(src), str(dst))


def _copy(src: Path, dst: Path) -> None:
    """Copy under a temporary name, then rename: a copy killed halfway leaves no slot, never a truncated one
    (the next switch would move it over the intact original)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    part = dst.with_name(dst.name + ".partial")
    _remove(part)
    if src.is_dir():
        shutil.copytree(src, part, symlinks=True)
    else:
        shutil.copy2(src, part)
    os.replace(part, dst)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _load_lock(text: str) -> Any:
    from dvc.utils.serialize import parse_yaml_for_update

    return parse_yaml_for_update(text, LOCK_FILE) or {}


def _dump_lock(data: Any) -> str:
    from dvc.utils.serialize import dumps_yaml

    return dumps_yaml(data)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _discard(source: Path) -> None:
    """Remove a stash: renamed away first (one atomic step), so a kill while it is deleted leaves no
    half stash that a later switch would take for one; leftovers of such a kill go too."""
    trash = source.with_name(f".{source.name}.trash")
    if _exists(source):
        _remove(trash)
        os.replace(source, trash)
    _remove(trash)


def _put_back(profile: str, root: Path, now: dict[str, list[str]]) -> Report | None:
    """Move the stash of `profile` back and merge its dvc.lock entries into dvc.lock; None without one.
    Resumable: a switch killed anywhere in it (or in the stash before it) is finished by calling it
    again. An output whose slot is empty is already back (or was never moved: a kill before its rename);
    a stage is dropped only when dvc.yaml no longer defines it, or when its stashed output and another
    file at its path both exist. A restored stage takes its stashed lock entry, else keeps the one
    dvc.lock has (a stash killed before it took the entries away), so no entry is ever lost."""
    from biasaudit.pipeline.io import atomic_write_text

    source = stash_dir(profile, root)
    manifest_path = source / "manifest.json"
    if not manifest_path.is_file():
        _discard(source)  # killed before its manifest: nothing was moved yet
        return None
    manifest = json.loads(manifest_path.read_text())
    report = Report(profile)
    occupied = {o["stage"] for o in manifest["outputs"]
                if o["how"] == "moved" and _exists(source / o["slot"]) and _exists(root / o["path"])}
    report.skipped = [s for s in manifest["stages"] if s not in now or s in occupied]
    report.stages = [s for s in manifest["stages"] if s not in report.skipped]
    for out in manifest["outputs"]:
        src, dst = source / out["slot"], root / out["path"]
        if out["stage"] not in report.stages or out["path"] not in now[out["stage"]] or not _exists(src):
            continue  # (an output dvc.yaml no longer declares is dropped with the stash)
        if out["how"] == "copied":
            _remove(dst)
        _move(src, dst)
        report.outputs += 1
    lock_path = root / LOCK_FILE
    current_text = lock_path.read_text(encoding="utf-8") if lock_path.is_file() else ""
    current = _load_lock(current_text) if current_text else {}
    stashed_path = source / LOCK_FILE
    stashed_text = stashed_path.read_text(encoding="utf-8") if stashed_path.is_file() else ""
    stashed = _load_lock(stashed_text) if stashed_text else {}
    entries = stashed.get("stages") or {}
    now_entries = current.get("stages") or {}
    restored = {s: entries[s] if s in entries else now_entries[s] for s in report.stages
                if s in entries or s in now_entries}
    kept = {s: e for s, e in now_entries.items() if s not in report.stages}
    # the stashed order; an entry of a stage not restored is the current lock's (or gone), then the rest
    merged = {s: (restored[s] if s in restored else kept[s]) for s in entries if s in restored or s in kept}
    merged |= {s: e for s, e in {**restored, **kept}.items() if s not in merged}
    if merged:
        if merged == dict(entries):
            text = stashed_text  # byte for byte what dvc.lock was when the profile was left
        else:
            data = stashed if stashed else (current if current else {"schema": "2.0"})
            data["stages"] = merged
            text = _dump_lock(data)
        if text != current_text:
            atomic_write_text(lock_path, text)
    _discard(source)  # last: until here a kill leaves a stash that the next call finishes
    return report


def stash(profile: str, root: str | os.PathLike = ".") -> Report:
    """Move the outputs of `profile` (the current one) and their dvc.lock entries into its stash."""
    from dvc.repo import Repo, lock_repo

    from biasaudit.pipeline.io import atomic_write_text

    root = Path(root).resolve()
    report = Report(profile)
    with Repo(str(root)) as repo, lock_repo(repo):  # refused while a `dvc repro` holds the repository
        outputs = _stage_outputs(repo)
        lock_path = root / LOCK_FILE
        lock_text = lock_path.read_text(encoding="utf-8") if lock_path.is_file() else ""
        lock = _load_lock(lock_text) if lock_text else {}
        entries = lock.get("stages") or {}
        target = stash_dir(profile, root)
        if _exists(target):  # an older stash of this profile (a switch that was killed, or made without one)
            _put_back(profile, root, outputs)
            lock_text = lock_path.read_text(encoding="utf-8") if lock_path.is_file() else ""
            lock = _load_lock(lock_text) if lock_text else {}
            entries = lock.get("stages") or {}
        present = {s: [p for p in outs if (root / p).exists() or (root / p).is_symlink()] for s, outs in outputs.items()}
        tracked = _git_tracked(root, [p for s in outputs for p in present[s]])
        # a stage with a lock entry or an output of its own (a git-tracked file alone is the tree's, not a run's)
        stages = [s for s in outputs if s in entries or any(p not in tracked for p in present[s])]
        if not stages:
            return report
        (target / "outs").mkdir(parents=True)
        moved: list[dict[str, str]] = []
        manifest = target / "manifest.json"
        for stage in stages:
            for rel in present[stage]:
                slot = f"outs/{len(moved)}"
                how = "copied" if rel in tracked else "moved"
                moved.append({"stage": stage, "path": rel, "slot": slot, "how": how})
                atomic_write_text(manifest, json.dumps({"profile": profile, "stages": stages, "outputs": moved},
                                                       indent=1) + "\n")  # before the rename: a kill loses nothing
                (_copy if how == "copied" else _move)(root / rel, target / slot)
        atomic_write_text(manifest, json.dumps({"profile": profile, "stages": stages, "outputs": moved}, indent=1) + "\n")
        atomic_write_text(target / LOCK_FILE, lock_text)
        if lock_text:
            for stage in stages:
                entries.pop(stage, None)
            atomic_write_text(lock_path, _dump_lock(lock))
        report.stages, report.outputs = stages, len(moved)
    return report


def restore(profile: str, root: str | os.PathLike = ".") -> Report | None:
    """Put the stash of `profile` (now the current one) back and ask DVC which restored stages changed
    since; None when there is no stash. Also what finishes a switch killed halfway (`resume`)."""
    from dvc.repo import Repo, lock_repo

    root = Path(root).resolve()
    if not _exists(stash_dir(profile, root)):
        return None
    with Repo(str(root)) as repo, lock_repo(repo):
        report = _put_back(profile, root, _stage_outputs(repo))
    if report is None:
        return None
    with Repo(str(root)) as repo:  # DVC's own verdict on what was restored
        status = repo.status()
    report.changed = [s for s in report.stages if s in status]
    return report


def resume(profile: str, root: str | os.PathLike = ".") -> Report | None:
    """A stash of the current profile exists only when a switch was killed (or params.yaml was switched
    back by hand): its outputs and lock entries go back before anything else moves, whatever profile the
    next switch goes to; None when there is none."""
    return restore(profile, root)


def describe_stash(report: Report) -> str:
    if not report.stages:
        return f"profile '{report.profile}': no outputs to stash"
    return (f"stashed the outputs of profile '{report.profile}' ({report.outputs} outputs of "
            f"{len(report.stages)} stages) in {C.PROFILE_STASH_DIR}/{report.profile}/")


def describe_restore(report: Report | None, profile: str) -> str:
    if report is None:
        return f"no stash of profile '{profile}': `dvc repro` runs its stages"
    lines = [f"restored the outputs of profile '{profile}' ({report.outputs} outputs of {len(report.stages)} stages)"]
    if report.changed:
        lines.append(f"  DVC finds {len(report.changed)} of them changed since they were stashed (code, parameters or "
                     f"inputs): {', '.join(report.changed)}; `dvc repro` re-runs them and what depends on them")
    else:
        lines.append("  DVC finds every one up to date: `dvc repro` runs no stage")
    if report.skipped:
        lines.append(f"  dropped, not restored (no longer in dvc.yaml, or another file holds an output's path; "
                     f"`dvc repro` runs what dvc.yaml defines): {', '.join(report.skipped)}")
    return "\n".join(lines)
