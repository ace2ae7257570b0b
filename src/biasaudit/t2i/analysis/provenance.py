"""Section `provenance`: what the upstream stages produced (counts per stage and model: status,
abstentions, missing faces) and the models' ids and revisions."""

from __future__ import annotations

from typing import Any

from biasaudit.pipeline.outputs import Result
from biasaudit.t2i.analysis.inputs import Inputs, model_provenance, stage_counts


def compute(inputs: Inputs, cfg: Any) -> Result:
    res = Result("provenance", "Provenance", tables={"provenance_stage_counts": stage_counts(inputs),
                                                     "provenance_models": model_provenance(inputs.manifests)})
    res.notes += [f"{k}: {v}" for k, v in inputs.notes.items()]
    return res
