"""The one engine every per-item stage runs on (generate, classify, faces, baseline, counterfactuals,
validate_edits, reflect).

A stage declares a `Stage`: its work items (dicts), the fields that name an item (`key`), the hash of
the settings that change a record (`settings_hash`), what else an item's record depends on
(`content`: image sha256, prompt text and seed …) and a factory of its *batch function*
`fn(list[item]) -> list[record]` (one record per item, with `status` and `reason` when it failed).
`run_stage` owns everything else:

* the `RecordLog` (one per stage instance, at a fixed path; `shard i of n` writes its own log beside
  it, and an unsharded run first adopts the shard logs it finds);
* content-addressed resume: every record carries `settings_hash` and `input_hash`; an item is done only
  when the log holds a record with the item's current pair, so changing an input under the same id
  redoes exactly that item (and a setting, every item);
* transient failures (work.is_transient: the transport gave up, a numerical fault) are never done: every
  run asks them again, and `StageRun.finish()` (the last cell of the stage's notebook) fails the stage
  while any remain, or while the share of final failures exceeds `execution.max_final_share`, so a
  plain `dvc repro` re-runs it (and asks exactly those items again) instead of treating it as done;
* `retry_failed` (also the final `failed` records), `limit`, sharding, local serial / local process
  pool (`execution.local_workers`) / Ray dispatch, and accounting (status counts, stale records, token cost with the batch discount,
  from the records themselves, so it is the same under every runner).

Only the driver appends to the log; workers return records (and write their own files atomically).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from biasaudit.pipeline.closure import code_fingerprint
from biasaudit.pipeline.io import DriverLock, RecordLog, atomic_write_text
from biasaudit.pipeline.provenance import sha256_file, stable_hash
from biasaudit.pipeline.work import UNVERIFIED, BatchFn, Item, RunSummary, cap_transient, is_transient

SETTINGS_FIELD = "settings_hash"  # stamped on every record by the driver
INPUT_FIELD = "input_hash"

# a failed record is the one to replace when two logs hold an item; other statuses are outcomes (no_face …)
STATUS_RANK = {"ok": 0, "refused": 1, "skipped": 2, "failed": 3}
OTHER_RANK = 2


def _module_of(make_fn: Any) -> tuple[str, ...]:
    """The module defining a batch-function factory (a functools.partial's function's)."""
    fn = getattr(make_fn, "func", make_fn)
    name = getattr(fn, "__module__", "") or ""
    # the engine's own wrappers (run_local, pending_items) name the batch function's module themselves
    return (name,) if name.startswith("biasaudit") and name != __name__ else ()


def per_item(one: Callable[[Item], Item], on_error: Callable[[Item, str], Item]) -> BatchFn:
    """A batch function from a per-item one: an exception in one item becomes that item's failed record
    (`on_error(item, reason)`), never the end of the batch."""
    def fn(items: list[Item]) -> list[Item]:
        out = []
        for item in items:
            try:
                out.append(one(item))
            except Exception as exc:
                out.append(on_error(item, f"{type(exc).__name__}: {exc}"[:500]))
        return out

    return fn


def shard_of(key: Sequence[Any] | str, n_shards: int) -> int:
    """Stable shard index of a key (independent of Python's hash seed)."""
    text = key if isinstance(key, str) else "\x1f".join(map(str, key))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % n_shards


def file_digest(path: str | os.PathLike | None) -> str:
    """sha256 of a file's bytes, memoised on (path, inode, size, mtime, ctime) within this process
    (reflect asks about one image many times); 'missing' when it cannot be read."""
    if not path:
        return "missing"
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    k = (os.fspath(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if k not in _DIGESTS:
        try:
            _DIGESTS[k] = sha256_file(path)
        except OSError:
            return "missing"
    return _DIGESTS[k]


_DIGESTS: dict[tuple, str] = {}


@dataclass
class Stage:
    name: str  # e.g. "faces photos" (progress bar, messages)
    items: list[Item]
    key: str | tuple[str, ...]  # the fields naming an item (and its record)
    settings_hash: str  # hash of every setting that changes a record
    make_fn: Callable[[], BatchFn]  # builds the batch function; picklable for the pool and Ray
    log_path: str | Path  # the unsharded log; shard logs lie beside it
    content: Callable[[Item], Any] | None = None  # what a record depends on besides settings (driver side)
    batch_size: int = 1
    limit: int = 0
    retry_failed: bool = False
    cpu_bound: bool = False  # may run on the local process pool (execution.local_workers > 1)
    preload: tuple[str, ...] = ()  # modules the pool's fork server imports once (the batch function's heavy ones)
    counts_tokens: bool = False  # records carry tokens_in/out, from_cache, via: sum their cost
    price: dict[str, float] | None = None  # token prices (input/output per Mtok, batch_discount)
    still_valid: Callable[[Item, Item], bool] | None = None  # extra check of a record (e.g. its file exists)
    retryable: Callable[[Item], bool] | None = None  # which records retry_failed redoes (default: status failed)
    # the record of an item whose pool worker died on it (killed for memory, a segfault); the reason
    # names the signal (default: the item's key fields, status failed, the reason)
    on_death: Callable[[Item, str], Item] | None = None
    # modules whose code computes a record besides the batch function's own module (e.g. the backend a
    # registry name resolves to); None: the code is not part of a record's identity (work that costs
    # money or GPU hours and is cached by its own request content, e.g. a hosted generator's images)
    code: tuple[str, ...] | None = ()
    # a hosted model's one request before the first batch: '' when it answers as itself, else why the stage
    # cannot run (retired, unauthorised, re-routed); the stage then stops with no item sent or recorded
    probe: Callable[[], str] | None = None

    def __post_init__(self) -> None:
        self.key = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        modules = () if self.code is None else (*_module_of(self.make_fn), *self.code)
        self.code_hash = code_fingerprint(*modules) if modules else ""

    @property
    def record_settings(self) -> str:
        """What a current record must carry in SETTINGS_FIELD: the settings and the code that computed it."""
        return stable_hash([self.settings_hash, self.code_hash], 16) if self.code_hash else self.settings_hash

    def key_of(self, d: dict[str, Any]) -> tuple:
        return tuple(d[k] for k in self.key)


class StageStopped(RuntimeError):
    """A stage that must not go on: its probe failed, an answer came from another model than the one asked
    (a record carrying STOP_FIELD), or its first `execution.stop_after_same_failures` items all failed with
    one non-transient reason. What was recorded before stays in its log."""


STOP_FIELD = "stop_reason"  # a record carrying it is not logged, and the stage stops with that reason


def same_failure(records: list[Item], n: int) -> str:
    """The reason shared by the first `n` records when all of them failed with it, non-transiently (compared
    with numbers masked: a request id or an item's index does not make two errors different); else ''."""
    if n <= 0 or len(records) < n:
        return ""
    first = records[:n]
    reasons = {re.sub(r"\d+", "#", str(r.get("reason") or "")) for r in first}
    if len(reasons) == 1 and all(r.get("status") == "failed" and not is_transient(r) for r in first):
        return str(first[0].get("reason") or "")
    return ""


class StageIncomplete(RuntimeError):
    """A stage ended with transient failures, or with more final failures than execution.max_final_share:
    its good records are kept in its log, and it exits non-zero so that DVC runs it again."""


def report(summary: RunSummary, execution: dict[str, Any]) -> str:
    """One line: the share of final statuses among a stage's current records, and its transient failures."""
    s, bound = summary, execution["max_final_share"]
    final = ", ".join(f"{k} {v}" for k, v in sorted(s.final.items())) or "none"
    return (f"{execution['stage']}: {s.records} of {s.total} items recorded; final statuses {s.final_share:.1%} "
            f"({final}; bound execution.max_final_share {bound:.0%}); transient failures {s.transient}")


def problems(summary: RunSummary, execution: dict[str, Any]) -> list[str]:
    """Why a stage must count as failed ([] when it is done)."""
    s, bound, out = summary, execution["max_final_share"], []
    if s.transient:
        top = "; ".join(f"{n} × {r}" for r, n in sorted(s.transient_reasons.items(), key=lambda x: -x[1])[:3])
        out.append(f"{s.transient} of {s.total} items failed transiently ({top}); the other records are kept "
                   f"in {execution['log']}. Fix: once the service (or the machine) works again, run `dvc repro` "
                   f"again: it asks exactly these {s.transient} items again")
    if s.final_share > bound:
        final = ", ".join(f"{k} {v}" for k, v in sorted(s.final.items()))
        out.append(f"{s.final_share:.1%} of the {s.records} records ended with a final status ({final}), more "
                   f"than execution.max_final_share ({bound:.0%}). Fix: read their reasons (a wrong model id, "
                   f"prompt or parser); a change of settings redoes them, and `retry_failed` asks failed ones "
                   f"again; or raise execution.max_final_share if this share is expected")
    return out


def finish(summary: RunSummary, execution: dict[str, Any]) -> None:
    """The last step of a per-item stage (its notebook's last cell), with the run's summary and execution
    info: print report(), and raise StageIncomplete naming the count and the fix while transient
    failures remain or final ones exceed the bound (a shard: its own items)."""
    print(report(summary, execution))
    found = problems(summary, execution)
    if found:
        raise StageIncomplete(f"{execution['stage']}: " + " | ".join(found))


@dataclass
class StageRun:
    stage: Stage
    summary: RunSummary
    log: RecordLog
    current: dict[tuple, Item]  # the records valid for the stage's items now (this run's and earlier ones)
    appended: list[Item]  # the records this run produced
    adopted: dict[str, Any]
    execution: dict[str, Any]
    made: list[BatchFn]  # batch functions built in this process (close their models, read their state)
    # what varies from run to run of the same work (the pool workers' peak memory): printed, kept here,
    # never written into an output, so re-running unchanged code changes no output's hash
    measured: dict[str, Any] = field(default_factory=dict)

    def finish(self) -> None:
        """engine.finish of this run (the last step of its stage)."""
        finish(self.summary, self.execution)

    def rows(self) -> list[Item]:
        """Current records in item order (items without one are left out)."""
        out = []
        for item in self.stage.items:
            rec = self.current.get(self.stage.key_of(item))
            if rec is not None:
                out.append(rec)
        return out

    @property
    def sharded(self) -> bool:
        return self.execution["shard_count"] > 1


# --- logs: shards beside the base log, adopted by an unsharded run ---------------------------------

def shard_log_path(base: str | Path, shard_index: int = 0, shard_count: int = 1) -> Path:
    """The record log of one shard: `log.jsonl` unsharded, `log.shard-02-of-08.jsonl` otherwise."""
    base = Path(base)
    if shard_count <= 1:
        return base
    return base.with_name(f"{base.stem}.shard-{shard_index:02d}-of-{shard_count:02d}{base.suffix}")


def shard_logs(base: str | Path) -> list[Path]:
    """The shard logs beside `base` (any shard count), in name order."""
    base = Path(base)
    return sorted(base.parent.glob(f"{base.stem}.shard-[0-9]*-of-[0-9]*{base.suffix}"))


def _status_rank(record: Item) -> int:
    return STATUS_RANK.get(record.get("status", "ok"), OTHER_RANK)


def merge_records(paths: Iterable[str | Path], key: str | tuple[str, ...], expected_keys: set[tuple] | None = None,
                  rank: Callable[[Item], Any] = _status_rank) -> tuple[dict[tuple, Item], dict[str, Any]]:
    """Union of several record logs, one record per key (records exactly as logged).

    A key logged twice keeps the better `rank` (default: ok over refused/failed), then the later log;
    `expected_keys` reports what no log holds yet (a missing or unfinished shard)."""
    paths = list(paths)
    best: dict[tuple, Item] = {}
    overlaps = 0
    for path in paths:
        for k, record in RecordLog(path, key).records().items():
            if k in best:
                overlaps += 1
                if rank(record) > rank(best[k]):
                    continue
            best[k] = record
    report: dict[str, Any] = {"logs": [str(p) for p in paths], "records": len(best), "overlapping": overlaps}
    if expected_keys is not None:
        missing = expected_keys - set(best)
        report["missing"] = len(missing)
        report["missing_examples"] = sorted(map(str, missing))[:10]
    return best, report


def adopt_shard_logs(log: RecordLog, rank: Callable[[Item], Any] = _status_rank) -> dict[str, Any]:
    """Merge every shard log found beside `log.path` into it (an unsharded run after `shard i of n`
    runs whose folders were copied together), then delete the shard logs. The merged log is written
    atomically before any shard log is removed, so a kill at any moment loses nothing."""
    paths = shard_logs(log.path)
    if not paths:
        return {"adopted": []}
    merged, report = merge_records([*paths, log.path], log.key, rank=rank)
    atomic_write_text(log.path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in merged.values()))
    for path in paths:
        path.unlink(missing_ok=True)
    return report | {"adopted": [p.name for p in paths]}


# --- the engine ------------------------------------------------------------------------------------

def fingerprints(stage: Stage) -> dict[tuple, tuple[str, str]]:
    """(settings_hash, input_hash) of every item, by key. Duplicate keys are a stage bug."""
    out: dict[tuple, tuple[str, str]] = {}
    for item in stage.items:
        k = stage.key_of(item)
        if k in out:
            raise ValueError(f"{stage.name}: two items share the key {k}")
        out[k] = (stage.record_settings, stable_hash(stage.content(item)) if stage.content else "")
    return out


def _is_current(stage: Stage, fp: tuple[str, str], item: Item, record: Item) -> str:
    """'' when `record` is valid for `item` now, else why not (settings | input | output)."""
    if record.get(SETTINGS_FIELD, "") != fp[0]:
        return "settings"
    if record.get(INPUT_FIELD, "") != fp[1]:
        return "input"
    if stage.still_valid is not None and not stage.still_valid(item, record):
        return "output"
    return ""


def plan(stage: Stage, log: RecordLog, shard_index: int = 0, shard_count: int = 1,
         fps: dict[tuple, tuple[str, str]] | None = None) -> tuple[list[Item], RunSummary]:
    """The items of this shard without a current record in `log` (failed ones too with retry_failed),
    at most `limit` of them, and a summary of why the others are not pending."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index must be in [0, {shard_count}), got {shard_index}")
    fps = fps if fps is not None else fingerprints(stage)
    records = log.records()
    summary = RunSummary(total=len(stage.items))
    todo = []
    for item in stage.items:
        k = stage.key_of(item)
        rec = records.get(k)
        why = "absent" if rec is None else _is_current(stage, fps[k], item, rec)
        transient = not why and is_transient(rec)
        if not why and not transient:
            retry = stage.retryable(rec) if stage.retryable else rec.get("status") == "failed"
            if not (stage.retry_failed and retry):
                summary.already_done += 1
                continue
        if shard_count > 1 and shard_of(k, shard_count) != shard_index:
            summary.other_shards += 1
            continue
        if why in summary.stale:
            summary.stale[why] += 1
        elif transient:
            summary.retried_transient += 1
        elif not why:
            summary.retried_failed += 1
        todo.append(item)
    return (todo[:stage.limit] if stage.limit > 0 else todo), summary


def open_log(stage: Stage, execution: Any, fps: dict[tuple, tuple[str, str]]) -> tuple[RecordLog, dict[str, Any]]:
    """This run's log: its shard's when sharded; otherwise the base log, after adopting shard logs
    (a current record beats a stale one, then the better status)."""
    if execution.shard_count > 1:
        return RecordLog(shard_log_path(stage.log_path, execution.shard_index, execution.shard_count), stage.key), \
            {"adopted": []}
    log = RecordLog(stage.log_path, stage.key)
    items = {stage.key_of(i): i for i in stage.items}

    def rank(record: Item):
        k = stage.key_of(record)
        stale = k not in items or bool(_is_current(stage, fps[k], items[k], record))
        return (stale, _status_rank(record))

    return log, adopt_shard_logs(log, rank)


def run_stage(stage: Stage, execution: Any, progress: bool = True) -> StageRun:
    """Run the pending items of `stage` as `execution` (a params.execution.Execution) says; one driver
    per log at a time (io.DriverLock: a second one stops at once, naming the first)."""
    fps = fingerprints(stage)
    path = shard_log_path(stage.log_path, execution.shard_index, execution.shard_count)
    with DriverLock(path, f"stage '{stage.name}'"):
        log, adopted = open_log(stage, execution, fps)
        return execute(stage, log, execution, progress, fps, adopted)


def execute(stage: Stage, log: RecordLog, execution: Any, progress: bool = True,
            fps: dict[tuple, tuple[str, str]] | None = None, adopted: dict[str, Any] | None = None) -> StageRun:
    """Process the pending items of `stage` into `log` (no adoption; run_stage picks the log)."""
    fps = fps if fps is not None else fingerprints(stage)
    todo, summary = plan(stage, log, execution.shard_index, execution.shard_count, fps)
    appended: list[Item] = []
    made: list[BatchFn] = []
    pool: dict[str, Any] | None = None  # what the local process pool reports (workers, deaths, peak memory)
    pending = {stage.key_of(i) for i in todo}
    earlier = log.records() if summary.retried_transient else {}  # for the cap on transient retries
    max_runs = execution.max_transient_runs
    # a model's requests only (a probed, hosted stage): a local stage's items fail alike for data reasons (one
    # source photo without a face fails its ten edits with one reason)
    same_n = int(getattr(execution, "stop_after_same_failures", 0) or 0) if stage.probe is not None else 0
    # a hosted model's answer that named no answering model (model_version UNVERIFIED, lifecycle.version_of)
    require_verified = stage.probe is not None and bool(getattr(execution, "require_verified_model", True))

    def sink(records: list[Item]) -> None:
        stamped, stops = [], []
        for r in records:
            k = stage.key_of(r)
            if k not in pending:  # a batch re-run by Ray after a worker died, or a stray record
                continue
            if r.get(STOP_FIELD):  # not logged: the next run asks it again
                stops.append(str(r[STOP_FIELD]))
                continue
            if require_verified and r.get("model_version") == UNVERIFIED:  # not logged either
                stops.append(f"model not verified: the API's answer named no answering model (no `model` / "
                             f"`modelVersion` field), so it cannot be checked against the model asked "
                             f"(execution.require_verified_model; false records such answers as '{UNVERIFIED}')")
                continue
            pending.discard(k)
            r = cap_transient(r, earlier.get(k), max_runs)
            stamped.append(r | {SETTINGS_FIELD: fps[k][0], INPUT_FIELD: fps[k][1]})
        log.append(stamped)
        appended.extend(stamped)
        summary.count(stamped)
        if stops:
            raise StageStopped(f"{stage.name}: stopped: {stops[0]} ({summary.processed} records kept in {log.path})")
        reason = same_failure(appended, same_n) if len(appended) - len(stamped) < same_n else ""
        if reason:
            raise StageStopped(f"{stage.name}: stopped: its first {same_n} items all failed with the same error "
                               f"({reason[:300]}); fix the model id, key or request (execution.stop_after_same_failures)")

    if todo and stage.probe is not None:
        why = stage.probe()
        if why:
            raise StageStopped(f"{stage.name}: stopped before its first batch, no item sent or recorded: {why}")
    workers = int(getattr(execution, "local_workers", 1) or 1)
    desc = stage.name + (f" shard {execution.shard_index}/{execution.shard_count}" if execution.shard_count > 1 else "")
    if todo:
        batches = [todo[s:s + max(1, stage.batch_size)] for s in range(0, len(todo), max(1, stage.batch_size))]
        with tqdm(total=len(todo), desc=desc, unit="item", disable=not progress, mininterval=1.0) as bar:
            if execution.runner == "ray":
                from biasaudit.pipeline.scale.ray_runner import run_ray

                ray = execution.ray
                run_ray(todo, stage.make_fn, stage.key, sink, batch_size=stage.batch_size,
                        num_workers=ray.num_workers, num_cpus_per_worker=ray.num_cpus_per_worker,
                        num_gpus_per_worker=ray.num_gpus_per_worker, address=ray.address or None, bar=bar)
            elif workers > 1 and stage.cpu_bound and len(batches) > 1:
                from biasaudit.pipeline.scale.pool import run_pool

                try:
                    pool = run_pool(batches, stage.make_fn, sink, workers, bar=bar, preload=stage.preload,
                                    on_death=stage.on_death or partial(died_record, stage.key))
                except (EOFError, ConnectionError) as exc:  # the fork server died before answering
                    raise RuntimeError(
                        f"{stage.name}: the process pool of {workers} workers could not start ({type(exc).__name__}: "
                        f"{exc or 'the fork server closed its pipe'}); the {summary.processed} records made so far "
                        f"are kept in {log.path}. Run again, or set execution.local_workers: 1 to run in this "
                        f"process") from exc
            else:
                fn = stage.make_fn()
                made.append(fn)
                for batch in batches:
                    records = fn(batch)
                    if len(records) != len(batch):
                        raise RuntimeError(f"batch function returned {len(records)} records for {len(batch)} items")
                    sink(records)
                    bar.update(len(batch))
    if stage.counts_tokens:
        summary.accounting = token_accounting(appended, stage.price)
    current = {}
    items = {stage.key_of(i): i for i in stage.items}
    for k, rec in log.records().items():
        if k in items and not _is_current(stage, fps[k], items[k], rec):
            current[k] = rec
    mine = [rec for k, rec in current.items()
            if execution.shard_count <= 1 or shard_of(k, execution.shard_count) == execution.shard_index]
    summary.tally(mine)
    info = {"stage": stage.name, "runner": execution.runner, "local_workers": workers, "shard_index": execution.shard_index,
            "shard_count": execution.shard_count, "log": log.path.as_posix(), "adopted_shards": adopted or {"adopted": []},
            "max_final_share": execution.max_final_share}
    measured: dict[str, Any] = {}
    if pool is not None:
        info["pool"] = {k: v for k, v in pool.items() if k != "worker_peak_rss_mib"}
        measured["worker_peak_rss_mib"] = pool.get("worker_peak_rss_mib")
    return StageRun(stage, summary, log, current, appended, adopted or {"adopted": []}, info, made, measured)


def died_record(key: tuple[str, ...], item: Item, reason: str) -> Item:
    """The default record of an item whose pool worker died on it (Stage.on_death)."""
    return {k: item[k] for k in key} | {"status": "failed", "reason": reason}


def token_accounting(records: list[Item], price: dict[str, float] | None) -> dict[str, Any]:
    """What the answers of this run cost, summed from their records (the same under every runner).

    Records carry tokens_in/out, from_cache and `via` ('batch' for a batch-job answer, billed at
    `batch_discount`); skipped items and unreadable files asked no model."""
    asked = [r for r in records if r.get("status") != "skipped" and not r.get("not_asked")]
    fresh = [r for r in asked if not r.get("from_cache")]
    t_in = sum(int(r.get("tokens_in") or 0) for r in fresh)
    t_out = sum(int(r.get("tokens_out") or 0) for r in fresh)
    cost = 0.0
    if price:
        for r in fresh:
            factor = float(price.get("batch_discount", 1.0)) if r.get("via") == "batch" else 1.0
            cost += factor * (int(r.get("tokens_in") or 0) * price["input_per_mtok"]
                              + int(r.get("tokens_out") or 0) * price["output_per_mtok"]) / 1e6
    return {"requests": len(asked), "cache_hits": len(asked) - len(fresh), "calls": len(fresh),
            "failed": sum(r.get("status") == "failed" for r in asked), "tokens_in": t_in, "tokens_out": t_out,
            "batch_calls": sum(r.get("via") == "batch" for r in fresh), "cost_usd": cost,
            "priced": price is not None, "source": "records of this run"}


# --- the low-level loop with a given batch function and log (tests, ad-hoc scripts) ----------------

def run_local(items: list[Item], fn: BatchFn, log: RecordLog, batch_size: int = 1, shard_index: int = 0,
              shard_count: int = 1, limit: int = 0, retry_failed: bool = False, desc: str = "items",
              progress: bool = True, settings_hash: str = "", content: Callable[[Item], Any] | None = None,
              *, execution: Any) -> RunSummary:
    """`fn` over the pending items of `items` into `log`, in this process (no adoption, no Ray); `execution`
    (a params.execution.Execution, which the caller builds: the engine imports nothing above pipeline/) gives
    the retry and failure bounds, `shard_index`/`shard_count` this call's shard."""
    execution = execution.model_copy(update={"shard_index": shard_index, "shard_count": shard_count,
                                             "runner": "local", "local_workers": 1})
    stage = Stage(desc, items, log.key, settings_hash, lambda: fn, log.path, content, batch_size=batch_size,
                  limit=limit, retry_failed=retry_failed, code=_module_of(fn))
    return execute(stage, log, execution, progress).summary


def pending_items(items: list[Item], log: RecordLog, shard_index: int = 0, shard_count: int = 1,
                  limit: int = 0, retry_failed: bool = False) -> list[Item]:
    """Items of this shard that `log` holds no current record of (run_local's view)."""
    stage = Stage("items", items, log.key, "", _never, log.path, limit=limit, retry_failed=retry_failed)
    return plan(stage, log, shard_index, shard_count)[0]


def _never() -> BatchFn:  # pragma: no cover - pending_items never builds a batch function
    raise RuntimeError("no batch function")
