"""How a per-image stage executes: locally or on Ray, whole or one shard, in batches."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from biasaudit.params.base import Section


class RayOptions(Section):
    address: str = ""  # "" starts a local Ray instance; "auto" or "ray://host:10001" joins a cluster
    num_workers: int = Field(2, ge=1)  # actors in the pool (one model copy each)
    num_cpus_per_worker: float = Field(1.0, gt=0)
    num_gpus_per_worker: float = Field(0.0, ge=0)


class Execution(Section):
    """Shared by the per-item stages (generate, classify, faces, baseline, counterfactuals, validate_edits,
    reflect); each stage keeps its own batch_size / limit / retry_failed in its own section."""

    runner: Literal["local", "ray"] = "local"  # local (the default) | ray (Ray Data actor pool, see `ray:`)
    # local runner: processes for the CPU-bound stages (faces, baseline, validate_edits); 1 = in this process
    local_workers: int = Field(1, ge=1)
    shard_index: int = Field(0, ge=0)  # this machine's shard …
    shard_count: int = Field(1, ge=1)  # … of this many (Slurm array, several VMs); an unsharded run merges them
    # a stage fails (exits non-zero, its records kept) when more than this share of its items ended with a
    # final failure (refused, unparsed, implausible, no face …; engine.StageRun.finish): one bound for every
    # per-item stage, since each stage instance is one model and the share is reported per instance
    max_final_share: float = Field(0.5, ge=0.0, le=1.0)
    # a transient failure (work.is_transient) is asked again on every run; after this many runs that all
    # failed it transiently (a deterministic NaN at a fixed seed, a server that always answers 500) it is final
    max_transient_runs: int = Field(3, ge=1)
    # a stage stops (engine.StageStopped) when its first this-many items of a run all failed with one
    # non-transient reason (a wrong model id, a revoked key): 0 = never
    stop_after_same_failures: int = Field(10, ge=0)
    # a hosted model's answer that names no answering model (no `model` / `modelVersion` field) cannot be checked
    # against the model asked: on, the stage stops on it (engine.StageStopped); off, it is recorded with
    # model_version "unverified: …" (lifecycle.UNVERIFIED), which the audit card shows
    require_verified_model: bool = True
    ray: RayOptions = Field(default_factory=RayOptions)

    @model_validator(mode="after")
    def _shard_in_range(self) -> "Execution":
        if self.shard_index >= self.shard_count:
            raise ValueError(f"shard_index: {self.shard_index} must be < shard_count ({self.shard_count})")
        return self

    @property
    def sharded(self) -> bool:
        return self.shard_count > 1
