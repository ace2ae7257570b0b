"""Crash-safe file output: atomic writes, an append-only record log and a persistent cache.

Long stages write one record per finished item to a `RecordLog` (one JSON line, flushed and
fsynced), so a SIGKILL loses at most the item in flight; a torn last line is ignored on reading.
Final tables are rebuilt from the log and written atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o644)  # mkstemp creates 0600
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_table(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a DataFrame as parquet or CSV (by suffix) atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        elif path.suffix == ".csv":
            df.to_csv(tmp, index=False, lineterminator="\n")
        else:
            raise ValueError(f"unsupported table format: {path.suffix}")
    return path


def remove_stale_temporaries(directory: str | os.PathLike) -> int:
    """Delete temporary files left behind by a killed writer; return how many."""
    removed = 0
    for tmp in Path(directory).rglob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


class RecordLog:
    """Append-only JSON-lines log of finished items, safe against SIGKILL.

    Each `append` writes whole lines and fsyncs before returning; `read` skips a torn final line
    and keeps the last record per key, so re-running an interrupted stage neither loses nor
    duplicates work.
    """

    def __init__(self, path: str | os.PathLike, key: str | tuple[str, ...]):
        self.path = Path(path)
        self.key = (key,) if isinstance(key, str) else tuple(key)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _key_of(self, record: dict[str, Any]) -> tuple:
        return tuple(record[k] for k in self.key)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
        if not lines:
            return
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())

    def records(self) -> dict[tuple, dict[str, Any]]:
        out: dict[tuple, dict[str, Any]] = {}
        if not self.path.exists():
            return out
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # torn write from a killed process
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out[self._key_of(record)] = record
        return out

    def done_keys(self, where: dict[str, Any] | None = None) -> set[tuple]:
        where = where or {}
        return {k for k, r in self.records().items() if all(r.get(f) == v for f, v in where.items())}

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.records().values()))


class Cache:
    """Persistent key → JSON cache in SQLite (WAL): survives SIGKILL, safe across threads."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=60)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    def get(self, key: str) -> Any | None:
        row = self._conn().execute("SELECT value FROM cache WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def set(self, key: str, value: Any) -> None:
        with self._conn() as conn:
            conn.execute("INSERT OR REPLACE INTO cache (key, value) VALUES (?, ?)",
                         (key, json.dumps(value, sort_keys=True, default=str)))

    def __len__(self) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM cache").fetchone()[0]


def build_directory_once(target: str | os.PathLike, build: Callable[[Path], str], marker: str = ".complete") -> tuple[Path, str]:
    """Build `target` once, atomically: `build(tmp_dir)` fills a temporary sibling and returns the text
    to record (e.g. a weights hash); the marker file is written last and the folder renamed into place.
    A killed build leaves no marker and is redone; a concurrent builder that finished first wins.
    Returns (target, recorded text)."""
    target = Path(target)
    if not (target / marker).exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            (tmp / marker).write_text(build(tmp).strip() + "\n")
            if target.exists():
                if (target / marker).exists():
                    return target, (target / marker).read_text().strip()
                shutil.rmtree(target)  # an incomplete earlier build
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target, (target / marker).read_text().strip()
