"""Section `instruments`: the instruments stage's L* sweep (detectors and skin masks) for the report."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit import known_truth as K
from biasaudit.pipeline.outputs import NO_DATA, Figure, Result
from biasaudit.t2i.analysis.inputs import Inputs

COLUMNS = ["model", "category_or_group"] + K.COLUMNS
# check: the interval claims to cover the planted value (an estimator beside its estimand). Rows with
# check False are raw or partly corrected estimates, shown for the size of what the corrections remove.
# An interval as wide as the quantity's plausible range is uninformative (counted apart, never covered).
PLANTED_NOTE = "PLANTED truth: declared distributions, not a generator; the check tests the audit, not a model"
PLAUSIBLE_RANGE = {"mean_L": 100.0, "diversity_de2000": 100.0}  # L* 0–100, ΔE2000 0–100; shares and TVDs: 1


# ---------------------------------------------------------------- the instruments stage, for the report

def compute(inputs: Inputs, cfg: Any) -> Result:
    """The `instruments` stage's sweep (reports/t2i/instruments) as a report section."""
    from biasaudit.t2i.figures import plot_sweep

    res = Result("instruments", "Instrument bias by skin tone (detectors and skin masks on an L* sweep)")
    directory = inputs.root / C.INSTRUMENTS_DIR
    if not (directory / "summary.csv").exists():
        res.status, res.reason = NO_DATA, f"no {directory}/summary.csv (run the instruments stage)"
        return res
    summary = pd.read_csv(directory / "summary.csv")
    res.tables[C.INSTRUMENTS_SUMMARY.name] = summary
    if (directory / "dark_rates.csv").exists():
        dark = pd.read_csv(directory / "dark_rates.csv")
        res.tables["instruments_dark_rates"] = dark
        res.metrics = {f"{r.method}/{r.mode}/{r.L_range}": {"detection_rate": r.detection_rate,
                                                            "mean_score": r.mean_score}
                       for r in dark.itertuples()}
    if (directory / "summary.json").exists():
        methods = json.loads((directory / "summary.json").read_text()).get("methods", {})
        res.notes += [f"{k}: {v}" for k, v in methods.items()]
    res.figures["instruments"] = Figure(plot_sweep(summary), "Detectors and skin masks over an L* sweep",
                                        "The packaged photos recoloured to each target L* (solid: skin only, "
                                        "dashed: whole image); detection rate, score, measured − target L*, "
                                        "mask area relative to the true mask.")
    return res
