"""Transient vs final failures: a plain re-run asks exactly the transient ones again; a stage with any
left, or with more final failures than execution.max_final_share, fails (StageIncomplete)."""

from __future__ import annotations

import os

import pytest

from biasaudit.backends.transport import RetryableError
from biasaudit.backends.vlm.base import retried
from biasaudit.params.classify import VLMSpec
from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import Stage, StageIncomplete, run_stage
from biasaudit.pipeline.work import is_transient

from .servers_vlm import VLMServer
from .test_classify import make_manifest


def classify_cfg(tmp_path, monkeypatch, server, **classify):
    """The classify stage's own config on a manifest of 7 grey images + 1 refused generation."""
    from biasaudit.config import read_yaml, validate

    from .conftest import ROOT

    monkeypatch.chdir(tmp_path)
    img_dir = tmp_path / "data/t2i/images/m"
    img_dir.mkdir(parents=True)
    manifest = make_manifest(img_dir)
    manifest["path"] = [os.path.relpath(p, tmp_path) if isinstance(p, str) else None for p in manifest["path"]]
    manifest.to_parquet(img_dir / "manifest.parquet", index=False)
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = {"m": {"backend": "packaged-photos", "width": 64, "height": 64}}
    raw["benchmarks"] = {**raw["benchmarks"], "gender_set": ""}  # the race question alone: the server counts its calls
    raw["classify"] = {**raw["classify"], "batch_size": 3, **classify,
                       "vlm": {**raw["classify"]["vlm"], "backend": "openai", "model_id": "m",
                               "base_url": server.openai_url, "api_key_env": "NOPE", "concurrency": 1,
                               "constrain": False, "max_retries": 0, "retry_backoff_s": 0.0}}
    return validate(raw)


def test_fault_server_fails_once_then_recovers_two_plain_runs_leave_no_transient_failure(tmp_path, monkeypatch):
    """Two runs of the classify stage's path (run_classify → run_stage), retry_failed off: the first
    ends with 2 transient failures (HTTP 500, no retries left) and 1 final refusal and fails naming
    the count; the second asks exactly those 2 again (the server counts them), not the refusal."""
    from biasaudit.t2i import classify as cl

    with VLMServer(script=["500", "ok", "500", "text-refuse"]) as server:
        cfg = classify_cfg(tmp_path, monkeypatch, server, retry_failed=False)
        first = cl.run_classify("m", cfg, progress=False)
        s = first["summary"]
        assert (s.transient, s.final) == (2, {"refused": 1}) and s.records == 8
        with pytest.raises(StageIncomplete, match=r"2 of 8 items failed transiently .*HTTP 500.* run `dvc repro`"):
            first["run"].finish()
        table = first["table"].set_index("image_id")
        assert (table.status == "ok").sum() == 4  # every good record kept (and the skipped one)
        calls = server.calls
        assert calls == 7
        second = cl.run_classify("m", cfg, progress=False)
        assert server.calls - calls == 2  # exactly the two transient failures were asked again
        s2 = second["summary"]
        assert (s2.retried_transient, s2.processed, s2.transient) == (2, 2, 0)
        assert s2.final == {"refused": 1}
        second["run"].finish()  # 0 transient failures, 1/8 final ≤ 0.5: done
        third = cl.run_classify("m", cfg, progress=False)
        assert third["summary"].processed == 0 and server.calls - calls == 2
    done = second["table"]
    assert (done.status == "ok").sum() == 6 and (done.status == "refused").sum() == 1


def test_final_share_above_the_bound_fails_the_stage(tmp_path, monkeypatch):
    """Every answer refused: 7 of 8 records final (the 8th is skipped upstream and not counted as a
    failure of this stage), above 0.5; with the bound at 1.0 the same run is done."""
    from biasaudit.t2i import classify as cl

    with VLMServer(script=["text-refuse"] * 7) as server:
        cfg = classify_cfg(tmp_path, monkeypatch, server)
        run = cl.run_classify("m", cfg, progress=False)["run"]
        assert run.summary.final == {"refused": 7} and run.summary.final_share == pytest.approx(7 / 8)
        with pytest.raises(StageIncomplete, match=r"87\.5% of the 8 records ended with a final status \(refused 7\)"):
            run.finish()
        run.execution["max_final_share"] = 1.0
        run.finish()


def test_engine_redoes_transient_records_without_retry_failed(tmp_path):
    """On the bare engine: a numerical fault is asked again on every run until it succeeds, a final
    'failed' (an implausible answer) only with retry_failed."""
    attempts: dict[str, int] = {}

    def fn(items):
        out = []
        for it in items:
            n = attempts[it["id"]] = attempts.get(it["id"], 0) + 1
            if it["id"] == "a" and n == 1:
                out.append({"id": "a", "status": "failed", "reason": "numerical: all-black image (max pixel value 0)"})
            elif it["id"] == "b":
                out.append({"id": "b", "status": "failed", "reason": "implausible salary 3 outside [1000, 10000000]"})
            else:
                out.append({"id": it["id"], "status": "ok"})
        return out

    items = [{"id": x} for x in "abc"]

    def stage(**kw):
        return Stage("toy", items, "id", "s", lambda: fn, tmp_path / "log.jsonl", code=None, **kw)

    first = run_stage(stage(), Execution(), progress=False)
    assert (first.summary.transient, first.summary.final) == (1, {"failed": 1})
    with pytest.raises(StageIncomplete, match="1 of 3 items failed transiently"):
        first.finish()
    second = run_stage(stage(), Execution(), progress=False)
    assert attempts == {"a": 2, "b": 1, "c": 1} and second.summary.retried_transient == 1
    second.finish()  # 1/3 final ≤ 0.5
    run_stage(stage(retry_failed=True), Execution(), progress=False)
    assert attempts == {"a": 2, "b": 2, "c": 1}


def test_transport_give_up_reasons_are_transient_and_api_rejections_final():
    """The reasons the producers write: a VLM request whose retries ran out (transport), a 4xx, a parse."""
    spec = VLMSpec(backend="openai", model_id="m", api_key_env="NOPE", max_retries=1, retry_backoff_s=0.0)

    def boom():
        raise RetryableError("HTTP 503")

    gave_up = retried(boom, spec, None)
    assert gave_up.status == "failed" and is_transient({"status": gave_up.status, "reason": gave_up.reason})
    assert not is_transient({"status": "failed", "reason": "HTTP 404: model not found"})
    assert not is_transient({"status": "refused", "reason": "gave up after 2 attempts"})  # a refusal is final
    assert not is_transient({"status": "failed", "reason": "several options: white, black"})
    assert is_transient({"status": "failed", "reason": "anything", "transient": True})


def test_every_notebook_that_runs_the_engine_ends_with_finish():
    """A notebook reaching engine.py (a per-item stage) must end with finish(), or its stage would exit
    0 with failures left and DVC would never run it again."""
    import re

    from .closure import notebook_closure
    from .conftest import ROOT

    runners = [nb for nb in sorted((ROOT / "notebooks").glob("*.py"))
               if any(p.as_posix().endswith("biasaudit/pipeline/engine.py") for p in notebook_closure(nb))]
    assert len(runners) >= 7, runners
    for nb in runners:
        last = nb.read_text().rstrip().split("# %%")[-1]
        assert re.search(r"\bfinish\(", last), f"{nb.name}: the last cell does not call finish()"


def test_a_pool_whose_fork_server_dies_at_start_stops_with_a_clear_message(tmp_path, monkeypatch):
    """The fork server is SIGKILLed just as the pool asks it for its first worker (the real pipe/socket
    error, no fake exception): the stage stops with a message naming the pool and the fix."""
    import signal
    from multiprocessing import forkserver

    from biasaudit.pipeline.scale.pool import prestart

    prestart(Execution(local_workers=2))
    original = forkserver.ForkServer.ensure_running
    killed: list[int] = []

    def dies_after_the_check(self):
        original(self)  # the server is alive now ...
        if not killed:  # ... and dies before the pool's first worker is asked of it
            killed.append(self._forkserver_pid)
            os.kill(self._forkserver_pid, signal.SIGKILL)
            while not os.waitpid(self._forkserver_pid, os.WNOHANG)[0]:
                pass

    monkeypatch.setattr(forkserver.ForkServer, "ensure_running", dies_after_the_check)
    items = [{"id": f"i{k}"} for k in range(4)]
    stage = Stage("toy pool", items, "id", "s", make_echo, tmp_path / "log.jsonl", batch_size=1, cpu_bound=True,
                  code=None)
    with pytest.raises(RuntimeError, match=r"toy pool: the process pool of 2 workers could not start .*"
                                           r"execution.local_workers: 1") as info:
        run_stage(stage, Execution(local_workers=2), progress=False)
    assert killed and isinstance(info.value.__cause__, (EOFError, ConnectionError)), repr(info.value.__cause__)
    monkeypatch.undo()
    forkserver._forkserver._forkserver_pid = None  # the next pool starts a fresh server
    forkserver._forkserver._forkserver_address = None


def make_echo():
    return echo


def echo(items):
    return [it | {"status": "ok"} for it in items]


def test_a_transient_failure_that_never_goes_away_becomes_final_after_max_transient_runs(tmp_path):
    """A deterministic numerical fault (same seed, same hardware) is asked again on each of
    execution.max_transient_runs runs, then recorded final with the reason saying why: the stage can end."""
    attempts = {"n": 0}

    def fn(items):
        attempts["n"] += len(items)
        return [{"id": it["id"], "status": "failed" if it["id"] == "a" else "ok",
                 "reason": "numerical: NaN in the image" if it["id"] == "a" else ""} for it in items]

    items = [{"id": x} for x in "abcd"]
    ex = Execution(max_transient_runs=3)
    stage = Stage("toy", items, "id", "s", lambda: fn, tmp_path / "log.jsonl", code=None)
    for run in (1, 2):
        r = run_stage(stage, ex, progress=False)
        assert r.summary.transient == 1, run
        with pytest.raises(StageIncomplete):
            r.finish()
    third = run_stage(stage, ex, progress=False)
    assert attempts["n"] == 4 + 1 + 1  # the three other items once, "a" on each of the 3 runs
    assert third.summary.transient == 0 and third.summary.final == {"failed": 1}
    record = third.current[("a",)]
    assert record["transient_runs"] == 3 and record["reason"].startswith("final after 3 runs that failed transiently")
    third.finish()  # 1/4 final ≤ 0.5
    run_stage(stage, ex, progress=False)
    assert attempts["n"] == 6  # final now: not asked again
