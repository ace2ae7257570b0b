"""Section `reliability`: the reliability stage's outputs (classifier vs raters) as a report section."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.t2i.analysis.inputs import Inputs


def compute(inputs: Inputs, cfg: Any) -> Result:
    """The reliability stage's κ tables and confusion matrix, as a section (no parameters of its own)."""
    res = Result("reliability", "Classifier reliability")
    rel = inputs.root / C.RELIABILITY_DIR
    if not rel.is_dir() or not any(rel.iterdir()):
        res.status, res.reason = NO_DATA, "no reliability outputs (reports/t2i/reliability/ missing or empty)"
        return res
    summary_path = rel / "summary.json"
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as exc:
            summary = {}
            res.notes.append(f"summary.json unreadable: {exc}")
        flat = pd.json_normalize(summary, sep=".").to_dict("records")
        res.metrics = {k: v for k, v in (flat[0] if flat else {}).items() if isinstance(v, (int, float))}
        if summary.get("status") not in (None, "ok"):
            res.status, res.reason = NO_DATA, str(summary.get("reason") or summary.get("status"))
    res.notes.append("tables: " + ", ".join(sorted(p.name for p in rel.glob("*.csv"))))
    return res
