"""The power line of the audit cards and `biasaudit plan` (biasaudit.report.power), read from a hand-made
table (expected values by hand) and from the committed simulation (benchmarks/power.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.cli import main
from biasaudit.report import power

ROOT = Path(__file__).resolve().parents[1]


def hand_table() -> pd.DataFrame:
    # power by true ratio at 12 and 48 photos (per_photo 8), and a second per_photo (32) that must not be read
    rows = []
    for photos, powers in ((12, (0.95, 0.60, 0.05)), (48, (1.0, 0.90, 0.05))):
        rows += [{"photos": photos, "per_photo": 8, "true_ratio": r, "power": p} for r, p in zip((0.5, 0.7, 0.8), powers)]
    rows += [{"photos": g, "per_photo": 32, "true_ratio": r, "power": 1.0} for g in (12, 48) for r in (0.5, 0.7, 0.8)]
    return pd.DataFrame(rows)


def test_detectable_ratio_by_hand():
    t = hand_table()
    # 12 photos: 0.95 at 0.5, 0.60 at 0.7 → 0.8 reached at 0.5 + (0.95 − 0.8)/(0.95 − 0.60)·0.2
    assert power.detectable_ratio(t, 12, 8) == pytest.approx(0.5 + 0.15 / 0.35 * 0.2)
    # 24 photos: halfway in log photos between 12 and 48 → powers (0.975, 0.75, 0.05)
    assert power.detectable_ratio(t, 24, 8) == pytest.approx(0.5 + (0.975 - 0.8) / (0.975 - 0.75) * 0.2)
    # per_photo 6 is nearest (log scale) to 8, not 32
    assert power.detectable_ratio(t, 12, 6) == power.detectable_ratio(t, 12, 8)
    assert power.detectable_ratio(t, 6, 8) is None  # outside the simulated photos
    assert math.isnan(power.detectable_ratio(t.assign(power=0.1), 12, 8))  # no ratio reaches 0.8


def test_photos_needed_by_hand():
    t = hand_table()
    # ratio 0.7: 0.60 at 12 photos, 0.90 at 48 → 0.8 at log-photos 2/3 of the way: 12·4^(2/3)
    assert power.photos_needed(t, 0.7, 8) == pytest.approx(12 * 4 ** (2 / 3))
    assert power.photos_needed(t, 0.5, 8) == 12  # already at the smallest simulated size
    assert power.photos_needed(t, 0.79, 8) is None


def test_plan_prints_the_photos_needed(tmp_path, capsys):
    path = tmp_path / "t.csv"
    hand_table().to_csv(path, index=False)
    assert main(["plan", "--ratio", "0.7", "--table", str(path)]) == 0
    assert f"needs about {math.ceil(12 * 4 ** (2 / 3))} source photos" in capsys.readouterr().out
    assert main(["plan", "--ratio", "0.79", "--table", str(path)]) == 1
    with pytest.raises(SystemExit):
        main(["plan", "--ratio", "0.9", "--table", str(path)])


def test_the_committed_simulation_is_coherent():
    """The declared simulation: more photos never lose power beyond Monte-Carlo error, a lower ratio is never
    harder to read, and at the 0.8 boundary from 12 photos the reading is no more than a false mark."""
    t = pd.read_csv(ROOT / power.TABLE)
    tol = 3 * t["mc_se"].max() + 0.02
    for m, sub in t.groupby("per_photo"):
        wide = sub.pivot(index="true_ratio", columns="photos", values="power")
        assert (np.diff(wide.to_numpy(), axis=1) >= -tol).all(), m  # along photos
        assert (np.diff(wide.to_numpy(), axis=0) <= tol).all(), m  # along ratios
    boundary = t[(t["true_ratio"] == 0.8) & (t["photos"] >= 12)]
    assert (boundary["power"] <= 0.05 + 3 * boundary["mc_se"] + 0.02).all(), boundary


def test_power_line_wording():
    t = hand_table()
    line = power.power_line(t, 12, 8)
    assert f"an impact ratio of {0.5 + 0.15 / 0.35 * 0.2:.2f} or lower is read below 0.8 with 80% power" in line
    assert "outside the simulated" in power.power_line(t, 200, 8)
    assert "not available" in power.power_line(None, 12, 8)


def test_a_vlm_card_states_its_power_from_its_own_size(tmp_path):
    from biasaudit.report import audit_card as ac

    from .test_audit_card import BOOT, _units

    (tmp_path / "responses").mkdir()
    _units(12, seed=1).to_parquet(tmp_path / "responses" / "v.parquet")
    out = tmp_path / "audit"
    ac.build_cards(tmp_path / "reports", tmp_path / "responses", BOOT, BOOT, {}, stand_in=False, out_dir=out,
                   power_table=hand_table())
    card = pd.read_csv(out / "v.csv")
    rates = card[card["measure"].str.startswith("2afc")]
    # by hand: per photo, White and Black each appear in all 4 comparisons (race rows), each race × gender in 2,
    # and no comparison differs in gender alone: the median of (4, 4, 2, 2, 2, 2) is 2
    assert ac.per_photo(rates) == 2.0
    page = (out / "v.html").read_text()
    x = power.detectable_ratio(hand_table(), 12, 2)
    assert "with 12 source photos and about 2 comparisons" in page and f"ratio of {x:.2f} or lower" in page
