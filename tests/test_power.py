"""The power lines of the audit cards and `biasaudit plan` (biasaudit.report.power), read from hand-made
tables (expected values by hand) and from the committed simulations (benchmarks/power.py, tvd_power.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.cli import TWO_AFC_PER_PHOTO, main
from biasaudit.report import power

ROOT = Path(__file__).resolve().parents[1]
DECLARED = {"photo_sd": 0.5, "category_sd": 0.5, "replications": 100}


def hand_table() -> pd.DataFrame:
    # race: power by true ratio at 12 and 48 photos, at 8 and 32 per photo; gender: everything at power 0.5
    race = {(12, 8): (0.95, 0.60, 0.05), (48, 8): (1.0, 0.90, 0.05),
            (12, 32): (1.0, 0.80, 0.05), (48, 32): (1.0, 1.0, 0.05)}
    rows = [{"table": "race", "photos": g, "per_photo": m, "true_ratio": r, "power": p} | DECLARED
            for (g, m), powers in race.items() for r, p in zip((0.5, 0.7, 0.8), powers)]
    rows += [{"table": "gender", "photos": g, "per_photo": m, "true_ratio": r, "power": 0.5} | DECLARED
             for g in (12, 48) for m in (8, 32) for r in (0.5, 0.7, 0.8)]
    return pd.DataFrame(rows)


def test_detectable_ratio_by_hand():
    t = hand_table()
    # 12 photos, 8 per photo: 0.95 at 0.5, 0.60 at 0.7 → 0.8 reached at 0.5 + (0.95 − 0.8)/(0.95 − 0.60)·0.2
    assert power.detectable_ratio(t, 12, 8) == pytest.approx(0.5 + 0.15 / 0.35 * 0.2)
    # 24 photos: halfway in log photos between 12 and 48 → powers (0.975, 0.75, 0.05)
    assert power.detectable_ratio(t, 24, 8) == pytest.approx(0.5 + (0.975 - 0.8) / (0.975 - 0.75) * 0.2)
    # 16 per photo: halfway in log between 8 and 32 → at 12 photos powers (0.975, 0.70, 0.05)
    assert power.detectable_ratio(t, 12, 16) == pytest.approx(0.5 + (0.975 - 0.8) / (0.975 - 0.70) * 0.2)
    # above the largest per-photo count: its power (a lower bound); at 12 photos, 32 per photo: 0.80 at 0.7
    assert power.detectable_ratio(t, 12, 100) == pytest.approx(0.7)
    assert power.detectable_ratio(t, 6, 8) is None  # below the simulated photos: "no valid audit" territory
    assert power.detectable_ratio(t, 12, 1) is None  # below the simulated counts per photo
    assert math.isnan(power.detectable_ratio(t, 12, 8, name="gender"))  # each table its own: none reaches 0.8


def test_photos_needed_by_hand():
    t = hand_table()
    # ratio 0.7 at 8 per photo: 0.60 at 12 photos, 0.90 at 48 → 0.8 at log-photos 2/3 of the way: 12·4^(2/3)
    assert power.photos_needed(t, 0.7, 8) == pytest.approx(12 * 4 ** (2 / 3))
    assert power.photos_needed(t, 0.5, 8) == 12  # already at the smallest simulated size
    assert power.photos_needed(t, 0.5, 8, min_photos=20) == 20  # never fewer than min_clusters
    assert power.photos_needed(t, 0.79, 8) is None
    assert power.photos_needed(t, 0.7, 8, name="gender") is None


def test_plan_per_table_never_below_min_clusters(tmp_path, capsys):
    path = tmp_path / "t.csv"
    t = hand_table()
    pd.concat([t, t.query("table == 'race'").assign(table="race × gender")]).to_csv(path, index=False)
    # the default 2AFC design: race 32 per photo → 0.80 at 12 photos for 0.7: 12; gender never reaches it
    assert main(["plan", "--ratio", "0.7", "--table", str(path), "--params", str(tmp_path / "none.yaml")]) == 1
    out = capsys.readouterr().out
    assert re.search(r"race\s+32 per photo and category: 12 source photos", out) and "gender" in out
    hand = hand_table().query("table == 'race'")
    pd.concat([hand.assign(table=name) for name in power.TABLES]).to_csv(path, index=False)
    assert main(["plan", "--ratio", "0.7", "--per-photo", "8", "--table", str(path)]) == 0
    assert f"plan for {math.ceil(12 * 4 ** (2 / 3))} source photos" in capsys.readouterr().out
    params = tmp_path / "params.yaml"  # min_clusters raised to 40: the plan follows it
    params.write_text((ROOT / "params.yaml").read_text().replace("min_clusters: 12 ", "min_clusters: 40 "))
    assert main(["plan", "--ratio", "0.5", "--per-photo", "8", "--table", str(path), "--params", str(params)]) == 0
    assert "plan for 40 source photos" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--ratio", "0.9", "--table", str(path)])
    with pytest.raises(SystemExit):  # one target at a time
        main(["plan", "--ratio", "0.7", "--tvd", "0.1"])


def test_the_committed_simulation_is_coherent():
    """Per table: more photos never lose power beyond Monte-Carlo error, a lower ratio is never harder to read
    (common random numbers: exactly), and the grid starts at reflect_analysis.min_clusters."""
    t = pd.read_csv(ROOT / power.TABLE)
    assert set(t["table"]) == set(power.TABLES) and t["photos"].min() == 12
    assert {"photo_sd", "category_sd"} <= set(t.columns) and (t["category_sd"] > 0).all()  # effects differ by category
    tol = 3 * t["mc_se"].max()
    for (name, m), sub in t.groupby(["table", "per_photo"]):
        wide = sub.pivot(index="true_ratio", columns="photos", values="power")
        assert (np.diff(wide.to_numpy(), axis=1) >= -tol).all(), (name, m)  # along photos
        assert (np.diff(wide.to_numpy(), axis=0) <= 0).all(), (name, m)  # along ratios


def test_the_committed_plan_is_monotone():
    """The planner on the committed table: a lower ratio or lower power never needs more photos; more
    comparisons per photo never need more photos (the issue's 3 photos beating 6 cannot recur)."""
    t = pd.read_csv(ROOT / power.TABLE)
    for name in power.TABLES:
        for m in (8, 32):
            needs = [power.photos_needed(t, r, m, 0.8, name, 12) for r in (0.5, 0.6, 0.7)]
            ranked = [math.inf if n is None else n for n in needs]  # None: beyond the simulated photos
            assert ranked == sorted(ranked), (name, m, needs)
            assert (power.photos_needed(t, 0.6, m, 0.7, name, 12) or math.inf) <= ranked[1], (name, m)
        for r in (0.5, 0.6):
            a, b = power.photos_needed(t, r, 8, 0.8, name, 12), power.photos_needed(t, r, 32, 0.8, name, 12)
            assert a is None or (b is not None and b <= a + 1e-9), (name, r, a, b)


def test_readme_example_and_tvd_planner_on_the_committed_tables(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--ratio", "0.7"]) == 0
    out = capsys.readouterr().out
    need = int(re.search(r"plan for (\d+) source photos", out).group(1))
    t = pd.read_csv(ROOT / power.TABLE)
    for name in power.TABLES:  # every table reaches 0.8 at the planned size, at its design's count per photo
        curve = power.power_curve(t, need, TWO_AFC_PER_PHOTO[name], name)
        assert float(np.interp(0.7, curve.index, curve.to_numpy())) >= 0.8 - 1e-9, name
    assert need >= 12
    assert main(["plan", "--tvd", "0.1"]) == 0
    out = capsys.readouterr().out
    P, n = map(int, re.search(r"plan for (\d+) prompts × (\d+) images per prompt", out).groups())
    at = power.tvd_power(pd.read_csv(ROOT / power.TVD_TABLE), 0.1)
    grid = at[at["images_per_prompt"] == n].sort_values("prompts")
    assert float(np.interp(np.log(P), np.log(grid["prompts"]), grid["power"])) >= 0.8 - 1e-9


def test_tvd_prompts_needed_by_hand(tmp_path, capsys):
    rows = [{"prompts": P, "images_per_prompt": n, "true_tvd": d, "power": p, "median_width": 0.1, "replications": 60}
            for n, powers in ((12, {10: 0.5, 40: 0.7}), (50, {10: 0.6, 40: 0.9}))
            for P, top in powers.items() for d, p in ((0.0, 0.05), (0.2, top))]
    t = pd.DataFrame(rows)
    # δ 0.1: halfway in δ → power (12: 0.275 at 10, 0.375 at 40; 50: 0.325, 0.475): none reaches 0.8
    assert power.prompts_needed(t, 0.1, 50) is None
    # δ 0.2 at 50 images: 0.6 at 10 prompts, 0.9 at 40 → 0.8 at 2/3 of the way in log prompts: 10·4^(2/3)
    assert power.prompts_needed(t, 0.2, 50) == pytest.approx(10 * 4 ** (2 / 3))
    path = tmp_path / "tvd.csv"
    t.to_csv(path, index=False)
    assert main(["plan", "--tvd", "0.2", "--table", str(path)]) == 0
    out = capsys.readouterr().out
    P = math.ceil(10 * 4 ** (2 / 3))
    assert f"plan for {P} prompts × 50 images per prompt ({P * 50} images" in out and "12 images per prompt: not within" in out
    assert main(["plan", "--tvd", "0.1", "--table", str(path)]) == 1


def test_the_committed_tvd_simulation_is_coherent():
    t = pd.read_csv(ROOT / power.TVD_TABLE)
    tol = 3 * t["mc_se"].max()
    null = t[t["true_tvd"] == 0]
    assert (null["power"] <= 0.05 + tol).all(), null  # a matching generator is rarely called distorted
    for (n, d), sub in t.groupby(["images_per_prompt", "true_tvd"]):
        p = sub.sort_values("prompts")["power"].to_numpy()
        assert (np.diff(p) >= -tol).all(), (n, d)


def test_power_line_wording():
    t = hand_table()
    line = power.power_line(t, 12, 8)
    assert line.startswith("Power (race): ")
    assert f"an impact ratio of {0.5 + 0.15 / 0.35 * 0.2:.2f} or lower is read below 0.8 with 80% power" in line
    assert "photo effect logit sd 0.5 shared and 0.5 by category" in line
    assert "below the simulated 12 photos" in power.power_line(t, 6, 8)
    assert "not available" in power.power_line(None, 12, 8)
    assert "a clean table says little" in power.power_line(t, 12, 8, "gender")


def test_a_vlm_card_states_its_power_per_table_from_its_own_size(tmp_path):
    from biasaudit.report import audit_card as ac

    from .test_audit_card import BOOT, _units

    (tmp_path / "responses").mkdir()
    _units(12, seed=1).to_parquet(tmp_path / "responses" / "v.parquet")
    out = tmp_path / "audit"
    race = hand_table().query("table == 'race'").replace({"per_photo": {8: 2, 32: 8}})
    ac.build_cards(tmp_path / "reports", tmp_path / "responses", BOOT, BOOT, {"salary_salary": None}, stand_in=False, out_dir=out,
                   power_table=pd.concat([race, race.assign(table="race × gender")]))
    card = pd.read_csv(out / "v.csv")
    rates = card[card["measure"].str.startswith("2afc")]
    # by hand: per photo, White and Black each appear in all 4 comparisons (race rows), each race × gender in 2,
    # and no comparison differs in gender alone (no gender rows)
    assert ac.per_photo(rates[rates["dimension"] == "race"]) == 4.0
    assert ac.per_photo(rates[rates["dimension"] == "race × gender"]) == 2.0
    page = (out / "v.html").read_text()
    # race: 4 per photo is halfway in log between 2 and 8 → at 12 photos powers (0.975, 0.70, 0.05)
    x = 0.5 + (0.975 - 0.8) / (0.975 - 0.70) * 0.2
    assert f"Power (race): with 12 source photos and about 4 comparisons or answers per photo and category, an " \
           f"impact ratio of {x:.2f} or lower" in page
    # race × gender: 2 per photo, the simulated 2 → (0.95, 0.60, 0.05)
    assert f"Power (race × gender): with 12 source photos and about 2 comparisons or answers per photo and " \
           f"category, an impact ratio of {0.5 + 0.15 / 0.35 * 0.2:.2f} or lower" in page
    assert "Power (gender)" not in page  # no gender table on this card
