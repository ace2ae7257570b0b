"""Scale-out: the Ray runner gives the local runner's records; shards merge without loss or duplicates."""

import pandas as pd
import pytest

from biasaudit.params.execution import Execution
from biasaudit.pipeline.engine import merge_records, pending_items, run_local, shard_log_path
from biasaudit.pipeline.io import RecordLog


def square_batch(items):
    return [{"id": i["id"], "value": i["id"] ** 2, "status": "ok" if i["id"] % 5 else "failed"} for i in items]


def make_square():
    return square_batch


def test_shards_merge_to_the_whole(tmp_path):
    items = [{"id": i} for i in range(50)]
    base = tmp_path / "log.jsonl"
    for shard in range(3):
        run_local(items, square_batch, RecordLog(shard_log_path(base, shard, 3), "id"), shard_index=shard,
                  shard_count=3, progress=False, execution=Execution())
    paths = [shard_log_path(base, s, 3) for s in range(3)]
    merged, report = merge_records(paths, "id", expected_keys={(i,) for i in range(50)})
    assert sorted(r["id"] for r in merged.values()) == list(range(50))
    assert report["overlapping"] == 0 and report["missing"] == 0


def test_merge_reports_overlap_and_missing_shards(tmp_path):
    items = [{"id": i} for i in range(30)]
    base = tmp_path / "log.jsonl"
    # shard 0 of 3 twice (a re-submitted array task), shard 2 never ran
    run_local(items, square_batch, RecordLog(shard_log_path(base, 0, 3), "id"), shard_index=0, shard_count=3,
              progress=False, execution=Execution())
    other = tmp_path / "again.jsonl"
    run_local(items, square_batch, RecordLog(other, "id"), shard_index=0, shard_count=3, progress=False,
              execution=Execution())
    run_local(items, square_batch, RecordLog(shard_log_path(base, 1, 3), "id"), shard_index=1, shard_count=3,
              progress=False, execution=Execution())
    merged, report = merge_records([shard_log_path(base, 0, 3), other, shard_log_path(base, 1, 3)], "id",
                                   expected_keys={(i,) for i in range(30)})
    ids = [r["id"] for r in merged.values()]
    assert len(ids) == len(set(ids))
    shard2 = pending_items(items, RecordLog(tmp_path / "empty.jsonl", "id"), shard_index=2, shard_count=3)
    assert report["missing"] == len(shard2) > 0
    assert report["overlapping"] == len(pending_items(items, RecordLog(tmp_path / "e2.jsonl", "id"), 0, 3))


def test_shard_log_names():
    assert shard_log_path("a/log.jsonl").as_posix() == "a/log.jsonl"
    assert shard_log_path("a/log.jsonl", 2, 8).name == "log.shard-02-of-08.jsonl"


@pytest.mark.slow
def test_ray_runner_matches_local(tmp_path):
    ray = pytest.importorskip("ray")
    from biasaudit.params.execution import Execution, RayOptions
    from biasaudit.pipeline.engine import Stage, run_stage

    items = [{"id": i} for i in range(23)]
    local_log = RecordLog(tmp_path / "local.jsonl", "id")
    run_local(items, square_batch, local_log, batch_size=4, progress=False, execution=Execution())
    stage = Stage("squares", items, "id", "", make_square, tmp_path / "ray.jsonl", batch_size=4)
    on_ray = Execution(runner="ray", ray=RayOptions(num_workers=2))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        summary = run_stage(stage, on_ray, progress=False).summary
        again = run_stage(stage, on_ray, progress=False).summary
    finally:
        ray.shutdown()
    assert summary.processed == 23 and again.processed == 0 and again.already_done == 23
    def key(df):
        return df.sort_values("id").reset_index(drop=True)

    pd.testing.assert_frame_equal(key(local_log.to_frame()), key(RecordLog(tmp_path / "ray.jsonl", "id").to_frame()))
