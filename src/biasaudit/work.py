"""The vocabulary shared by the engine (biasaudit.engine) and its runners (biasaudit.scale): a work item,
a batch function and a run's summary. It imports nothing from the package, so the runners need not
import the engine that dispatches to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Item = dict[str, Any]
BatchFn = Callable[[list[Item]], list[Item]]


@dataclass
class RunSummary:
    total: int = 0
    already_done: int = 0
    other_shards: int = 0
    processed: int = 0
    # records redone because they were made with other settings, from other input content under the
    # same id, or their output no longer checks out (Stage.still_valid: e.g. the image file changed)
    stale: dict[str, int] = field(default_factory=lambda: {"settings": 0, "input": 0, "output": 0})
    retried_failed: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    accounting: dict[str, Any] | None = None

    def count(self, records: list[Item]) -> None:
        for r in records:
            status = str(r.get("status", "ok"))
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        self.processed += len(records)
