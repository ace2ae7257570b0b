"""What an audit of this size can detect, read from the declared simulation of benchmarks/power.py
(data/reference/power/impact_ratio.csv: the card's own impact-ratio reading, simulated over photos × mean
comparisons per photo and category × true ratio). Used for each Method B card's power line and by
`biasaudit plan`. Between simulated photo counts, power is interpolated linearly in log(photos); between
simulated ratios, linearly in the ratio; the mean comparisons per photo is matched to the nearest simulated
value on a log scale (stated in the line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

TABLE = Path("data/reference/power/impact_ratio.csv")
TARGET = 0.8


def load(path: Path = TABLE) -> pd.DataFrame | None:
    return pd.read_csv(path) if Path(path).exists() else None


def nearest_per_photo(table: pd.DataFrame, per_photo: float) -> int:
    grid = np.sort(table["per_photo"].unique())
    return int(grid[np.argmin(np.abs(np.log(grid) - np.log(max(per_photo, 1e-9))))])


def power_curve(table: pd.DataFrame, photos: float, per_photo: float) -> pd.Series | None:
    """Power by true ratio at `photos` (interpolated in log photos), or None outside the simulated photos."""
    sub = table[table["per_photo"] == nearest_per_photo(table, per_photo)]
    grid = np.sort(sub["photos"].unique())
    if not grid[0] <= photos <= grid[-1]:
        return None
    wide = sub.pivot(index="true_ratio", columns="photos", values="power")[grid]
    x = np.log(photos)
    return wide.apply(lambda row: float(np.interp(x, np.log(grid), row.to_numpy())), axis=1)


def detectable_ratio(table: pd.DataFrame, photos: float, per_photo: float, power: float = TARGET) -> float | None:
    """The highest true ratio read "below 0.8" with at least `power` (NaN when none of the simulated ones is;
    None outside the simulated photo counts)."""
    curve = power_curve(table, photos, per_photo)
    if curve is None:
        return None
    r, p = curve.index.to_numpy(float), curve.to_numpy(float)
    if p[0] < power:
        return float("nan")
    above = np.nonzero(p >= power)[0][-1]
    if above == len(p) - 1:
        return float(r[-1])
    # linear between the last simulated ratio with enough power and the next
    return float(r[above] + (p[above] - power) / (p[above] - p[above + 1]) * (r[above + 1] - r[above]))


def photos_needed(table: pd.DataFrame, ratio: float, per_photo: float, power: float = TARGET) -> float | None:
    """The fewest source photos (interpolated) at which a true ratio of `ratio` is read "below 0.8" with at least
    `power`; None when even the most simulated photos do not reach it."""
    sub = table[table["per_photo"] == nearest_per_photo(table, per_photo)]
    grid = np.sort(sub["photos"].unique())
    at = np.array([float(np.interp(ratio, sub.loc[sub["photos"] == g, "true_ratio"], sub.loc[sub["photos"] == g, "power"]))
                   for g in grid])
    if at[-1] < power:
        return None
    k = int(np.nonzero(at >= power)[0][0])
    if k == 0:
        return float(grid[0])
    lo, hi = np.log(grid[k - 1]), np.log(grid[k])
    return float(np.exp(lo + (power - at[k - 1]) / (at[k] - at[k - 1]) * (hi - lo)))


def power_line(table: pd.DataFrame | None, photos: float, per_photo: float) -> str:
    """The card's sentence."""
    if table is None:
        return "Power: not available (no declared simulation at data/reference/power/impact_ratio.csv)."
    m = nearest_per_photo(table, per_photo)
    x = detectable_ratio(table, photos, per_photo)
    lo, hi = int(table["photos"].min()), int(table["photos"].max())
    size = f"{photos:g} source photos and about {per_photo:.0f} comparisons or answers per photo and category"
    if x is None:
        return (f"Power: with {size}, outside the simulated {lo}–{hi} photos: no power statement "
                "(benchmarks/power.py).")
    if np.isnan(x):
        return (f"Power: with {size}, no simulated ratio (down to {table['true_ratio'].min():g}) is read below "
                f"{TARGET} with 80% power: a clean card says little at this size (benchmarks/power.py, m = {m}).")
    return (f"Power: with {size}, an impact ratio of {x:.2f} or lower is read below 0.8 with 80% power (declared "
            f"simulation: benchmarks/power.py, 5 categories, photo effect logit sd 0.5, m = {m}); a ratio between "
            f"{x:.2f} and 0.8 may pass unread.")
