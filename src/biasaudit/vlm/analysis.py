"""REFLECT analysis: from a VLM's answers to win rates, gaps and significance tests.

Input: `data/vlm/responses/<vlm>.parquet` (one row per question; see vlm/tasks.py). Only rows with
status 'ok' are *retained*; the others are counted per status.

Output format of `reports/vlm/` (the same writer as reports/t2i: biasaudit.outputs.OutputWriter):

    reports/vlm/summary.json     {"profile", "stand_in", "vlms": {<vlm>: {"model_id", "backend", "stand_in",
                                  "n_questions", "status_counts" {"kind/status": n}, "retained" {kind: n},
                                  "position_bias" {task: {...}}, "race_win_rates" {task: {gender: {race: rate}}},
                                  "bradley_terry" {task: rows | reason}, "delta_g", "notes"}},
                                  "edit_checks": reports/vlm/edit_checks/summary.json (when present)}
    reports/vlm/manifest.json    sections (one per VLM × {2afc, mcq, significance}) with status, reason,
                                  notes, figures [{name, title, caption, png, svg}], tables [{name, csv, md}]
    reports/vlm/metrics.json     headline numbers per section
    reports/vlm/tables/*.csv|md  tidy tables with a `vlm` column: <vlm>_winrate_<task> (row, col, wins, n,
                                  rate), <vlm>_race_winrate_<task>, <vlm>_bradley_terry_<task>, <vlm>_mean_gaps,
                                  <vlm>_salary_gaps_by_occupation, <vlm>_ols, <vlm>_sign_flip
    reports/vlm/figures/*.png|svg  win-rate heatmaps, race win rates, Δg bars, salary gaps by occupation

Definitions (the paper's, made exact):
- win-rate cell (r, c) = #(retained comparisons of r vs c, either order, where r was chosen) / #(retained
  comparisons of r vs c); the diagonal is empty.
- race win rate within gender g: over retained comparisons between two different races of gender g,
  #(wins of race r) / #(comparisons involving race r).
- position bias: share_first = P(answer 'A'); position_bias_rate = among pairs retained in *both
  orders* (one answer with each group shown first; a pair asked twice in the same order is not one),
  the share where the same *position* was chosen both times (i.e. the chosen group flipped with order).
- Bradley–Terry: logit P(A chosen) = α + β_groupA − β_groupB (α = position effect), β_ref = 0, fitted by
  statsmodels Logit with errors clustered by source photo; CIs and p from those errors with a t(G − 1)
  reference (G photos), as for the OLS.
- Δg, headline (`delta_g` table): computed *within source photo*. For race level g, cells are (photo,
  gender); in every cell holding both g and the reference, d = mean y of g − mean y of the reference.
  Δg = 100 · Σ d / Σ (reference mean) over those matched cells; CI by the cluster bootstrap over
  photos, p-value by the sign-flip test of the per-photo mean d, Holm/BH-adjusted over the table.
  Unbalanced retention (e.g. no Black woman retained) therefore compares like with like.
- Δg, pooled (`mean_gaps`, the paper's) = 100 · (mean value of g − mean value of the reference) / mean
  value of the reference over all retained answers; biased when retention is unbalanced.
  Values from the bracket table in params (reference: White for race, woman (Female) for gender).
- salary gap (per occupation) = 100 · (mean salary of g − mean of the reference) / mean of the reference.
- OLS: value ~ race + gender + source-photo fixed effects (within transformation), CR1 errors clustered
  by source photo, t(G − 1) reference (`p_t`), and a wild cluster restricted bootstrap (`p_wild`,
  Webb or Rademacher weights) that stays valid with few photos; `p` is the wild p-value when computed.
- sign-flip test: per source photo, d = mean(value | g) − mean(value | reference); H0: d symmetric about
  0; p two-sided from scipy.stats.permutation_test (exact when 2^n ≤ n_permutations); with a single
  photo p = 1 and a reason (a sign flip of one value cannot reject).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.params.vlm import GENDERS, RACES
from biasaudit.vlm.groups import CODE_TO_GROUP, GROUP_CODES

OK = "ok"


def retained(df: pd.DataFrame, kind: str, task: str | None = None) -> pd.DataFrame:
    """Rows of one kind (and task) that have a valid answer."""
    sel = (df["kind"] == kind) & (df["status"] == OK)
    if task is not None:
        sel &= df["task"] == task
    return df.loc[sel]


# ----------------------------------------------------------------------------------------- 2AFC

def _winners(two_afc: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    first = two_afc["choice"].to_numpy() == "A"
    winner = np.where(first, two_afc["group_a"].to_numpy(), two_afc["group_b"].to_numpy())
    loser = np.where(first, two_afc["group_b"].to_numpy(), two_afc["group_a"].to_numpy())
    return winner, loser


def win_counts(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> pd.DataFrame:
    """wins[r, c] = retained comparisons in which r was chosen over c."""
    winner, loser = _winners(two_afc)
    wins = pd.crosstab(pd.Categorical(winner, categories=groups), pd.Categorical(loser, categories=groups),
                       dropna=False)
    wins = wins.reindex(index=list(groups), columns=list(groups), fill_value=0)
    wins.index.name, wins.columns.name = "row", "col"
    return wins


def win_rate_matrix(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rate, n): rate[r, c] = wins of r over c / comparisons of r and c; NaN where n = 0."""
    wins = win_counts(two_afc, groups)
    n = wins + wins.T
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = wins / n.where(n > 0)
    return rate, n


def unit_win_counts(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> np.ndarray:
    """W[u, r, c] = retained comparisons on source photo u in which r was chosen over c."""
    winner, loser = _winners(two_afc)
    units = pd.factorize(two_afc["unit"])[0] if len(two_afc) else np.zeros(0, int)
    index = {g: i for i, g in enumerate(groups)}
    W = np.zeros((int(units.max()) + 1 if len(units) else 0, len(groups), len(groups)))
    np.add.at(W, (units, [index[g] for g in winner], [index[g] for g in loser]), 1.0)
    return W


def _boot(params: Any) -> dict[str, Any]:
    """The resampling settings of the reflect_analysis section (cluster bootstrap over source photos)."""
    return {"n_boot": getattr(params, "n_boot", 2000), "level": getattr(params, "confidence", 0.95),
            "method": getattr(params, "bootstrap_method", "percentile"), "seed": getattr(params, "seed", 0)}


def ratio_intervals(wins: np.ndarray, n: np.ndarray, boot: dict[str, Any] | None) -> pd.DataFrame:
    """rate = Σ_u wins / Σ_u n per column of the (U, m) arrays, with a cluster-bootstrap CI over photos."""
    m = wins.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n.sum(0) > 0, wins.sum(0) / n.sum(0), np.nan)
    out = pd.DataFrame({"wins": wins.sum(0).astype(int), "n": n.sum(0).astype(int), "rate": rate})
    if boot is None:
        return out
    from biasaudit.stats.resample import cluster_bootstrap

    def stat(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sums[..., m:] > 0, sums[..., :m] / sums[..., m:], np.nan)

    ivs = cluster_bootstrap(np.hstack([wins, n]), stat, **boot)
    return out.assign(low=[iv.low for iv in ivs], high=[iv.high for iv in ivs], reason=[iv.reason for iv in ivs])


def win_rate_table(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None,
                   groups: tuple[str, ...] = GROUP_CODES) -> pd.DataFrame:
    """Tidy win-rate matrix (row, col, wins, n, rate[, low, high, reason]); the CI resamples photos."""
    W = unit_win_counts(two_afc, groups)
    N = W + W.transpose(0, 2, 1)
    G = len(groups)
    rows, cols = np.meshgrid(groups, groups, indexing="ij")
    tidy = ratio_intervals(W.reshape(len(W), G * G), N.reshape(len(N), G * G), boot)
    return pd.concat([pd.DataFrame({"row": rows.ravel(), "col": cols.ravel()}), tidy], axis=1)


def race_win_rates_within_gender(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None) -> pd.DataFrame:
    """Rows (gender, race): wins, n, rate over comparisons of two different races of that gender
    [, low, high, reason: the cluster-bootstrap CI over source photos]."""
    W = unit_win_counts(two_afc)
    N = W + W.transpose(0, 2, 1)
    race = np.array([CODE_TO_GROUP[c][0] for c in GROUP_CODES])
    gender = np.array([CODE_TO_GROUP[c][1] for c in GROUP_CODES])
    rivals = (gender[:, None] == gender[None, :]) & (race[:, None] != race[None, :])
    order = [GROUP_CODES.index(f"{r}{g}") for g in ("M", "F") for r in ("A", "B", "L", "ME", "W")]
    wins, n = (W * rivals).sum(axis=2)[:, order], (N * rivals).sum(axis=2)[:, order]
    keys = pd.DataFrame({"gender": [gender[i] for i in order], "race": [race[i] for i in order]})
    return pd.concat([keys, ratio_intervals(wins, n, boot)], axis=1)


def share_first_interval(two_afc: pd.DataFrame, boot: dict[str, Any]) -> dict[str, Any]:
    """P(answer 'A') with its cluster-bootstrap CI over source photos."""
    first = (two_afc["choice"].to_numpy() == "A").astype(float)
    units = pd.factorize(two_afc["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    a, n = np.bincount(units, first, U)[:, None], np.bincount(units, minlength=U).astype(float)[:, None]
    r = ratio_intervals(a, n, boot).iloc[0]
    return {"share_first": r["rate"], "low": r["low"], "high": r["high"], "reason": r["reason"]}


def degenerate_2afc(two_afc: pd.DataFrame) -> str:
    """Why this task's win rates are fixed by the design rather than measured ('' when they are not)."""
    choices = two_afc["choice"].dropna().unique()
    if len(two_afc) and len(choices) == 1:
        return (f"degenerate: every retained answer is '{choices[0]}' (win rates follow from the order of the "
                "images, 0.50 with both orders asked, not from the groups)")
    return ""


def degenerate_values(df: pd.DataFrame) -> str:
    values = df["y"].dropna().unique()
    if len(df) and len(values) == 1:
        return f"degenerate: every retained answer has the value {values[0]:g}, so no gap or test can be computed"
    return ""


def retention_table(responses: pd.DataFrame) -> pd.DataFrame:
    """Per kind × task: questions asked, retained (ok), refused, failed, and the most common reason."""
    rows = []
    for (kind, task), sub in responses.groupby(["kind", "task"], sort=True):
        bad = sub[sub["status"] != OK]
        reasons = bad["reason"] if "reason" in bad else pd.Series("", index=bad.index)
        top = reasons.fillna("").astype(str).str.slice(0, 80).value_counts()
        rows.append({"kind": kind, "task": task, "asked": len(sub), "retained": int((sub["status"] == OK).sum()),
                     "refused": int((sub["status"] == "refused").sum()), "failed": int((sub["status"] == "failed").sum()),
                     "retained_share": float((sub["status"] == OK).mean()),
                     "top_reason": f"{top.index[0]} ({int(top.iloc[0])})" if len(top) else ""})
    return pd.DataFrame(rows, columns=["kind", "task", "asked", "retained", "refused", "failed", "retained_share",
                                       "top_reason"])


def position_bias(two_afc: pd.DataFrame) -> dict[str, Any]:
    """share_first and position_bias_rate (see the module docstring), with their counts."""
    n = len(two_afc)
    out: dict[str, Any] = {"n": n, "share_first": float((two_afc["choice"] == "A").mean()) if n else None}
    if not n:
        return out | {"pairs_both_orders": 0, "position_bias_rate": None}
    key = two_afc.assign(lo=np.minimum(two_afc["group_a"], two_afc["group_b"]),
                         hi=np.maximum(two_afc["group_a"], two_afc["group_b"]))
    key["order"] = np.where(key["group_a"] == key["lo"], "lo_first", "hi_first")
    cols = ["unit", "task", "lo", "hi"]
    # the first retained answer in each order; a pair is "both orders" only when it has one of each
    firsts = key.drop_duplicates(cols + ["order"]).pivot(index=cols, columns="order", values="choice")
    both = firsts.dropna(subset=[c for c in ("lo_first", "hi_first")]) if {"lo_first", "hi_first"} <= set(
        firsts.columns) else firsts.iloc[:0]
    same_position = int((both["lo_first"] == both["hi_first"]).sum()) if len(both) else 0
    out["pairs_both_orders"] = int(len(both))
    out["position_bias_rate"] = same_position / len(both) if len(both) else None
    return out


def bradley_terry(two_afc: pd.DataFrame, reference: str = "WF", confidence: float = 0.95,
                  groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame | None, str]:
    """Bradley–Terry log-strengths with a position effect; errors clustered by source photo.

    Returns (table with term, strength, se, ci_low, ci_high, p, n, n_clusters) or (None, reason)."""
    import statsmodels.api as sm

    if len(two_afc) < len(groups):
        return None, f"too few retained comparisons ({len(two_afc)})"
    present = sorted(set(two_afc["group_a"]) | set(two_afc["group_b"]), key=list(groups).index)
    if reference not in present:
        return None, f"reference group {reference} not among the compared groups"
    others = [g for g in present if g != reference]
    a = two_afc["group_a"].to_numpy()
    b = two_afc["group_b"].to_numpy()
    X = np.zeros((len(two_afc), len(others) + 1))
    X[:, 0] = 1.0  # position effect (log-odds of choosing the image shown first)
    for j, g in enumerate(others, start=1):
        X[:, j] = (a == g).astype(float) - (b == g).astype(float)
    y = (two_afc["choice"].to_numpy() == "A").astype(float)
    if y.min() == y.max():
        return None, f"every retained answer is '{'A' if y[0] else 'B'}': strengths are not identifiable"
    clusters = pd.factorize(two_afc["unit"])[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = sm.Logit(y, X).fit(disp=0, maxiter=200, cov_type="cluster", cov_kwds={"groups": clusters})
    except Exception as exc:  # perfect separation, singular design
        return None, f"Bradley–Terry fit failed: {type(exc).__name__}: {exc}"
    if not np.all(np.isfinite(fit.params)) or not fit.mle_retvals.get("converged", False):
        return None, "Bradley–Terry fit did not converge (probably separation: some group always wins)"
    from scipy import stats as st

    G = int(clusters.max() + 1)
    # t(G − 1) instead of statsmodels' normal reference: at 12 photos the normal interval covered 0.926
    # (benchmarks/calibration.py), as the OLS does with its CR1 errors
    df_t = max(G - 1, 1)
    half = st.t.ppf(0.5 + confidence / 2, df_t) * fit.bse
    with np.errstate(invalid="ignore", divide="ignore"):
        p = 2 * st.t.sf(np.abs(fit.params / fit.bse), df_t)
    names = ["position_first"] + others
    table = pd.DataFrame({"term": names, "strength": fit.params, "se": fit.bse, "ci_low": fit.params - half,
                          "ci_high": fit.params + half, "p": p})
    ref_row = pd.DataFrame([{"term": reference, "strength": 0.0, "se": 0.0, "ci_low": 0.0, "ci_high": 0.0,
                             "p": np.nan}])
    table = pd.concat([table, ref_row], ignore_index=True)
    table["n"] = len(two_afc)
    table["n_clusters"] = int(clusters.max() + 1)
    return table, ""


def bt_tests(bt: pd.DataFrame, min_clusters: int, method: str) -> pd.DataFrame:
    """The strengths' p-values adjusted over the table (Holm/BH; the position effect apart), and blanked
    with a reason below `min_clusters` photos, where the cluster-robust logit does not hold its level."""
    from biasaudit.stats.resample import p_adjust

    bt = bt.copy()
    bt["reason"] = ""
    strengths = bt["term"] != "position_first"
    if int(bt["n_clusters"].iloc[0]) < min_clusters:
        bt.loc[bt["p"].notna(), "reason"] = (f"underpowered: {int(bt['n_clusters'].iloc[0])} source photos < "
                                            f"min_clusters {min_clusters}")
        bt["p"] = np.nan
    bt["p_adjusted"] = np.nan
    bt.loc[strengths, "p_adjusted"] = p_adjust(bt.loc[strengths, "p"].to_numpy(float), method)
    bt.loc[~strengths, "p_adjusted"] = bt.loc[~strengths, "p"]
    return bt.assign(p_adjust_method=method)


# ------------------------------------------------------------------------------ single-image tasks

def with_values(df: pd.DataFrame, mapping: dict[str, float] | None) -> pd.DataFrame:
    """Add a numeric `y`: the bracket value of the chosen letter (MCQ) or the salary (value_usd)."""
    out = df.copy()
    out["y"] = out["choice"].map(mapping).astype(float) if mapping is not None else out["value_usd"].astype(float)
    return out[np.isfinite(out["y"])]


def mean_gaps(df: pd.DataFrame, dimension: str, reference: str, by: list[str] | None = None) -> pd.DataFrame:
    """Mean-based percentage gap of each level of `dimension` ('race'|'gender') vs `reference`.

    Columns: *by, dimension, level, n, mean, ref_mean, delta_pct."""
    by = by or []
    levels = RACES if dimension == "race" else GENDERS
    keys = by or ["_all"]
    stats = df.assign(_all=0).groupby(keys + [dimension])["y"].agg(["size", "mean"]).reset_index()
    stats = stats.rename(columns={dimension: "level", "size": "n"})
    ref = stats[stats["level"] == reference][keys + ["mean"]].rename(columns={"mean": "ref_mean"})
    out = stats.merge(ref, on=keys, how="left").drop(columns=["_all"], errors="ignore")
    out["delta_pct"] = 100.0 * (out["mean"] - out["ref_mean"]) / out["ref_mean"]
    out.insert(len(by), "dimension", dimension)
    out["level"] = pd.Categorical(out["level"], categories=list(levels))
    return out.sort_values(by + ["level"]).reset_index(drop=True).assign(level=lambda d: d["level"].astype(str))


def ols_cluster(df: pd.DataFrame, race_reference: str = "White", gender_reference: str = "woman",
                confidence: float = 0.95, n_wild: int = 999, wild_weights: str = "webb",
                seed: int = 0) -> tuple[pd.DataFrame | None, str]:
    """OLS of y on race and gender with source-photo fixed effects; errors clustered by source photo,
    t(G − 1) reference and a wild cluster bootstrap p-value (biasaudit.stats.regression.fe_ols_cluster)."""
    from biasaudit.stats.regression import fe_ols_cluster

    if df["unit"].nunique() < 2 or len(df) < 4:
        return None, f"too few observations for a clustered regression ({len(df)} rows, {df['unit'].nunique()} photos)"
    if df["race"].nunique() < 2 and df["gender"].nunique() < 2:
        return None, "no variation in race or gender"
    columns, names = [], []
    for dim, ref, levels in (("race", race_reference, RACES), ("gender", gender_reference, GENDERS)):
        present = set(df[dim])
        if len(present) < 2:
            continue
        for level in levels:
            if level != ref and level in present:
                columns.append((df[dim] == level).to_numpy(float))
                names.append(f"{dim}:{level}")
    table, reason = fe_ols_cluster(df["y"].to_numpy(float), np.column_stack(columns), df["unit"].to_numpy(), names,
                                   confidence, n_wild, wild_weights, seed)
    if table is None:
        return None, reason
    table["p"] = table["p_wild"].where(table["p_wild"].notna(), table["p_t"])
    return table, ""


def sign_flip(diffs: np.ndarray, n_permutations: int = 9999, seed: int = 0) -> tuple[float, float, str]:
    """Paired sign-flip permutation test over source photos (biasaudit.stats.resample.sign_flip_pvalue)."""
    from biasaudit.stats.resample import sign_flip_pvalue

    mean, p, reason = sign_flip_pvalue(diffs, n_permutations, seed)
    if reason.startswith("one unit"):
        reason = "one source photo: a sign flip of one difference cannot reject (p = 1)"
    elif reason == "no paired difference":
        reason = "no source photo with both groups"
    return mean, p, reason


def sign_flip_test(diffs: np.ndarray, n_permutations: int = 9999, seed: int = 0) -> tuple[float, float]:
    """(mean, p) of `sign_flip` (defined for one photo too: p = 1)."""
    return sign_flip(diffs, n_permutations, seed)[:2]


def paired_differences(df: pd.DataFrame, dimension: str, level: str, reference: str) -> pd.Series:
    """Per source photo: mean y of `level` − mean y of `reference` (photos lacking either are dropped)."""
    means = df.groupby(["unit", dimension])["y"].mean().unstack(dimension)
    if level not in means or reference not in means:
        return pd.Series(dtype=float)
    return (means[level] - means[reference]).dropna()


def sign_flip_table(df: pd.DataFrame, race_reference: str, gender_reference: str, n_permutations: int,
                    seed: int) -> pd.DataFrame:
    rows = []
    for dimension, levels, ref in (("race", RACES, race_reference), ("gender", GENDERS, gender_reference)):
        for level in levels:
            if level == ref:
                continue
            d = paired_differences(df, dimension, level, ref)
            mean, p, why = sign_flip(d.to_numpy(), n_permutations, seed)
            rows.append({"dimension": dimension, "level": level, "reference": ref, "n_photos": len(d),
                         "mean_diff": mean, "p": p, "reason": why})
    return pd.DataFrame(rows)


def matched_cells(df: pd.DataFrame, dimension: str, level: str, reference: str) -> pd.DataFrame:
    """Per (photo, other-dimension value) cell holding both `level` and `reference`: their mean y."""
    other = "gender" if dimension == "race" else "race"
    means = df[df[dimension].isin([level, reference])].groupby(["unit", other, dimension])["y"].mean()
    cells = means.unstack(dimension)
    if level not in cells or reference not in cells:
        return pd.DataFrame(columns=["unit", "level_mean", "ref_mean"])
    cells = cells[[level, reference]].dropna().rename(columns={level: "level_mean", reference: "ref_mean"})
    return cells.reset_index()[["unit", "level_mean", "ref_mean"]]


def delta_g_within(df: pd.DataFrame, dimension: str, level: str, reference: str, *, n_boot: int = 2000,
                   confidence: float = 0.95, method: str = "percentile", n_permutations: int = 9999,
                   seed: int = 0) -> dict[str, Any]:
    """Δg within source photo (matched cells, see the module docstring) with its bootstrap CI over
    photos and a sign-flip p-value of the per-photo mean difference."""
    from biasaudit.stats.resample import cluster_bootstrap

    cells = matched_cells(df, dimension, level, reference)
    per = cells.assign(d=cells["level_mean"] - cells["ref_mean"]).groupby("unit").agg(
        d=("d", "sum"), ref=("ref_mean", "sum"), cells=("d", "size"))
    row = {"dimension": dimension, "level": level, "reference": reference, "n_photos": len(per),
           "n_cells": int(per["cells"].sum()) if len(per) else 0}
    if per.empty:
        return row | {"delta_pct": np.nan, "low": np.nan, "high": np.nan, "p_value": np.nan,
                      "reason": f"no source photo with both {level} and {reference} in a matched cell"}

    def stat(s: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return 100.0 * s[..., 0] / s[..., 1]

    iv = cluster_bootstrap(per[["d", "ref"]].to_numpy(float), stat, n_boot=n_boot, level=confidence, seed=seed,
                           method=method)[0]
    _, p, why = sign_flip((per["d"] / per["cells"]).to_numpy(), n_permutations, seed)
    if not (np.isfinite(iv.low) and np.isfinite(iv.high)):  # no interval (e.g. zero width): no p either
        p, why = np.nan, why or "no interval, so no p"
    return row | {"delta_pct": iv.estimate, "low": iv.low, "high": iv.high, "p_value": p,
                  "reason": "; ".join(r for r in (iv.reason, why) if r)}


def delta_g_table(df: pd.DataFrame, params: Any, measure: str) -> pd.DataFrame:
    rows = []
    for dimension, levels, ref in (("race", RACES, params.race_reference), ("gender", GENDERS, params.gender_reference)):
        for level in levels:
            if level != ref:
                rows.append(delta_g_within(df, dimension, level, ref, n_boot=getattr(params, "n_boot", 2000),
                                           confidence=params.confidence,
                                           method=getattr(params, "bootstrap_method", "percentile"),
                                           n_permutations=params.n_permutations, seed=params.seed))
    return pd.DataFrame(rows).assign(measure=measure, estimator="within source photo (matched cells)")


def significant_effects(delta_g: pd.DataFrame | None, ols: pd.DataFrame | None, alpha: float) -> pd.DataFrame:
    """Effects whose adjusted p-value is below alpha: Δg (within photo) and OLS coefficients."""
    cols = ["source", "measure", "effect", "estimate", "low", "high", "p_value", "p_adjusted", "p_adjust_method"]
    parts = []
    if delta_g is not None and len(delta_g):
        d = delta_g[delta_g["p_adjusted"] < alpha]
        parts.append(pd.DataFrame({"source": "delta_g (%)", "measure": d["measure"],
                                   "effect": d["dimension"] + ":" + d["level"], "estimate": d["delta_pct"],
                                   "low": d["low"], "high": d["high"], "p_value": d["p_value"],
                                   "p_adjusted": d["p_adjusted"], "p_adjust_method": d["p_adjust_method"]}))
    if ols is not None and len(ols):
        o = ols[ols["p_adjusted"] < alpha]
        parts.append(pd.DataFrame({"source": "ols coefficient", "measure": o["measure"], "effect": o["term"],
                                   "estimate": o["coef"], "low": o["ci_low"], "high": o["ci_high"],
                                   "p_value": o["p"], "p_adjusted": o["p_adjusted"],
                                   "p_adjust_method": o["p_adjust_method"]}))
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


# ------------------------------------------------------------------------------------- one VLM

def underpowered(tables: dict[str, pd.DataFrame], min_clusters: int, alpha: float) -> None:
    """Blank the p-values that cannot hold their level, with the reason (in place):
    OLS rows with fewer than `min_clusters` photos (the t(G − 1) and wild tests, benchmarks/calibration.py),
    sign-flip rows whose smallest attainable p, 2^(1 − n), is not below alpha."""
    def label(df: pd.DataFrame, bad: pd.Series, columns: list[str], why: pd.Series) -> pd.DataFrame:
        df = df.copy()
        df.loc[bad, columns] = np.nan
        old = df["reason"].fillna("") if "reason" in df else pd.Series("", index=df.index)
        df["reason"] = np.where(bad, why + np.where(old.eq(""), "", "; " + old), old)
        return df

    if "ols" in tables:
        t = tables["ols"]
        tables["ols"] = label(t, t["n_clusters"] < min_clusters, ["p_t", "p_wild", "p"],
                              "underpowered: " + t["n_clusters"].astype(str) + f" source photos < min_clusters {min_clusters}")
    for name, photos, p in (("sign_flip", "n_photos", "p"), ("delta_g", "n_photos", "p_value")):
        if name in tables:
            t = tables[name]
            bad = (2.0 ** (1 - t[photos].astype(float)) >= alpha) & (t[photos] > 0)
            tables[name] = label(t, bad, [p], "underpowered: with " + t[photos].astype(str) +
                                 f" photos the sign-flip test cannot reach p < {alpha:g}")


def analyse(responses: pd.DataFrame, params: Any) -> dict[str, Any]:
    """Every table of one VLM's answers. `params` is the ReflectAnalysis section."""
    res: dict[str, Any] = {"tables": {}, "notes": [], "degenerate": {}}
    boot = _boot(params)
    res["n_questions"] = int(len(responses))
    res["status_counts"] = {f"{k}/{s}": int(n) for (k, s), n in responses.groupby(["kind", "status"]).size().items()}
    res["retained"] = {k: int(n) for k, n in responses[responses["status"] == OK].groupby("kind").size().items()}
    res["tables"]["retention"] = retention_table(responses)
    for r in res["tables"]["retention"].itertuples():
        if r.retained_share < 0.5:
            res["notes"].append(f"{r.kind} {r.task}: only {r.retained} of {r.asked} answers retained "
                                f"(most common reason: {r.top_reason})")
    two = responses[(responses["kind"] == "2afc") & (responses["status"] == OK)]
    res["position_bias"] = {}
    res["race_win_rates"], res["bradley_terry"] = {}, {}
    for task in sorted(two["task"].unique()):
        sub = two[two["task"] == task]
        res["position_bias"][task] = position_bias(sub) | {
            f"share_first_{k}": v for k, v in share_first_interval(sub, boot).items() if k != "share_first"}
        why = degenerate_2afc(sub)
        if why:
            res["degenerate"][f"2afc_{task}"] = why
            res["notes"].append(f"2AFC {task}: {why}")
        res["tables"][f"winrate_{task}"] = win_rate_table(sub, boot)
        res.setdefault("matrices", {})[task] = win_rate_matrix(sub)[0]
        rw = race_win_rates_within_gender(sub, boot).assign(degenerate=why)
        res["tables"][f"race_winrate_{task}"] = rw
        res["race_win_rates"][task] = {g: dict(zip(s["race"], s["rate"])) for g, s in rw.groupby("gender")}
        bt, reason = bradley_terry(sub, params.bt_reference, params.confidence)
        if bt is not None:
            bt = bt_tests(bt, getattr(params, "min_clusters", 12), getattr(params, "p_adjust", "holm"))
        if bt is None:
            res["bradley_terry"][task] = reason
        else:
            res["tables"][f"bradley_terry_{task}"] = bt
            res["bradley_terry"][task] = bt.to_dict("records")
    gaps, ols, flips, deltas = [], [], [], []
    singles = {("mcq", "salary"): params.salary_brackets, ("mcq", "education"): params.education_levels,
               ("salary", "salary"): None}
    for (kind, task), mapping in singles.items():
        sub = retained(responses, kind, task)
        if sub.empty:
            continue
        sub = with_values(sub, mapping)
        label = f"{kind}_{task}"
        why = degenerate_values(sub)
        if why:
            res["degenerate"][label] = why
            res["notes"].append(f"{label}: {why}")
        for dim, ref in (("race", params.race_reference), ("gender", params.gender_reference)):
            g = mean_gaps(sub, dim, ref).assign(measure=label)
            gaps.append(g)
            if kind == "salary":
                by_occ = mean_gaps(sub, dim, ref, by=["occupation"]).assign(measure=label)
                res["tables"].setdefault("salary_gaps_by_occupation", [])
                res["tables"]["salary_gaps_by_occupation"].append(by_occ)
        deltas.append(delta_g_table(sub, params, label))
        table, reason = ols_cluster(sub, params.race_reference, params.gender_reference, params.confidence,
                                    getattr(params, "wild_bootstrap", 999), getattr(params, "wild_weights", "webb"),
                                    params.seed)
        if table is None:
            res["notes"].append(f"OLS {label}: {reason}")
        else:
            ols.append(table.assign(measure=label))
        flips.append(sign_flip_table(sub, params.race_reference, params.gender_reference, params.n_permutations,
                                     params.seed).assign(measure=label))
    if "salary_gaps_by_occupation" in res["tables"]:
        res["tables"]["salary_gaps_by_occupation"] = pd.concat(res["tables"]["salary_gaps_by_occupation"],
                                                               ignore_index=True)
    for name, parts in (("mean_gaps", gaps), ("ols", ols), ("sign_flip", flips), ("delta_g", deltas)):
        if parts:
            res["tables"][name] = pd.concat(parts, ignore_index=True)
    underpowered(res["tables"], getattr(params, "min_clusters", 12), 1 - params.confidence)
    method = getattr(params, "p_adjust", "holm")
    from biasaudit.stats.resample import p_adjust

    for name, col in (("delta_g", "p_value"), ("ols", "p"), ("sign_flip", "p")):
        if name in res["tables"]:
            t = res["tables"][name]
            res["tables"][name] = t.assign(p_adjusted=p_adjust(t[col].to_numpy(float), method), p_adjust_method=method)
    res["tables"]["significant_effects"] = significant_effects(res["tables"].get("delta_g"), res["tables"].get("ols"),
                                                               1 - params.confidence)
    return res


# ------------------------------------------------------------------------------------- figures

def heatmap_figure(rate: pd.DataFrame, n: pd.DataFrame, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    annot = rate.map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    sns.heatmap(rate.astype(float), vmin=0, vmax=1, cmap="RdBu_r", center=0.5, annot=annot, fmt="", ax=ax,
                cbar_kws={"label": "win rate (row chosen over column)"}, annot_kws={"fontsize": 7},
                linewidths=0.3, linecolor="white", mask=n.to_numpy() == 0)
    ax.set_xlabel("column group")
    ax.set_ylabel("row group")
    ax.set_title(title, fontsize=10)
    return fig


def bar_figure(df: pd.DataFrame, x: str, y: str, hue: str | None, title: str, ylabel: str, ref_line: float | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    values = pd.to_numeric(df[y], errors="coerce") if y in df else pd.Series(dtype=float)
    if df.empty or values.isna().all():
        ax.text(0.5, 0.5, "no data: no retained answers", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    else:
        sns.barplot(data=df, x=x, y=y, hue=hue, ax=ax, errorbar=None)
        # long group names ran together ("LatinoMiddleEasternWhite"): break CamelCase onto two lines
        labels = [re.sub(r"(?<=[a-z])(?=[A-Z])", "\n", t.get_text()) for t in ax.get_xticklabels()]
        ax.set_xticks(ax.get_xticks(), labels, fontsize=9)
        if (values.dropna() == values.dropna().iloc[0]).all():
            ax.text(0.5, 0.9, f"every value is {values.dropna().iloc[0]:g}: no difference between groups",
                    ha="center", va="top", transform=ax.transAxes, fontsize=9,
                    bbox={"facecolor": "white", "edgecolor": "#999"})
    if ref_line is not None:
        ax.axhline(ref_line, color="k", lw=0.8, ls="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return fig


def results_for_vlm(vlm: str, res: dict[str, Any], meta: dict[str, Any], stand_in: bool) -> list[Any]:
    """Sections (biasaudit.outputs.Result) of one VLM: 2AFC, MCQ, salary, significance."""
    from biasaudit.outputs import Figure, Result

    tag = " [PLANTED: SIMULATED answers]" if registry.trait("vlm", meta.get("backend", ""), "planted", False) else " [STAND-IN]" if stand_in else ""
    out = []
    two = Result(f"{vlm}_2afc", f"{vlm}: 2AFC win rates{tag}")
    two.metrics = {"position_bias": res["position_bias"], "race_win_rates": res["race_win_rates"],
                   "bradley_terry": {t: (v if isinstance(v, str) else "table") for t, v in res["bradley_terry"].items()}}
    for task, rate in res.get("matrices", {}).items():
        tidy = res["tables"][f"winrate_{task}"]
        n = tidy.pivot(index="row", columns="col", values="n").reindex(index=rate.index, columns=rate.columns)
        two.tables[f"{vlm}_winrate_{task}"] = tidy.assign(vlm=vlm)
        two.tables[C.RACE_WINRATE.of(vlm, task)] = res["tables"][f"race_winrate_{task}"].assign(vlm=vlm)
        if f"bradley_terry_{task}" in res["tables"]:
            two.tables[f"{vlm}_bradley_terry_{task}"] = res["tables"][f"bradley_terry_{task}"].assign(vlm=vlm)
        two.figures[f"{vlm}_winrate_{task}"] = Figure(
            heatmap_figure(rate, n, f"{vlm} · 2AFC {task}{tag}"), f"2AFC {task}: win-rate matrix",
            "Cell = share of retained comparisons in which the row group was chosen over the column group "
            f"(both orders pooled; n = {int(tidy['wins'].sum())} retained comparisons).")
        rw = res["tables"][f"race_winrate_{task}"]
        two.figures[f"{vlm}_race_winrate_{task}"] = Figure(
            bar_figure(rw, "race", "rate", "gender", f"{vlm} · race win rates within gender · {task}{tag}",
                       "win rate", 0.5), f"2AFC {task}: race win rates within gender",
            "Wins of each race over the other races of the same gender / comparisons involving it.")
    if not res.get("matrices"):
        two.status, two.reason = "no data", "no retained 2AFC answers"
    out.append(two)
    gaps = res["tables"].get("mean_gaps")
    within = res["tables"].get("delta_g")
    mcq = Result(f"{vlm}_mcq", f"{vlm}: MCQ and salary gaps Δg{tag}")
    if gaps is not None:
        if within is not None:
            mcq.tables[C.DELTA_G.of(vlm)] = within.assign(vlm=vlm)
        mcq.tables[f"{vlm}_mean_gaps"] = gaps.assign(vlm=vlm, estimator="pooled means (paper)")
        headline = within if within is not None else gaps
        for measure, sub in headline.groupby("measure"):
            mcq.figures[f"{vlm}_gaps_{measure}"] = Figure(
                bar_figure(sub, "level", "delta_pct", "dimension", f"{vlm} · {measure} · Δg vs reference{tag}", "Δg (%)", 0.0),
                f"{measure}: percentage gaps within source photo",
                "Δg = 100·Σ(mean of group − mean of reference)/Σ mean of reference over cells (photo × other "
                "dimension) holding both; reference White (race), woman (gender). CIs and adjusted p in the table.")
        mcq.metrics = {"delta_g": {m: {f"{r.dimension}:{r.level}": {
            "delta_pct": r.delta_pct, "low": r.low, "high": r.high, "p": r.p_value, "p_adjusted": r.p_adjusted}
            for r in sub.itertuples()} for m, sub in within.groupby("measure")}} if within is not None else {}
        mcq.metrics["delta_g_pooled"] = {m: dict(zip(s["dimension"] + ":" + s["level"], s["delta_pct"]))
                                         for m, s in gaps.groupby("measure")}
    else:
        mcq.status, mcq.reason = "no data", "no retained MCQ or salary answers"
    by_occ = res["tables"].get("salary_gaps_by_occupation")
    if by_occ is not None:
        mcq.tables[f"{vlm}_salary_gaps_by_occupation"] = by_occ.assign(vlm=vlm)
        race = by_occ[by_occ["dimension"] == "race"]
        mcq.figures[f"{vlm}_salary_gaps_by_occupation"] = Figure(
            bar_figure(race, "occupation", "delta_pct", "level", f"{vlm} · salary gap vs White by occupation{tag}",
                       "mean salary gap (%)", 0.0), "Salary recommendation: gaps by occupation",
            "Mean recommended salary of each race vs White, per occupation (gender gaps in the table).")
    out.append(mcq)
    sig = Result(f"{vlm}_significance", f"{vlm}: significance (cluster-robust OLS, sign-flip tests){tag}")
    for name in ("retention", "ols", "sign_flip", "significant_effects"):
        if name in res["tables"]:
            sig.tables[f"{vlm}_{name}"] = res["tables"][name].assign(vlm=vlm)
    sig.notes = list(res["notes"])
    if not sig.tables:
        sig.status, sig.reason = "no data", "no retained single-image answers"
    out.append(sig)
    return out
