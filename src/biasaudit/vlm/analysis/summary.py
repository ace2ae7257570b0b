"""reports/vlm/summary.json: per VLM, what it is, what it answered, and the headline estimates of the sections
(the keys: the package docstring). Computed from the sections' shared estimates, so nothing is computed twice."""

from __future__ import annotations

import json
from typing import Any

from biasaudit import contracts as C
from biasaudit.vlm.analysis import gaps, significance, two_afc, validation
from biasaudit.vlm.analysis.inputs import Answers, Inputs, counts, degenerate


def vlm_summary(answers: Answers, cfg: Any) -> dict[str, Any]:
    tasks = two_afc.estimates(answers, cfg)
    out = {"model_id": answers.model_id, "backend": answers.backend, "stand_in": answers.stand_in,
           **counts(answers.responses), "position_bias": {t: e["position_bias"] for t, e in tasks.items()},
           "race_win_rates": {t: two_afc.race_win_rates(e) for t, e in tasks.items()},
           "bradley_terry": {t: e["bt_reason"] if e["bradley_terry"] is None else e["bradley_terry"].to_dict("records")
                             for t, e in tasks.items()},
           "degenerate": degenerate(answers, cfg), "notes": significance.notes(answers, cfg)}
    check = validation.compute(answers, cfg)
    if check is not None:
        out["validation"] = check.metrics
    within = gaps.estimates(answers, cfg)["delta_g"]
    if within is not None:
        out["delta_g"] = gaps.delta_g_metrics(within)
    return out


def compute(inputs: Inputs, cfg: Any) -> dict[str, Any]:
    """The whole summary: profile, each VLM's, stand_in (any VLM's), and the edit checks' summary when present."""
    out: dict[str, Any] = {"profile": cfg.profile, "vlms": {a.vlm: vlm_summary(a, cfg) for a in inputs.vlms}}
    out["stand_in"] = any(s["stand_in"] for s in out["vlms"].values())
    edit_summary = C.EDIT_CHECKS_REPORTS / "summary.json"
    out["edit_checks"] = json.loads(edit_summary.read_text()) if edit_summary.exists() else None
    return out
