"""Section `significance`: retention per kind × task, OLS of each single-image measure on race and gender
with source-photo fixed effects (cluster-robust and wild-bootstrap p), paired sign-flip tests, and the
effects significant after adjustment (Δg of the `gaps` section and OLS terms; exploratory), and the declared
primary endpoints with their Holm adjustment (endpoints.py; parameter `primary_endpoints`). Definitions: the package
docstring. Parameters: `wild_bootstrap`, `wild_weights`, the references (gaps.references) and the shared
resampling and testing settings (inputs.Boot)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.params.vlm import GENDERS, RACES
from biasaudit.pipeline.outputs import Result
from biasaudit.vlm.analysis import caveats, endpoints, gaps
from biasaudit.vlm.analysis.inference import adjusted, sign_flip, underpowered_clusters, underpowered_sign_flip
from biasaudit.vlm.analysis.inputs import Answers, Boot, degenerate, measures, retention_table


def ols_by_group(df: pd.DataFrame, race_reference: str, gender_reference: str, confidence: float, n_wild: int,
                 wild_weights: str, seed: int) -> tuple[pd.DataFrame | None, str]:
    """OLS of y on race and gender dummies (vs the references) with source-photo fixed effects; errors
    clustered by source photo, t(G − 1) reference and a wild cluster bootstrap p-value
    (biasaudit.stats.regression.fe_ols_cluster); `p` is the wild p-value when computed."""
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


def unit_means(df: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Mean y per source photo (rows) and level of `dimension` (columns; NaN where the photo has none)."""
    return df.groupby(["unit", dimension])["y"].mean().unstack(dimension)


def level_differences(means: pd.DataFrame, level: str, reference: str) -> pd.Series:
    """Per source photo of `unit_means`: mean y of `level` − mean y of `reference` (photos lacking either dropped)."""
    if level not in means or reference not in means:
        return pd.Series(dtype=float)
    return (means[level] - means[reference]).dropna()


def paired_differences(df: pd.DataFrame, dimension: str, level: str, reference: str) -> pd.Series:
    """Per source photo: mean y of `level` − mean y of `reference` (photos lacking either are dropped)."""
    return level_differences(unit_means(df, dimension), level, reference)


def sign_flip_table(df: pd.DataFrame, race_reference: str, gender_reference: str, n_permutations: int,
                    seed: int) -> pd.DataFrame:
    rows = []
    for dimension, levels, ref in (("race", RACES, race_reference), ("gender", GENDERS, gender_reference)):
        means = unit_means(df, dimension)  # once for every level
        for level in levels:
            if level == ref:
                continue
            d = level_differences(means, level, ref)
            mean, p, why = sign_flip(d.to_numpy(), n_permutations, seed)
            rows.append({"dimension": dimension, "level": level, "reference": ref, "n_photos": len(d),
                         "mean_diff": mean, "p": p, "reason": why})
    return pd.DataFrame(rows)


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


def with_caveats(effects: pd.DataFrame, answers: Answers, cfg: Any) -> pd.DataFrame:
    """Each significant effect with the caveats of its measure and level (vlm.analysis.caveats): a Δg row with
    its interval against the null-edit floor; an OLS term (another scale) with the same measure's refusal gap,
    Δg refusal bounds and placebo verdict, and no floor reading."""
    rows = []
    for r in effects.itertuples():
        dimension, _, level = str(r.effect).partition(":")
        delta = r.source.startswith("delta_g")
        rows.append(caveats.of_delta_g(answers, cfg, r.measure, dimension, level, r.low if delta else np.nan,
                                       r.high if delta else np.nan))
    return pd.concat([effects.reset_index(drop=True), pd.DataFrame(rows, columns=caveats.COLUMNS)], axis=1)


def _estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    a, boot = cfg.reflect_analysis, Boot.of(cfg)
    (_, _, race_ref), (_, _, gender_ref) = gaps.references(cfg)
    ols, flips, reasons = [], [], {}
    for label, sub in measures(answers, cfg).items():
        table, reasons[label] = ols_by_group(sub, race_ref, gender_ref, boot.level, a.wild_bootstrap, a.wild_weights,
                                             boot.seed)
        if table is not None:  # each term against the reference level of its dimension
            dims = table["term"].str.split(":").str[0]
            ols.append(table.assign(measure=label, reference=dims.map({"race": race_ref, "gender": gender_ref})))
        flips.append(sign_flip_table(sub, race_ref, gender_ref, boot.n_permutations, boot.seed).assign(measure=label))
    out: dict[str, Any] = {"ols": None, "sign_flip": None, "ols_reasons": reasons}
    if ols:
        out["ols"] = adjusted(underpowered_clusters(pd.concat(ols, ignore_index=True), boot.min_clusters), "p",
                              boot.p_adjust)
    if flips:
        out["sign_flip"] = adjusted(underpowered_sign_flip(pd.concat(flips, ignore_index=True), "p", boot.alpha), "p",
                                    boot.p_adjust)
    return out


def estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    """ols and sign_flip (underpowered rows labelled, p adjusted; None without single-image answers) and
    ols_reasons (measure → why no OLS, '' when fitted); computed once per VLM."""
    return answers.shared("significance", cfg, lambda: _estimates(answers, cfg))


def retention(answers: Answers, cfg: Any) -> pd.DataFrame:
    """inputs.retention_table of the VLM's answers, computed once per VLM (the section and its notes read it)."""
    return answers.shared("retention", cfg, lambda: retention_table(answers.responses))


def notes(answers: Answers, cfg: Any) -> list[str]:
    """Low retention, degenerate answers and OLS fits that failed, in the order of the tasks."""
    out = [f"{r.kind} {r.task}: only {r.retained} of {r.asked} answers retained (most common reason: {r.top_reason})"
           for r in retention(answers, cfg).itertuples() if r.retained_share < 0.5]
    why = degenerate(answers, cfg)
    out += [f"2AFC {k.removeprefix('2afc_')}: {w}" for k, w in why.items() if k.startswith("2afc_")]
    for label, reason in estimates(answers, cfg)["ols_reasons"].items():
        out += [f"{label}: {why[label]}"] if label in why else []
        out += [f"OLS {label}: {reason}"] if reason else []
    return out


def compute(answers: Answers, cfg: Any) -> Result:
    vlm, e = answers.vlm, estimates(answers, cfg)
    res = Result(f"{vlm}_significance", f"{vlm}: significance (cluster-robust OLS, sign-flip tests){answers.tag}")
    res.tables[C.RETENTION.of(vlm)] = retention(answers, cfg).assign(vlm=vlm)
    primary = endpoints.primary_endpoints(answers, cfg)
    res.tables[C.PRIMARY_ENDPOINTS.of(vlm)] = primary.assign(vlm=vlm)
    for name, table in ((C.OLS.of(vlm), e["ols"]), (C.SIGN_FLIP.of(vlm), e["sign_flip"])):
        if table is not None:
            res.tables[name] = table.assign(vlm=vlm, family=endpoints.EXPLORATORY)
    effects = with_caveats(significant_effects(gaps.estimates(answers, cfg)["delta_g"], e["ols"], Boot.of(cfg).alpha),
                           answers, cfg)
    res.tables[f"{vlm}_significant_effects"] = effects.assign(vlm=vlm, family=endpoints.EXPLORATORY)
    res.tables[C.CAVEATS.of(vlm)] = caveats.table(answers, cfg).assign(vlm=vlm)
    res.notes = [endpoints.error_rate_note(primary, Boot.of(cfg).alpha)] + notes(answers, cfg)
    return res
