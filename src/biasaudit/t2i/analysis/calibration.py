"""Section `calibration`: the committed calibration table of benchmarks/calibration.py."""

from __future__ import annotations

from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.t2i.analysis.inputs import Inputs

CALIBRATION_FILES = ("benchmarks/results/calibration.csv", "reports/calibration/calibration.csv")  # committed copy first


def band_count(table: pd.DataFrame) -> str:
    """What the table shows, counted: the coverage and rejection rows inside their band (flag `ok`:
    coverage within [0.93, 0.97], rejection within [0.03, 0.07]), the rows below or above it by their
    label, and the measured rows (power, shares of replications) that have no nominal value."""
    rated = table["kind"].isin(["coverage", "rejection"])
    ok = rated & table["flag"].eq("ok")
    labels = table.loc[rated & ~ok, "flag"].value_counts()
    text = (f"{int(ok.sum())} of {int(rated.sum())} coverage and rejection rows within their band (coverage "
            f"0.93–0.97, rejection 0.03–0.07); {int((rated & ~ok).sum())} outside it, each labelled")
    if len(labels):
        text += ": " + "; ".join(f"{n} × {flag!r}" for flag, n in labels.items())
    measured = int((~rated).sum())
    return text + (f"; {measured} measured rows (power, share closer than raw) have no band" if measured else "")


def compute(inputs: Inputs, cfg: Any) -> Result:
    """The calibration table of benchmarks/calibration.py: how far each interval and test can be
    trusted (coverage of the nominal 95%, rejection at 0.05 under a true null, by simulation)."""
    res = Result("calibration", "Calibration: every interval and test checked by simulation with known truth")
    path = next((inputs.root / f for f in CALIBRATION_FILES if (inputs.root / f).exists()), None)
    if path is None:
        res.status, res.reason = NO_DATA, f"no calibration table ({' or '.join(CALIBRATION_FILES)}): run benchmarks/calibration.py"
        return res
    table = pd.read_csv(path)
    res.tables = {C.CALIBRATION.name: table}
    res.notes.append(f"from {path.relative_to(inputs.root).as_posix()}: {band_count(table)}")
    res.metrics = {f"{r.method} · {r.setting}": {"observed": r.observed, "nominal": r.nominal, "mc_se": r.mc_se,
                                                 "flag": r.flag} for r in table.itertuples()}
    return res
