"""Hosted models change under the same name: their lifecycle as data, and who answered.

`data/reference/models/lifecycle.yaml` holds one entry per hosted model id a profile names: its status
(`served`, `deprecated` with the announced shutdown date, or `retired` with the date it stopped, its named
replacement), the provider's page that says so and the day it was read, and `aliases` — the other names the
API may report for it (`modelVersion`, the OpenAI-compatible `model`). `biasaudit check` lists every retired
model as a missing need (weights.needs), so a profile that names one exits 1 before any request.

`answered_as_asked(asked, reported)` is the rule every hosted backend applies to each answer: the name the
API reports must be the model asked, a dated snapshot of it (`gpt-5` → `gpt-5-2025-08-07`,
`gemini-2.0-flash` → `gemini-2.0-flash-001`), or one of its declared aliases (fnmatch patterns). Anything
else is a re-routed answer: it is failed (never cached) and the stage stops, naming both.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

LIFECYCLE_FILE = Path("data/reference/models/lifecycle.yaml")
STATUSES = ("served", "deprecated", "retired")
# a snapshot suffix the providers append to the name asked: -2025-08-07 (OpenAI, DashScope), -001 (Google),
# -09-2025 (Google previews), -20250807
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{2}-\d{4}|\d{3}|\d{8})$")


@dataclass(frozen=True)
class ModelStatus:
    model_id: str
    provider: str
    status: str                   # served | deprecated | retired
    source: str                   # the provider's page that says so
    checked: str                  # the day that page was read (YYYY-MM-DD)
    date: str = ""                # deprecated: announced shutdown; retired: the day it stopped
    replacement: str = ""         # the provider's named replacement (retired and deprecated)
    aliases: tuple[str, ...] = ()  # other names the API may report for this model (fnmatch patterns)
    note: str = ""

    def line(self) -> str:
        """One line for `biasaudit check` and the run records."""
        if self.status == "retired":
            return (f"{self.model_id} ({self.provider}) retired on {self.date}; replacement {self.replacement or '-'} "
                    f"(source: {self.source}, read {self.checked})")
        if self.status == "deprecated":
            return (f"{self.model_id} ({self.provider}) deprecated, shutdown {self.date}; replacement "
                    f"{self.replacement or '-'} (source: {self.source}, read {self.checked})")
        return f"{self.model_id} ({self.provider}) served (source: {self.source}, read {self.checked})"

    def record(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "provider": self.provider, "status": self.status, "date": self.date,
                "replacement": self.replacement, "source": self.source, "checked": self.checked}


def lifecycle_path() -> Path:
    """The working directory's data/reference/models/lifecycle.yaml, else the project's own."""
    if LIFECYCLE_FILE.is_file():
        return LIFECYCLE_FILE
    return Path(__file__).resolve().parents[2] / LIFECYCLE_FILE


def parse(data: dict[str, Any], where: str = "lifecycle") -> dict[str, ModelStatus]:
    """{model id: ModelStatus} from the YAML mapping; a ValueError naming the entry and key otherwise."""
    out: dict[str, ModelStatus] = {}
    for model_id, entry in (data.get("models") or {}).items():
        entry = dict(entry or {})
        status = entry.get("status")
        if status not in STATUSES:
            raise ValueError(f"{where}: models.{model_id}.status must be one of {STATUSES}, got {status!r}")
        for key in ("provider", "source", "checked"):
            if not entry.get(key):
                raise ValueError(f"{where}: models.{model_id}.{key} is required")
        if status != "served":
            if not entry.get("date"):
                raise ValueError(f"{where}: models.{model_id}.date is required for a {status} model")
            date.fromisoformat(str(entry["date"]))
        if status == "retired" and not entry.get("replacement"):
            raise ValueError(f"{where}: models.{model_id}.replacement is required for a retired model")
        out[str(model_id)] = ModelStatus(
            model_id=str(model_id), provider=str(entry["provider"]), status=status, source=str(entry["source"]),
            checked=str(entry["checked"]), date=str(entry.get("date") or ""),
            replacement=str(entry.get("replacement") or ""), aliases=tuple(entry.get("aliases") or ()),
            note=str(entry.get("note") or ""))
    return out


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> dict[str, ModelStatus]:
    import yaml

    return parse(yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}, path)


def table(path: Path | None = None) -> dict[str, ModelStatus]:
    """Every model of the lifecycle file (cached while the file is unchanged)."""
    path = Path(path) if path is not None else lifecycle_path()
    if not path.is_file():
        return {}
    return _load(str(path), path.stat().st_mtime_ns)


def bare(model_id: str) -> str:
    """`models/gemini-x` → `gemini-x`; `publishers/google/models/imagen-x` → `imagen-x`."""
    return str(model_id or "").rsplit("models/", 1)[-1]


_VARIANT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{2}-\d{4}|\d{3}|\d{8}|latest|preview(-[\w.-]+)?)$")


def status_of(model_id: str, path: Path | None = None) -> ModelStatus | None:
    """The entry of `model_id`, whatever its case, prefix (`models/`) or variant suffix (a dated snapshot,
    -001, -latest, -preview-…): a snapshot of a retired model is retired too."""
    entries = table(path)
    name = bare(model_id).strip().lower()
    if name in entries:
        return entries[name]
    for known, entry in entries.items():
        if name.startswith(known + "-") and _VARIANT.fullmatch(name[len(known):]):
            return entry
    return None


def status_record(model_id: str, path: Path | None = None) -> dict[str, Any]:
    """What a run records about a model it used: its lifecycle entry, or `unlisted` (a local or user model)."""
    found = status_of(model_id, path)
    return found.record() if found else {"model_id": model_id, "status": "unlisted"}


def answered_as_asked(asked: str, reported: str | None, aliases: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether the model an API says answered is the one asked (see the module docstring). No reported
    name (an API that reports none) cannot be checked and passes."""
    if not reported:
        return True
    a, r = bare(asked), bare(reported)
    if r == a or (r.startswith(a) and _SNAPSHOT.fullmatch(r[len(a):]) is not None):
        return True
    known = tuple(aliases) + (status_of(a).aliases if status_of(a) else ())
    return any(fnmatch.fnmatchcase(r, pattern) for pattern in known)


def mismatch_reason(asked: str, reported: str) -> str:
    return (f"model mismatch: asked {bare(asked)}, answered by {bare(reported)} (a re-routed or renamed model; "
            f"declare {bare(reported)} among the model's aliases only if it is the same model)")


def mismatch(asked: str, reported: str | None) -> str:
    """'' when the model an API reports is the one asked (answered_as_asked), else the reason naming both."""
    return "" if answered_as_asked(asked, reported) else mismatch_reason(asked, reported or "")


__all__ = ["LIFECYCLE_FILE", "ModelStatus", "answered_as_asked", "bare", "lifecycle_path",
           "mismatch", "mismatch_reason", "parse", "status_of", "status_record", "table"]
