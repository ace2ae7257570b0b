"""What produced a result: code version, parameters, library versions, seeds."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_LIBRARIES = (
    "biasaudit", "torch", "diffusers", "transformers", "open_clip_torch", "insightface", "onnxruntime",
    "dlib-bin", "scikit-image", "colour-science", "statsmodels", "scikit-learn", "numpy", "pandas",
    "google-genai", "openai",
)


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in TRACKED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def library_versions_json() -> str:
    return json.dumps(library_versions(), sort_keys=True)


# A tracked output must hash the same in every run of the same code (a fresh clone's `make demo` leaves
# `git status` clean and a second run runs nothing), so provenance names the code, not the run: the last
# commit that changed what the pipeline runs (CODE_PATHS: committing the dvc.lock a run wrote, the docs or
# the tests changes no output), and timestamps are that commit's time (the reproducible-builds
# convention; SOURCE_DATE_EPOCH overrides it). When each stage really ran, and for how long, is in
# reports/runs/<notebook>.json (biasaudit.report.execute).
CODE_PATHS = ("src", "notebooks", "scripts", "dvc.yaml", "params.yaml", "profiles", "data/reference")


@lru_cache(maxsize=4)
def _code_commit(repo: str) -> tuple[str, int | None]:
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=repo, capture_output=True, text=True,
                             check=True).stdout.strip()
        paths = ["--", *(p for p in CODE_PATHS if (Path(top) / p).exists())]
        sha, _, stamp = subprocess.run(["git", "log", "-1", "--format=%H %ct", *paths], cwd=top,
                                       capture_output=True, text=True, check=True).stdout.strip().partition(" ")
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", *paths], cwd=top,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown", None
    if not sha:
        return "unknown", None
    return sha + ("+dirty" if dirty else ""), (None if dirty else int(stamp))


def git_commit(repo: str | os.PathLike = ".") -> str:
    """The commit of the code: the last one that changed a CODE_PATHS path, suffixed with '+dirty'
    when one of them differs from it; 'unknown' outside git."""
    return _code_commit(str(repo))[0]


def stable_hash(obj: Any, length: int = 16) -> str:
    """Hash of a JSON-serialisable object that does not depend on dict order."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def derive_seed(*parts: Any) -> int:
    """Deterministic 63-bit seed from any parts, e.g. (model, prompt_id, index)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def utc_now() -> str:
    """The timestamp an output records: SOURCE_DATE_EPOCH when set, else the time of the code's commit
    (git_commit), else — uncommitted changes, no git — the wall clock."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH") or _code_commit(".")[1]
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch else datetime.now(timezone.utc)
    return when.isoformat(timespec="seconds")


def git_commit_date(repo: str | os.PathLike = ".") -> str:
    """The date of the code's commit (git_commit), or '' when the code differs from it or there is no git."""
    stamp = _code_commit(str(repo))[1]
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds") if stamp else ""


def answer_time(stand_in: bool) -> str:
    """When a model answered, as its answer records it (the answer cache keeps it, so a re-run with cached answers
    writes the same bytes): the wall clock for a model under audit; for a stand-in, whose answers are a function
    of the code, the reproducible timestamp (utc_now), so fresh clones write identical outputs."""
    return utc_now() if stand_in else datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_info(params_section: Any = None) -> dict[str, Any]:
    """Provenance block written beside every stage output."""
    info = {"git_commit": git_commit(), "created_at": utc_now(), "libraries": library_versions()}
    if params_section is not None:
        info["params_hash"] = stable_hash(params_section)
    return info


def write_run_info(path: str | os.PathLike, **extra: Any) -> Path:
    from biasaudit.pipeline.io import atomic_write_text

    info = run_info() | extra
    return atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
