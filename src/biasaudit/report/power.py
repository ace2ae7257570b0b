"""What an audit of this size can detect, read from two declared simulations; used for each Method B card's
power lines and by `biasaudit plan`.

- Impact ratios (benchmarks/power.py → data/reference/power/impact_ratio.csv): the card's own impact-ratio
  reading, simulated per table (gender, race, race × gender) over source photos × mean comparisons (or
  answers) per photo and category of the table × true ratio, with photo effects that differ by category.
  Between simulated photo counts, power is interpolated linearly in log(photos); between simulated mean
  counts per photo, linearly in their log (above the largest, the largest's power: a lower bound); between
  simulated ratios, linearly in the ratio. No power is stated below the smallest simulated photo count
  (reflect_analysis.min_clusters: fewer photos are "no valid audit").
- Method A's TVD (benchmarks/tvd_power.py → data/reference/power/tvd.csv): the corrected TVD's honest
  interval excluding 0, over prompts × images per prompt × true mean TVD."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

TABLE = Path("data/reference/power/impact_ratio.csv")
TVD_TABLE = Path("data/reference/power/tvd.csv")
TARGET = 0.8
TABLES = ("gender", "race", "race × gender")  # the card's tables, in the order the plan prints them


def load(path: Path = TABLE) -> pd.DataFrame | None:
    return pd.read_csv(path) if Path(path).exists() else None


def _log_interp(x: float, grid: np.ndarray, values: np.ndarray) -> float:
    """values interpolated linearly in log(x) over the increasing grid (clamped at both ends)."""
    return float(np.interp(np.log(x), np.log(grid), values))


def power_curve(table: pd.DataFrame, photos: float, per_photo: float, name: str = "race") -> pd.Series | None:
    """Power by true ratio in table `name` at `photos` and `per_photo`; None below the simulated photos or
    per-photo counts (above them, the largest simulated size's power: a lower bound)."""
    sub = table[table["table"] == name]
    photo_grid, m_grid = np.sort(sub["photos"].unique()), np.sort(sub["per_photo"].unique())
    if photos < photo_grid[0] or per_photo < m_grid[0]:
        return None
    cube = sub.pivot_table(index="true_ratio", columns=["photos", "per_photo"], values="power")
    at_m = pd.DataFrame({g: cube[g][m_grid].apply(lambda row: _log_interp(per_photo, m_grid, row.to_numpy(float)),
                                                  axis=1) for g in photo_grid})
    return at_m.apply(lambda row: _log_interp(photos, photo_grid, row.to_numpy(float)), axis=1)


def detectable_ratio(table: pd.DataFrame, photos: float, per_photo: float, power: float = TARGET,
                     name: str = "race") -> float | None:
    """The highest true ratio read "below 0.8" with at least `power` (NaN when none of the simulated ones is;
    None outside the simulated sizes)."""
    curve = power_curve(table, photos, per_photo, name)
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


def photos_needed(table: pd.DataFrame, ratio: float, per_photo: float, power: float = TARGET, name: str = "race",
                  min_photos: int = 0) -> float | None:
    """The fewest source photos (interpolated in log photos, never fewer than `min_photos`) at which a true ratio
    of `ratio` is read "below 0.8" in table `name` with at least `power`; None when even the most simulated
    photos do not reach it."""
    grid = np.sort(table.loc[table["table"] == name, "photos"].unique())
    at = []
    for g in grid:
        curve = power_curve(table, g, per_photo, name)
        if curve is None:
            return None
        at.append(float(np.interp(ratio, curve.index.to_numpy(float), curve.to_numpy(float))))
    at = np.array(at)
    if at[-1] < power:
        return None
    k = int(np.nonzero(at >= power)[0][0])
    if k == 0:
        need = float(grid[0])
    else:
        lo, hi = np.log(grid[k - 1]), np.log(grid[k])
        need = float(np.exp(lo + (power - at[k - 1]) / (at[k] - at[k - 1]) * (hi - lo)))
    return max(need, float(min_photos))


def declared(table: pd.DataFrame) -> str:
    first = table.iloc[0]
    return (f"declared simulation: benchmarks/power.py, photo effect logit sd {first['photo_sd']:g} shared and "
            f"{first['category_sd']:g} by category, {int(first['replications'])} runs per size")


def power_line(table: pd.DataFrame | None, photos: float, per_photo: float, name: str = "race") -> str:
    """The card's sentence for one table."""
    if table is None or "table" not in table or name not in set(table["table"]):
        return f"Power ({name}): not available (no declared simulation at {TABLE})."
    sub = table[table["table"] == name]
    x = detectable_ratio(table, photos, per_photo, name=name)
    lo = int(sub["photos"].min())
    size = f"{photos:g} source photos and about {per_photo:.0f} comparisons or answers per photo and category"
    if x is None:
        return (f"Power ({name}): with {size}, below the simulated {lo} photos or {int(sub['per_photo'].min())} per "
                "photo: no power statement (benchmarks/power.py).")
    if np.isnan(x):
        return (f"Power ({name}): with {size}, no simulated ratio (down to {sub['true_ratio'].min():g}) is read "
                f"below {TARGET} with 80% power: a clean table says little at this size ({declared(table)}).")
    return (f"Power ({name}): with {size}, an impact ratio of {x:.2f} or lower is read below 0.8 with 80% power "
            f"({declared(table)}); a ratio between {x:.2f} and 0.8 may pass unread.")


# ------------------------------------------------------------------------------------------ Method A: TVD

def tvd_power(table: pd.DataFrame, delta: float) -> pd.DataFrame:
    """Power at a true mean TVD of `delta` for each simulated prompts × images per prompt (linear in δ between
    the simulated ones)."""
    rows = []
    for (P, n), sub in table.groupby(["prompts", "images_per_prompt"]):
        sub = sub.sort_values("true_tvd")
        rows.append({"prompts": P, "images_per_prompt": n,
                     "power": float(np.interp(delta, sub["true_tvd"], sub["power"])),
                     "width": float(np.interp(delta, sub["true_tvd"], sub["median_width"]))})
    return pd.DataFrame(rows)


def prompts_needed(table: pd.DataFrame, delta: float, images_per_prompt: int, power: float = TARGET) -> float | None:
    """The fewest prompts (interpolated in log prompts) at which, with `images_per_prompt` images each, a true
    mean TVD of `delta` is detected (honest interval above 0) with at least `power`; None when the simulated
    prompts do not reach it."""
    at = tvd_power(table, delta)
    at = at[at["images_per_prompt"] == images_per_prompt].sort_values("prompts")
    grid, p = at["prompts"].to_numpy(float), at["power"].to_numpy(float)
    if not len(p) or p[-1] < power:
        return None
    k = int(np.nonzero(p >= power)[0][0])
    if k == 0:
        return float(grid[0])
    lo, hi = np.log(grid[k - 1]), np.log(grid[k])
    return float(np.exp(lo + (power - p[k - 1]) / (p[k] - p[k - 1]) * (hi - lo)))
