"""Crash-safe file output: atomic writes, an append-only record log and a persistent cache.

Long stages write one record per finished item to a `RecordLog` (one JSON line, flushed and
fsynced), so a SIGKILL loses at most the item in flight; a torn last line is set aside and redone.
Final tables are rebuilt from the log and written atomically (temporary file, fsync, rename).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where a table is written: 0.5 s every stage runner would pay
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


def atomic_write_json(path: str | os.PathLike, obj: Any, sort_keys: bool = True) -> Path:
    """Write `obj` as JSON atomically, every float at the declared precision (`stable_value`)."""
    return atomic_write_text(path, json.dumps(stable_value(obj), indent=2, sort_keys=sort_keys, default=str) + "\n")


# Floats whose last bits depend on the machine (the BLAS / oneDNN / onnxruntime kernel chosen for the CPU,
# its summation order, the thread count) are rounded before they are written to a hashed output, so the
# same inputs give the same bytes, and dvc.lock the same hash, on another machine.
# The declared precision: every float that a table (`atomic_write_table`), a JSON file (`atomic_write_json`)
# or a notebook's printed text (`stable_text`) carries is written with SIGNIFICANT_DIGITS significant digits,
# and a magnitude below ZERO_BELOW is written as 0 (what float64 work leaves of a quantity that is zero in
# exact arithmetic: 1e-17 here, -3e-17 on another CPU). float64 kernels differ in the 15th-16th digit, so
# ten digits absorb them unless a value sits on a rounding boundary (about one in a million).
SIGNIFICANT_DIGITS = 10
ZERO_BELOW = 1e-12
# Work done in float32 or by onnxruntime / oneDNN differs in the 6th-7th digit: its outputs are rounded
# further, to decimals, before the writer sees them. These keep every reported digit (tables show at most
# 3-4) and cosines between rounded unit embeddings move by < 1e-4.
TABLE_DECIMALS = 5
EMBEDDING_DECIMALS = 4


def stable_float(x: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    """`x` at the declared precision: `digits` significant digits, 0.0 below ZERO_BELOW (no sign), NaN and
    infinities kept. The result is the float nearest to the decimal (its repr has at most `digits` digits)."""
    if not math.isfinite(x):
        return x
    if abs(x) < ZERO_BELOW:
        return 0.0
    return float(f"{x:.{digits}g}") + 0.0


def stable_value(obj: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """`obj` (JSON-like: dicts, lists, tuples, scalars, numpy scalars) with every float at the declared
    precision; other values unchanged."""
    if isinstance(obj, dict):
        return {k: stable_value(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [stable_value(v, digits) for v in obj]
    if isinstance(obj, float):
        return stable_float(obj, digits)
    if type(obj).__module__ == "numpy" and hasattr(obj, "dtype") and obj.dtype.kind == "f" and obj.ndim == 0:
        return stable_float(float(obj), digits)
    return obj


def stable_text(obj: Any, digits: int = SIGNIFICANT_DIGITS) -> str:
    """What a notebook prints of a JSON-like value: JSON with every float at the declared precision."""
    return json.dumps(stable_value(obj, digits), indent=1, default=str)


def stable_column(values: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """A numpy array (or column) with every float at the declared precision, dtype kept."""
    import numpy as np

    arr = np.asarray(values)
    if not np.issubdtype(arr.dtype, np.floating) or arr.size == 0:
        return arr
    flat = [stable_float(v, digits) for v in arr.astype(np.float64).ravel().tolist()]
    return np.asarray(flat, dtype=np.float64).reshape(arr.shape).astype(arr.dtype, copy=False)


def stable_table(df: pd.DataFrame, digits: int = SIGNIFICANT_DIGITS) -> pd.DataFrame:
    """`df` with its float columns at the declared precision (a copy; other columns untouched)."""
    floats = list(df.select_dtypes(include="floating").columns)
    if not floats:
        return df
    out = df.copy()
    for col in floats:
        out[col] = stable_column(out[col].to_numpy(), digits)
    return out


def display_table(df: pd.DataFrame, decimals: int = 3) -> pd.DataFrame:
    """What a reader sees of `df` (its Markdown table, a notebook's output): the floats its CSV holds
    (`stable_table`) at `decimals` decimals, a residue that rounds away written 0, never -0 (its sign is a CPU
    kernel's)."""
    import pandas as pd

    out = stable_table(df).round(decimals)
    for i, dtype in enumerate(out.dtypes):  # by position: a frame may repeat a column name
        if pd.api.types.is_float_dtype(dtype):
            out.iloc[:, i] = out.iloc[:, i] + 0.0  # -0.0 + 0.0 is +0.0
    return out


def stable_floats(values: Any, decimals: int = TABLE_DECIMALS) -> Any:
    """`values` (a numpy array or a DataFrame) with its floats rounded to `decimals`, dtypes kept; -0.0
    becomes 0.0 (its sign bit differs across kernels too); other columns are untouched."""
    import numpy as np

    if hasattr(values, "select_dtypes"):
        out = values.copy()
        for col in out.select_dtypes(include="floating").columns:
            out[col] = stable_floats(out[col].to_numpy(), decimals)
        return out
    arr = np.asarray(values)
    if not np.issubdtype(arr.dtype, np.floating):
        return arr
    return np.round(arr, decimals) + arr.dtype.type(0.0)  # + 0.0 turns -0.0 into 0.0


def atomic_write_table(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a DataFrame as parquet or CSV (by suffix) atomically, its floats at the declared precision
    (`stable_table`)."""
    path = Path(path)
    df = stable_table(df)
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


@contextmanager
def file_lock(path: str | os.PathLike, exclusive: bool = True) -> Iterator[None]:
    """An advisory lock (flock) on `path` across processes, held for the block; none where the folder
    is read-only (a reader of someone else's log)."""
    try:
        fh = open(path, "a")
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class DriverLock:
    """One driver per stage instance: an exclusive, non-blocking flock on `<log>.driver`, held for the
    run, with the holder's pid written in it. A second driver (a notebook run by hand while `dvc repro`
    runs) stops at once with a message naming the first; the lock goes with its process however it ends."""

    def __init__(self, log_path: str | os.PathLike, what: str):
        self.path = Path(str(log_path) + ".driver")
        self.what = what
        self.fh: Any = None

    def __enter__(self) -> "DriverLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "a+")
        try:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read().strip() or "another process"
            self.fh.close()
            raise RuntimeError(f"{self.what} is already running ({holder}); wait for it to end or stop it, "
                               f"then run again (lock: {self.path})") from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self.fh.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fh.fileno(), fcntl.LOCK_UN)
        self.fh.close()


class RecordLog:
    """Append-only JSON-lines log of finished items, safe against SIGKILL.

    Each `append` writes whole lines and fsyncs before returning; the last record per key wins. A
    torn last line (a writer killed mid-line) is skipped by a read (which writes nothing) and set
    aside, with a warning, into `<log>.torn` and cut from the log before the next append, so its item
    is redone and that append starts on a fresh line. A corrupt line elsewhere is skipped with a warning. Appends and repairs hold an
    exclusive lock on `<log>.lock` and reads a shared one, so processes appending to one log lose
    nothing and a reader never cuts a line another process is still writing.
    """

    def __init__(self, path: str | os.PathLike, key: str | tuple[str, ...]):
        self.path = Path(path)
        self.key = (key,) if isinstance(key, str) else tuple(key)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.torn = 0  # torn lines set aside by this object

    def _key_of(self, record: dict[str, Any]) -> tuple:
        return tuple(record[k] for k in self.key)

    @property
    def torn_path(self) -> Path:
        return self.path.with_name(self.path.name + ".torn")

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def repair(self) -> bytes:
        """Cut a torn last line off the log (kept in `torn_path`); returns it (b'' when none)."""
        try:
            fh = open(self.path, "rb+")
        except FileNotFoundError:
            return b""
        except OSError:  # read-only: the reader skips the torn line as corrupt
            return b""
        with fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return b""
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                return b""
            start = size
            while start > 0:  # back to the byte after the last newline
                step = min(start, 1 << 16)
                fh.seek(start - step)
                chunk = fh.read(step)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    start = start - step + nl + 1
                    break
                start -= step
            fh.seek(start)
            tail = fh.read()
            with open(self.torn_path, "ab") as side:
                side.write(tail + b"\n")
                side.flush()
                os.fsync(side.fileno())
            fh.truncate(start)
            fh.flush()
            os.fsync(fh.fileno())
        self.torn += 1
        warnings.warn(f"{self.path}: torn last line ({len(tail)} bytes, a writer killed mid-line) set aside "
                      f"in {self.torn_path.name}; its item is redone", RuntimeWarning, stacklevel=3)
        return tail

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
        if not lines:
            return
        with self._lock, file_lock(self.lock_path):
            self.repair()
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(lines)
                fh.flush()
                os.fsync(fh.fileno())

    def records(self) -> dict[tuple, dict[str, Any]]:
        """The last record per key. Reading writes nothing (so it needs no free space, and a full disk
        never stops a resume): a torn last line is skipped here, and set aside by the next append."""
        out: dict[tuple, dict[str, Any]] = {}
        if not self.path.exists():
            return out
        bad = 0
        with file_lock(self.lock_path, exclusive=False), open(self.path, "rb") as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):  # a torn last line (a writer killed mid-line)
                    warnings.warn(f"{self.path}: torn last line ({len(raw)} bytes, a writer killed mid-line) "
                                  f"skipped; its item is redone (the next append sets it aside in "
                                  f"{self.torn_path.name})", RuntimeWarning, stacklevel=2)
                    break
                try:
                    record = json.loads(raw.decode("utf-8", errors="replace"))
                    out[self._key_of(record)] = record
                except (json.JSONDecodeError, KeyError, TypeError):
                    bad += 1
        if bad:
            warnings.warn(f"{self.path}: {bad} corrupt line(s) skipped; their items are redone", RuntimeWarning,
                          stacklevel=2)
        return out

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

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
