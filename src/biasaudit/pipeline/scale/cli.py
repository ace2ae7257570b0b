"""Command-line overrides of the shared `execution:` section for the stage CLIs
(`python -m biasaudit.t2i.generate --model X --shard-index 3 --shard-count 8`, `--runner ray`)."""

from __future__ import annotations

import argparse
from typing import Any


def add_execution_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("execution (overrides params.yaml execution:)")
    group.add_argument("--runner", choices=["local", "ray"], default=None)
    group.add_argument("--local-workers", type=int, default=None, help="processes for CPU-bound stages (local)")
    group.add_argument("--shard-index", type=int, default=None, help="this machine's shard (0-based)")
    group.add_argument("--shard-count", type=int, default=None, help="number of shards (1 = merge and finish)")
    group.add_argument("--ray-address", default=None, help="'auto' joins the local node's cluster")
    group.add_argument("--ray-workers", type=int, default=None, help="actors in the pool")
    group.add_argument("--ray-gpus-per-worker", type=float, default=None)


def apply_execution_args(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The raw params dict with the given command-line values in `execution` (validated by the caller)."""
    ex = dict(raw.get("execution") or {})
    ray = dict(ex.get("ray") or {})
    for key, value in (("runner", args.runner), ("local_workers", args.local_workers),
                       ("shard_index", args.shard_index), ("shard_count", args.shard_count)):
        if value is not None:
            ex[key] = value
    for key, value in (("address", args.ray_address), ("num_workers", args.ray_workers),
                       ("num_gpus_per_worker", args.ray_gpus_per_worker)):
        if value is not None:
            ray[key] = value
    return raw | {"execution": ex | {"ray": ray}}
