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


@lru_cache(maxsize=1)
def git_commit(repo: str | os.PathLike = ".") -> str:
    """HEAD commit, suffixed with '+dirty' when tracked files differ; 'unknown' outside git."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                             check=True).stdout.strip()
        # dvc.lock is rewritten by the very pipeline run being recorded: not a code change
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!dvc.lock"],
                               cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


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
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_info(params_section: Any = None) -> dict[str, Any]:
    """Provenance block written beside every stage output."""
    info = {"git_commit": git_commit(), "created_at": utc_now(), "libraries": library_versions()}
    if params_section is not None:
        info["params_hash"] = stable_hash(params_section)
    return info


def write_run_info(path: str | os.PathLike, **extra: Any) -> Path:
    from biasaudit.io import atomic_write_text

    info = run_info() | extra
    return atomic_write_text(path, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
