"""The vocabulary shared by the engine (biasaudit.pipeline.engine) and its runners (biasaudit.pipeline.scale): a work item,
a batch function and a run's summary. It imports nothing from the package, so the runners need not
import the engine that dispatches to them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Item = dict[str, Any]
BatchFn = Callable[[list[Item]], list[Item]]

# A failed record is *transient* when trying again can succeed: the transport gave up on the request
# (connection, timeout, HTTP 408/409/429/5xx, a malformed body: "gave up after N attempts/retries: …",
# backends/transport.py) or a local model produced a numerical fault (NaN / all-black: "numerical: …").
# A record may also say so itself (`transient: true|false`). Every other status is *final*: refused,
# unparsed or implausible answers, no face, an unreadable file, a rejected request (HTTP 4xx).
TRANSIENT_REASONS = ("gave up after", "numerical:")
TRANSIENT_RUNS = "transient_runs"  # how many runs in a row the item failed transiently (engine: capped)
# a hosted model's record whose answer named no answering model carries this as its model_version
# (lifecycle.version_of); the engine stops a probed stage on it under execution.require_verified_model
UNVERIFIED = "unverified: the API named no answering model"
NOT_ATTEMPTED = frozenset({"ok", "skipped", "not_used"})  # not failures of this stage (skipped: upstream)


def is_transient(record: Item) -> bool:
    """Whether `record` is a failure that the next run must try again (see TRANSIENT_REASONS)."""
    if record.get("transient") is not None:
        return bool(record["transient"])
    return str(record.get("status", "ok")) == "failed" and str(record.get("reason") or "").lower().startswith(TRANSIENT_REASONS)


def cap_transient(record: Item, previous: Item | None, max_runs: int) -> Item:
    """`record` with the count of runs in a row that failed it transiently; at `max_runs` it becomes final
    (`transient: false`, the reason saying so), so a failure that never goes away cannot keep a stage from
    ending."""
    if not is_transient(record):
        return record
    runs = int((previous or {}).get(TRANSIENT_RUNS, 0) if previous is not None and is_transient(previous) else 0) + 1
    if runs >= max_runs:
        return record | {TRANSIENT_RUNS: runs, "transient": False,
                         "reason": f"final after {runs} runs that failed transiently: {record.get('reason', '')}"}
    return record | {TRANSIENT_RUNS: runs}


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
    # over the current records of the stage's items (this run's and earlier ones), after the run:
    retried_transient: int = 0  # transient failures of earlier runs asked again by this one
    records: int = 0  # items with a current record
    transient: int = 0  # of those, transient failures (the next run asks them again)
    transient_reasons: dict[str, int] = field(default_factory=dict)  # their reasons (first 120 characters)
    final: dict[str, int] = field(default_factory=dict)  # final statuses other than ok / skipped, by status
    final_share: float = 0.0  # sum(final) / records

    def tally(self, records: list[Item]) -> None:
        """Transient and final failures among the current records of the stage."""
        self.records, self.transient, self.transient_reasons, self.final = len(records), 0, {}, {}
        for r in records:
            status = str(r.get("status", "ok"))
            if is_transient(r):
                self.transient += 1
                reason = str(r.get("reason") or "")[:120]
                self.transient_reasons[reason] = self.transient_reasons.get(reason, 0) + 1
            elif status not in NOT_ATTEMPTED:
                self.final[status] = self.final.get(status, 0) + 1
        self.final_share = sum(self.final.values()) / self.records if self.records else 0.0

    def count(self, records: list[Item]) -> None:
        for r in records:
            status = str(r.get("status", "ok"))
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
        self.processed += len(records)
