"""Section `gaps` (the `<vlm>_mcq` section): percentage gaps Δg of the single-image answers (MCQ salary and
education, salary recommendation) vs the reference groups: within source photo (headline, with CI and
adjusted p) and pooled (the paper's), and the salary gaps by occupation (definitions: the package
docstring). Parameters: `race_reference`, `gender_reference`, the answer scales (inputs.measures) and the
shared resampling and testing settings (inputs.Boot)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.params.vlm import GENDERS, RACES
from biasaudit.pipeline.outputs import NO_DATA, Figure, Result
from biasaudit.vlm.analysis.inference import adjusted, sign_flip, underpowered_intervals, underpowered_sign_flip
from biasaudit.vlm.analysis.inputs import Answers, Boot, measures
from biasaudit.vlm.figures import bar_figure


def references(cfg: Any) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """(dimension, its levels, its reference level) for race and gender."""
    a = cfg.reflect_analysis
    return ("race", RACES, a.race_reference), ("gender", GENDERS, a.gender_reference)


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


def cell_means(df: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Mean y per cell (photo, value of the other dimension): a row per cell, a column per level of `dimension`
    (NaN where the cell has none)."""
    other = "gender" if dimension == "race" else "race"
    return df.groupby(["unit", other, dimension])["y"].mean().unstack(dimension)


def pair_cells(means: pd.DataFrame, level: str, reference: str) -> pd.DataFrame:
    """The cells of `cell_means` holding both `level` and `reference`: unit, level_mean, ref_mean."""
    if level not in means or reference not in means:
        return pd.DataFrame(columns=["unit", "level_mean", "ref_mean"])
    cells = means[[level, reference]].dropna().rename(columns={level: "level_mean", reference: "ref_mean"})
    return cells.reset_index()[["unit", "level_mean", "ref_mean"]]


def matched_cells(df: pd.DataFrame, dimension: str, level: str, reference: str) -> pd.DataFrame:
    """Per (photo, other-dimension value) cell holding both `level` and `reference`: their mean y."""
    return pair_cells(cell_means(df[df[dimension].isin([level, reference])], dimension), level, reference)


def delta_g_within(df: pd.DataFrame, dimension: str, level: str, reference: str, boot: Boot) -> dict[str, Any]:
    """Δg within source photo (matched cells, see the package docstring) with its bootstrap CI over
    photos and a sign-flip p-value of the per-photo mean difference."""
    return delta_g_of_cells(matched_cells(df, dimension, level, reference), dimension, level, reference, boot)


def delta_g_of_cells(cells: pd.DataFrame, dimension: str, level: str, reference: str, boot: Boot) -> dict[str, Any]:
    """`delta_g_within` from the matched cells (pair_cells)."""
    from biasaudit.stats.resample import cluster_bootstrap

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

    iv = cluster_bootstrap(per[["d", "ref"]].to_numpy(float), stat, **boot.resampling)[0]
    _, p, why = sign_flip((per["d"] / per["cells"]).to_numpy(), boot.n_permutations, boot.seed)
    if not (np.isfinite(iv.low) and np.isfinite(iv.high)):  # no interval (e.g. zero width): no p either
        p, why = np.nan, why or "no interval, so no p"
    return row | {"delta_pct": iv.estimate, "low": iv.low, "high": iv.high, "p_value": p,
                  "reason": "; ".join(r for r in (iv.reason, why) if r)}


def delta_g_table(df: pd.DataFrame, measure: str, cfg: Any) -> pd.DataFrame:
    """Δg within photo of every level but the reference, race then gender."""
    boot = Boot.of(cfg)
    rows = []
    for dimension, levels, ref in references(cfg):
        means = cell_means(df, dimension)  # once for every level
        rows += [delta_g_of_cells(pair_cells(means, level, ref), dimension, level, ref, boot) for level in levels
                 if level != ref]
    return pd.DataFrame(rows).assign(measure=measure, estimator="within source photo (matched cells)")


def delta_g(frames: dict[str, pd.DataFrame], cfg: Any) -> pd.DataFrame | None:
    """Δg within photo of every measure of `frames` (inputs.measures), underpowered rows labelled, p adjusted
    over the table; None without measures."""
    if not frames:
        return None
    boot = Boot.of(cfg)
    table = pd.concat([delta_g_table(sub, label, cfg) for label, sub in frames.items()], ignore_index=True)
    table = underpowered_sign_flip(table, "p_value", boot.alpha)
    table = underpowered_intervals(table, table["n_photos"], boot.min_clusters)
    return adjusted(table, "p_value", boot.p_adjust)


def _estimates(answers: Answers, cfg: Any) -> dict[str, pd.DataFrame | None]:
    gaps, by_occ = [], []
    frames = measures(answers, cfg)
    for label, sub in frames.items():
        for dim, _, ref in references(cfg):
            gaps.append(mean_gaps(sub, dim, ref).assign(measure=label))
            if label.startswith("salary_"):  # a salary task: its gaps by occupation too
                by_occ.append(mean_gaps(sub, dim, ref, by=["occupation"]).assign(measure=label))
    return {"mean_gaps": pd.concat(gaps, ignore_index=True) if gaps else None, "delta_g": delta_g(frames, cfg),
            "salary_gaps_by_occupation": pd.concat(by_occ, ignore_index=True) if by_occ else None}


def estimates(answers: Answers, cfg: Any) -> dict[str, pd.DataFrame | None]:
    """mean_gaps (pooled), delta_g (within photo; underpowered rows labelled, p adjusted) and
    salary_gaps_by_occupation, each None without answers; computed once per VLM."""
    return answers.shared("gaps", cfg, lambda: _estimates(answers, cfg))


def delta_g_metrics(within: pd.DataFrame) -> dict[str, Any]:
    """Per measure and `dimension:level`: Δg within photo, its CI and p-values."""
    return {m: {f"{r.dimension}:{r.level}": {"delta_pct": r.delta_pct, "low": r.low, "high": r.high, "p": r.p_value,
                                             "p_adjusted": r.p_adjusted} for r in sub.itertuples()}
            for m, sub in within.groupby("measure")}


def _gap_figures(res: Result, vlm: str, headline: pd.DataFrame, tag: str) -> None:
    for measure, sub in headline.groupby("measure"):
        res.figures[f"{vlm}_gaps_{measure}"] = Figure(
            bar_figure(sub, "level", "delta_pct", "dimension", f"{vlm} · {measure} · Δg vs reference{tag}", "Δg (%)", 0.0),
            f"{measure}: percentage gaps within source photo",
            "Δg = 100·Σ(mean of group − mean of reference)/Σ mean of reference over cells (photo × other "
            "dimension) holding both; reference White (race), woman (gender). CIs and adjusted p in the table.")


def _occupation_figure(res: Result, vlm: str, by_occ: pd.DataFrame, tag: str) -> None:
    res.tables[f"{vlm}_salary_gaps_by_occupation"] = by_occ.assign(vlm=vlm)
    race = by_occ[by_occ["dimension"] == "race"]
    res.figures[f"{vlm}_salary_gaps_by_occupation"] = Figure(
        bar_figure(race, "occupation", "delta_pct", "level", f"{vlm} · salary gap vs White by occupation{tag}",
                   "mean salary gap (%)", 0.0), "Salary recommendation: gaps by occupation",
        "Mean recommended salary of each race vs White, per occupation (gender gaps in the table).")


def compute(answers: Answers, cfg: Any) -> Result:
    vlm, tag, e = answers.vlm, answers.tag, estimates(answers, cfg)
    res = Result(f"{vlm}_mcq", f"{vlm}: MCQ and salary gaps Δg{tag}")
    gaps, within = e["mean_gaps"], e["delta_g"]
    if gaps is not None:
        if within is not None:
            # p adjusted over this table only: exploratory (the primary family: significance section)
            res.tables[C.DELTA_G.of(vlm)] = within.assign(vlm=vlm, family="exploratory")
        res.tables[f"{vlm}_mean_gaps"] = gaps.assign(vlm=vlm, estimator="pooled means (paper)")
        _gap_figures(res, vlm, within if within is not None else gaps, tag)
        res.metrics = {"delta_g": delta_g_metrics(within)} if within is not None else {}
        res.metrics["delta_g_pooled"] = {m: dict(zip(s["dimension"] + ":" + s["level"], s["delta_pct"]))
                                         for m, s in gaps.groupby("measure")}
    else:
        res.status, res.reason = NO_DATA, "no retained MCQ or salary answers"
    if e["salary_gaps_by_occupation"] is not None:
        _occupation_figure(res, vlm, e["salary_gaps_by_occupation"], tag)
    return res
