"""The stage engine: content-addressed resume, settings, retry_failed, limit, shard adoption, the local
process pool (same records as serial), token accounting with the batch discount."""

from __future__ import annotations

import json
import os
from functools import partial

import pytest

from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import (
    INPUT_FIELD,
    SETTINGS_FIELD,
    Stage,
    file_digest,
    run_stage,
    shard_log_path,
    token_accounting,
)
from biasaudit.pipeline.io import RecordLog


def length_batch(items, calls=None):
    """A pure batch function of the file content: the record follows the bytes, never the id."""
    if calls is not None:
        calls.extend(i["id"] for i in items)
    out = []
    for i in items:
        with open(i["path"], "rb") as fh:
            data = fh.read()
        out.append({"id": i["id"], "n_bytes": len(data), "first": data[:1].decode(),
                    "status": "failed" if data.startswith(b"x") else "ok"})
    return out


def make_length(calls=None):
    return partial(length_batch, calls=calls)


def files(tmp_path, contents: dict[str, bytes]) -> list[dict]:
    items = []
    for name, data in contents.items():
        (tmp_path / name).write_bytes(data)
        items.append({"id": name, "path": str(tmp_path / name)})
    return items


def stage(tmp_path, items, calls, settings="s1", **kw):
    return Stage("lengths", items, "id", settings, partial(make_length, calls), tmp_path / "log.jsonl",
                 content=lambda it: {"file": file_digest(it["path"])}, batch_size=2, **kw)


def test_swapped_inputs_under_the_same_ids_redo_exactly_those_items(tmp_path):
    items = files(tmp_path, {"a": b"aaaa", "b": b"bb", "c": b"cccccc"})
    calls: list = []
    first = run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    assert first.summary.processed == 3 and sorted(calls) == ["a", "b", "c"]
    assert all(r[SETTINGS_FIELD] == "s1" and r[INPUT_FIELD] for r in first.appended)
    # swap a and b on disk (same ids, same paths)
    os.rename(tmp_path / "a", tmp_path / "tmp")
    os.rename(tmp_path / "b", tmp_path / "a")
    os.rename(tmp_path / "tmp", tmp_path / "b")
    calls.clear()
    again = run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    assert sorted(calls) == ["a", "b"] and again.summary.stale == {"settings": 0, "input": 2, "output": 0}
    by = {r["id"]: r for r in again.rows()}
    assert (by["a"]["n_bytes"], by["b"]["n_bytes"], by["c"]["n_bytes"]) == (2, 4, 6)  # follows the content
    calls.clear()
    assert run_stage(stage(tmp_path, items, calls), Execution(), progress=False).summary.processed == 0
    # another setting redoes everything; rows() only ever shows current records
    calls.clear()
    other = run_stage(stage(tmp_path, items, calls, settings="s2", limit=1), Execution(), progress=False)
    assert other.summary.stale["settings"] == 3 and len(calls) == 1 and len(other.rows()) == 1


def test_retry_failed_redoes_only_failures_and_limit_caps_the_run(tmp_path):
    items = files(tmp_path, {"a": b"a", "x1": b"x", "c": b"c", "x2": b"xx"})
    calls: list = []
    run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    calls.clear()
    kept = run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    assert calls == [] and kept.summary.status_counts == {}
    retried = run_stage(stage(tmp_path, items, calls, retry_failed=True), Execution(), progress=False)
    assert sorted(calls) == ["x1", "x2"] and retried.summary.retried_failed == 2


def test_an_unsharded_run_adopts_shards_preferring_current_records(tmp_path):
    items = files(tmp_path, {f"f{i}": bytes([97 + i]) * (i + 1) for i in range(12)})
    calls: list = []
    for shard in range(3):
        run_stage(stage(tmp_path, items, calls), Execution(shard_index=shard, shard_count=3), progress=False)
    assert sorted(calls) == sorted(i["id"] for i in items)
    # a stale duplicate (other settings) of f0 in an extra shard log must not replace the current one
    base = tmp_path / "log.jsonl"
    current = RecordLog(shard_log_path(base, 0, 3), "id").records() | RecordLog(shard_log_path(base, 1, 3), "id").records() \
        | RecordLog(shard_log_path(base, 2, 3), "id").records()
    stale = current[("f0",)] | {SETTINGS_FIELD: "old", "n_bytes": -1}
    shard_log_path(base, 3, 4).write_text(json.dumps(stale) + "\n")
    calls.clear()
    merged = run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    assert calls == [] and len(merged.adopted["adopted"]) == 4 and merged.summary.already_done == 12
    assert {r["id"]: r["n_bytes"] for r in merged.rows()}["f0"] == 1


def test_a_torn_last_line_is_set_aside_and_its_item_redone(tmp_path):
    items = files(tmp_path, {"a": b"a", "b": b"bb", "c": b"ccc"})
    calls: list = []
    run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    log_file = tmp_path / "log.jsonl"
    lines = log_file.read_bytes().splitlines(keepends=True)
    torn_id = json.loads(lines[-1])["id"]
    os.truncate(log_file, log_file.stat().st_size - len(lines[-1]) // 2)  # a writer killed mid-line
    calls.clear()
    with pytest.warns(RuntimeWarning, match="torn last line"):
        again = run_stage(stage(tmp_path, items, calls), Execution(), progress=False)
    assert calls == [torn_id] and again.summary.processed == 1
    torn = (tmp_path / "log.jsonl.torn").read_bytes()
    assert torn == lines[-1][:len(lines[-1]) - len(lines[-1]) // 2] + b"\n"  # the cut-off bytes, kept
    parsed = [json.loads(x) for x in log_file.read_text().splitlines()]  # every line whole: no join
    assert sorted(r["id"] for r in parsed) == ["a", "b", "c"]


def test_local_process_pool_gives_the_serial_records(tmp_path):
    items = files(tmp_path, {f"f{i:02d}": bytes([97 + i % 26]) * (i + 1) for i in range(9)})
    (tmp_path / "serial").mkdir()
    serial = run_stage(stage(tmp_path / "serial", items, None), Execution(), progress=False)
    pool_stage = Stage("lengths", items, "id", "s1", make_length, tmp_path / "pool.jsonl",
                       content=lambda it: {"file": file_digest(it["path"])}, batch_size=2, cpu_bound=True)
    pooled = run_stage(pool_stage, Execution(local_workers=2), progress=False)
    assert pooled.made == [] and pooled.summary.processed == 9  # ran in the workers, not here
    assert pooled.rows() == serial.rows()


def worker_facts(items):
    import sys

    return [it | {"pid": os.getpid(), "torch": "torch" in sys.modules, "threads": os.environ.get("OMP_NUM_THREADS")}
            for it in items]


def make_worker_facts():
    return worker_facts


def test_a_prestarted_pool_runs_every_batch_on_its_share_of_cores_without_importing_torch():
    from multiprocessing import forkserver

    from biasaudit.pipeline.scale.pool import prestart, run_pool

    ours = forkserver._forkserver._forkserver_pid is None  # else an earlier test's server (its own preload)
    prestart(Execution(local_workers=1))  # one worker: no pool will run, nothing is started
    prestart(Execution(local_workers=2), ("json",))  # the fork server starts now; the pool below uses it
    got: list = []
    run_pool([[{"id": i}] for i in range(6)], make_worker_facts, got.extend, 2)
    assert sorted(r["id"] for r in got) == list(range(6))
    assert {r["threads"] for r in got} == {str(max(1, (os.cpu_count() or 1) // 2))}
    assert os.getpid() not in {r["pid"] for r in got}
    if ours:
        assert not any(r["torch"] for r in got)  # a stage without torch never pays its 1.6 s import


def test_token_accounting_applies_the_batch_discount():
    price = {"input_per_mtok": 1.0, "output_per_mtok": 10.0, "batch_discount": 0.5}
    records = [{"status": "ok", "tokens_in": 1000, "tokens_out": 100, "from_cache": False, "via": "batch"},
               {"status": "ok", "tokens_in": 1000, "tokens_out": 100, "from_cache": False, "via": ""},
               {"status": "ok", "tokens_in": 1000, "tokens_out": 100, "from_cache": True, "via": ""},
               {"status": "skipped", "tokens_in": None, "tokens_out": None, "from_cache": False}]
    acc = token_accounting(records, price)
    # by hand: 2000 µUSD per fresh answer; the batch one at half price
    assert acc["cost_usd"] == pytest.approx(0.5 * 2000e-6 + 2000e-6)
    assert (acc["requests"], acc["calls"], acc["cache_hits"], acc["batch_calls"]) == (3, 2, 1, 1)
