"""The fast subset of benchmarks/calibration.py: key intervals and tests at paper scale, by simulation
with known truth (issue 17). Coverage / rejection must lie within Monte-Carlo error of nominal."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import calibration_module as _calibration

REPS = 80




@pytest.mark.slow
def test_fast_calibration_subset_is_within_monte_carlo_error(tmp_path):
    cal = _calibration()
    table = cal.main(["--fast", "--reps", str(REPS), "--n-boot", "299", "--n-perm", "99",
                      "--out", str(tmp_path / "calibration.csv")])
    assert set(cal.FAST) <= set(table["method"]) and (table["scale"] == "paper").all()
    for row in table[table["method"].isin(cal.FAST)].itertuples():
        se = np.sqrt(row.nominal * (1 - row.nominal) / REPS)
        assert abs(row.observed - row.nominal) <= 3 * se + 1e-9, (row.method, row.observed)


def test_flags_label_small_scale_shortfalls():
    cal = _calibration()
    row = {"kind": "coverage", "observed": 0.85, "scale": "small"}
    assert cal.flag(row, "") == "under-covers: falls short (small scale)"
    assert cal.flag(row | {"scale": "paper"}, "") == "under-covers: FAILS at paper scale"
    assert cal.flag({"kind": "rejection", "observed": 0.05, "scale": "paper"}, "") == "ok"
    assert cal.flag({"kind": "rejection", "observed": 0.12, "scale": "small"}, "") == "over-rejects: falls short (small scale)"
