"""A stage that fails keeps its outputs (every stage the notebook runner runs).

DVC removes a stage's outputs right before it runs the stage's command, unless they are `persist: true`;
a stage that then cannot start (a missing input folder, a missing weight, a model server that is down)
would leave the pipeline without them. So every output in dvc.yaml is `persist: true`, and the runner
(`scripts/run-notebook` → report/execute.py) does what DVC did, reversibly:

1. before the notebook runs, each output of the stage is *moved aside* (one rename, into
   `.prev-outs/<stage>/`): the notebook starts without it, exactly as under DVC's deletion;
2. when the notebook succeeds, what was moved aside is deleted (DVC then commits the new outputs);
   when it fails, whatever the failed run left at an output's path is removed and the previous output
   is renamed back, so `dvc status` shows the stage as changed, never its outputs as deleted.

A runner killed between 1 and 2 leaves `.prev-outs/<stage>/`; the next run of that stage puts it back
first. Outputs labelled `resume` in dvc.yaml (`labels: [resume]`: a stage's own resumable work, e.g. the
image folder with its record log) and the executed notebook (its traceback is the record of a failure)
stay in place. The check stage writes its folder itself, atomically, and is not run by the runner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from biasaudit import contracts as C

RESUME_LABEL = "resume"  # an output a stage resumes in place (never moved aside)
_VAR = re.compile(r"\$\{\s*([A-Za-z_][\w.-]*)\s*\}")


def _lookup(params: dict[str, Any], dotted: str) -> Any:
    node: Any = params
    for part in dotted.split("."):
        node = node[part]
    return node


def interpolate(text: str, key: str, params: dict[str, Any]) -> str:
    """dvc.yaml's `${key}` (a foreach entry's key) and `${section.name}` (a params.yaml value)."""
    return _VAR.sub(lambda m: key if m.group(1) == "key" else str(_lookup(params, m.group(1))), text)


@dataclass
class Out:
    path: Path
    labels: tuple[str, ...] = ()
    persist: bool = False


def stage_outputs(stage: str, root: str | os.PathLike = ".") -> list[Out]:
    """The outputs of a dvc.yaml stage (`name`, or `name@key` of a foreach; its outs, metrics and plots),
    paths interpolated."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the same values, 10x faster (every stage start)

    root = Path(root)
    dvc_yaml = root / "dvc.yaml"
    if not stage or not dvc_yaml.exists():
        return []
    name, _, key = stage.rpartition(":")[2].partition("@")
    spec = (yaml.load(dvc_yaml.read_text(), Loader=loader) or {}).get("stages", {}).get(name) or {}
    spec = spec.get("do", spec)
    params_file = root / "params.yaml"
    params = (yaml.load(params_file.read_text(), Loader=loader) or {}) if params_file.exists() else {}
    outs = []
    for out in [*(spec.get("outs") or []), *(spec.get("metrics") or []), *(spec.get("plots") or [])]:
        path, opts = (next(iter(out.items())) if isinstance(out, dict) else (out, {}))
        opts = opts or {}
        outs.append(Out(Path(interpolate(str(path), key, params)), tuple(opts.get("labels") or ()),
                        bool(opts.get("persist"))))
    return outs


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@dataclass
class KeptOutputs:
    """The outputs of one stage run, moved aside until the run's outcome is known."""

    stage: str
    root: Path
    moved: list[tuple[Path, Path]] = field(default_factory=list)  # (output path, where it waits)

    @property
    def folder(self) -> Path:
        return self.root / C.PREV_OUTS_DIR / self.stage.replace("/", "_").replace(":", "_")

    @property
    def manifest(self) -> Path:
        return self.folder / "moved.json"

    def move_aside(self, outs: list[Out], keep: tuple[Path, ...] = ()) -> "KeptOutputs":
        """Put back what a killed earlier run left aside, then move this run's outputs aside."""
        self.restore()
        keep_set = {os.path.normpath(p) for p in keep}
        todo = [o.path for o in outs if RESUME_LABEL not in o.labels and os.path.normpath(o.path) not in keep_set]
        self.folder.mkdir(parents=True, exist_ok=True)
        for i, rel in enumerate(todo):
            path = self.root / rel
            if not (path.exists() or path.is_symlink()):
                continue
            aside = self.folder / str(i)
            self.moved.append((path, aside))
            self._write_manifest()  # before the rename: a kill right after it still knows where it went
            os.replace(path, aside)
        return self

    def _write_manifest(self) -> None:
        from biasaudit.pipeline.io import atomic_write_text

        atomic_write_text(self.manifest, json.dumps([[str(p), str(a)] for p, a in self.moved]) + "\n")

    def restore(self) -> list[Path]:
        """The run failed (or was killed): every output moved aside goes back to its path, replacing what
        the failed run left there. Returns the outputs put back."""
        if not self.stage:
            return []
        if not self.moved and self.manifest.exists():
            self.moved = [(Path(p), Path(a)) for p, a in json.loads(self.manifest.read_text())]
        back = []
        for path, aside in self.moved:
            if aside.exists() or aside.is_symlink():
                _remove(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(aside, path)
                back.append(path)
        self._clear()
        return back

    def discard(self) -> None:
        """The run succeeded: its outputs replace the previous ones for good."""
        if not self.stage:
            return
        self._clear()

    def _clear(self) -> None:
        self.moved = []
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.folder.parent.rmdir()  # the last stage's: no empty .prev-outs/ left behind
        except OSError:
            pass


def keep_outputs(stage: str, keep: tuple[Path, ...] = (), root: str | os.PathLike = ".") -> KeptOutputs:
    """Move the outputs of `stage` aside before its notebook runs (see the module docstring)."""
    root = Path(root)
    kept = KeptOutputs(stage.rpartition(":")[2], root)
    return kept.move_aside(stage_outputs(stage, root), keep) if stage else kept  # outside DVC: nothing moves
