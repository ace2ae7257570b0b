"""Section `gender`: apparent gender, a second dimension beside race (beyond the paper).

The classifier is asked each image's apparent gender too (`benchmarks.gender_set`, a group set of its own;
the labels table's `gender` column, classify.classify_gender). The benchmark is BLS CPS Table 11's share of women
for an occupational prompt (the prompts table's `pct_women`); geography and surname prompts have no sex
benchmark in the shipped tables, so parity is their only reference, and every row names which it used.

Per model × prompt: counts, shares, the benchmark and its source, TVD and the women's deviation. Per model ×
category (and 'all'): the mean TVD and mean deviation with cluster-bootstrap intervals over prompts, and the TVD
and deviation corrected for classifier error and finite n with the honest (bias-aware) interval of
stats.correction (`debiased_tvd`, `corrected_deviation`). The gender confusion matrix M comes from a SIMULATED
classifier's declared `sim_gender_confusion`; a real classifier's gender errors are not rated by the raters'
sheets, so its corrected columns are empty with the reason. Race × gender: no published table gives the joint
distribution per occupation, county or surname, so each model's race × gender distribution is compared with
parity only, and the table says so.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import known_truth as K
from biasaudit import registry
from biasaudit.contracts import UNKNOWN
from biasaudit.known_truth import confusion_array
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.correction import corrected_deviation, debiased_tvd, linear_draws
from biasaudit.stats.tvd import tvd
from biasaudit.t2i.analysis.inputs import Boot, Inputs
from biasaudit.t2i.analysis.representation import _by_category

BLS = "BLS CPS 2025 Table 11 (share of women)"
PARITY = "parity (no sex benchmark for this prompt)"
NO_JOINT = "parity only: no published race × gender benchmark per prompt (BLS Table 11 gives the share of women, " \
           "not by race; the Census tables shipped have no sex)"


def gender_benchmark(prompts: pd.DataFrame, genders: tuple[str, ...]) -> pd.DataFrame:
    """prompt_id, bench_<gender> and its source: BLS's share of women where the prompt has one, else parity."""
    women = prompts["pct_women"].astype(float) if "pct_women" in prompts else pd.Series(np.nan, index=prompts.index)
    has = women.notna() & ("woman" in genders) & (len(genders) == 2)
    out = pd.DataFrame({"prompt_id": prompts["prompt_id"].astype(str)})
    for g in genders:
        share = women if g == "woman" else 1.0 - women
        out[f"bench_{g}"] = np.where(has, share, 1.0 / len(genders))
    out["benchmark"] = np.where(has, BLS, PARITY)
    return out


def per_prompt_table(labels: pd.DataFrame, prompts: pd.DataFrame, genders: tuple[str, ...]) -> pd.DataFrame:
    """One row per model × prompt: n (images with a gender answer), n_unknown, n_/share_/bench_<gender>, the
    benchmark's source, TVD and deviation_<gender> (share − benchmark)."""
    if labels.empty or "gender" not in labels or prompts.empty:
        return pd.DataFrame()
    lab = labels[["model", "prompt_id", "gender"]].copy()
    lab["prompt_id"] = lab["prompt_id"].astype(str)
    lab["gender"] = lab["gender"].where(lab["gender"].isin(genders), UNKNOWN)
    counts = pd.crosstab([lab["model"], lab["prompt_id"]], lab["gender"]).reindex(
        columns=[*genders, UNKNOWN], fill_value=0)
    out = pd.DataFrame(index=counts.index)
    out["n"] = counts[list(genders)].sum(axis=1)
    out["n_unknown"] = counts[UNKNOWN]
    for g in genders:
        out[f"n_{g}"] = counts[g]
    for g in genders:
        out[f"share_{g}"] = counts[g] / out["n"].where(out["n"] > 0)
    out = out.reset_index()
    meta = prompts[["prompt_id", "category", "instance"]].assign(prompt_id=prompts["prompt_id"].astype(str))
    out = out.merge(meta, on="prompt_id", how="inner").merge(gender_benchmark(prompts, genders), on="prompt_id")
    p = out[[f"share_{g}" for g in genders]].to_numpy(float)
    q = out[[f"bench_{g}" for g in genders]].to_numpy(float)
    out["tvd"] = tvd(p, q)
    for g in genders:
        out[f"deviation_{g}"] = out[f"share_{g}"] - out[f"bench_{g}"]
    first = ["model", "category", "prompt_id", "instance", "benchmark", "n", "n_unknown", "tvd"]
    return out[first + [c for c in out.columns if c not in first]].sort_values(
        ["model", "category", "prompt_id"], ignore_index=True)


def gender_confusion(cfg: Any, genders: tuple[str, ...]) -> tuple[np.ndarray | None, str]:
    """(M, its source): the SIMULATED classifier's declared gender confusion, else None with the reason."""
    spec = cfg.classify.vlm
    if registry.trait("vlm", spec.backend, "answers_from_confusion", False):
        return confusion_array(spec.sim_gender_confusion, genders), "declared (SIMULATED classifier)"
    return None, ("no gender confusion matrix: the raters' sheets rate race only, so the classifier's gender errors "
                  "are not estimated and the TVD is not corrected for them")


def summary_table(pp: pd.DataFrame, boot: Boot, genders: tuple[str, ...], M: np.ndarray | None,
                  M_source: str) -> pd.DataFrame:
    """Per model × category (and 'all'): mean TVD and mean women's deviation (cluster bootstrap over prompts),
    and both corrected for classifier error and finite n with the honest interval (stats.correction)."""
    rows = []
    for model, cat, sub in _by_category(pp):
        sub = sub[sub["n"] > 0]
        if sub.empty:
            continue
        dev_g = genders[0] if "woman" not in genders else "woman"
        totals = np.column_stack([np.ones(len(sub)), sub["tvd"].to_numpy(float),
                                  sub[f"deviation_{dev_g}"].to_numpy(float)])
        mean, dev = boot.run(totals, lambda s: s[..., 1:] / s[..., :1], "gender", model, cat)
        row = {"model": model, "category": cat, "benchmark": "; ".join(sorted(sub["benchmark"].unique())),
               "n_prompts": len(sub), "n_images": int(sub["n"].sum()), "n_unknown": int(sub["n_unknown"].sum()),
               "mean_tvd": mean.estimate, "mean_tvd_low": mean.low, "mean_tvd_high": mean.high,
               "deviation_group": dev_g, "mean_deviation": dev.estimate, "mean_deviation_low": dev.low,
               "mean_deviation_high": dev.high, "M_source": M_source if M is not None else "",
               "tvd_corrected": np.nan, "tvd_corrected_low": np.nan, "tvd_corrected_high": np.nan,
               "mean_deviation_corrected": np.nan, "mean_deviation_corrected_low": np.nan,
               "mean_deviation_corrected_high": np.nan, "reason": "" if M is not None else M_source}
        if M is not None:
            counts = sub[[f"n_{g}" for g in genders]].to_numpy(float)
            bench = sub[[f"bench_{g}" for g in genders]].to_numpy(float)
            n_boot = min(boot.n_boot, 1000)
            # one bootstrap for both (stats.correction.linear_draws)
            linear = linear_draws(counts, bench, None, len(genders), n_boot,
                                  derive_seed(boot.seed, "gender-debiased", model, cat), M=M)
            iv, info = debiased_tvd(counts, bench, None, genders, n_boot=n_boot, level=boot.level, M=M, linear=linear)
            d = corrected_deviation(counts, bench, None, genders, n_boot=n_boot, level=boot.level, M=M,
                                    linear=linear)[genders.index(dev_g)]
            row.update({"tvd_corrected": iv.estimate, "tvd_corrected_low": iv.low, "tvd_corrected_high": iv.high,
                        "mean_deviation_corrected": d.estimate, "mean_deviation_corrected_low": d.low,
                        "mean_deviation_corrected_high": d.high, "reason": iv.reason or info.get("reason", "")})
        rows.append(row)
    return pd.DataFrame(rows)


def intersection_table(labels: pd.DataFrame, prompts: pd.DataFrame, groups: tuple[str, ...],
                       genders: tuple[str, ...], boot: Boot) -> pd.DataFrame:
    """Per model × category (and 'all'): the share of each race × gender cell among images with both labels,
    and the TVD of that distribution from parity (1 / cells) with a cluster-bootstrap interval over prompts.
    Parity is the only reference (NO_JOINT), said on every row."""
    if labels.empty or "gender" not in labels:
        return pd.DataFrame()
    lab = labels[labels["label"].isin(groups) & labels["gender"].isin(genders)].copy()
    lab["prompt_id"] = lab["prompt_id"].astype(str)
    lab = lab.merge(prompts[["prompt_id", "category"]].assign(prompt_id=prompts["prompt_id"].astype(str)),
                    on="prompt_id")
    cells = [f"{r}×{g}" for r in groups for g in genders]
    lab["cell"] = lab["label"] + "×" + lab["gender"]
    rows = []
    parity = np.full(len(cells), 1.0 / len(cells))
    frame = pd.concat([lab, lab.assign(category="all")], ignore_index=True)
    for (model, cat), sub in frame.groupby(["model", "category"], sort=True):
        counts = pd.crosstab(sub["prompt_id"], sub["cell"]).reindex(columns=cells, fill_value=0).to_numpy(float)
        iv = boot.run(counts, lambda s: tvd(s / s.sum(axis=-1, keepdims=True), parity), "gender-x-race", model,
                      cat)[0]
        total = counts.sum(axis=0)
        rows.append({"model": model, "category": cat, "reference": NO_JOINT, "n_images": int(total.sum()),
                     "tvd_from_parity": iv.estimate, "low": iv.low, "high": iv.high,
                     **{f"share_{c}": v for c, v in zip(cells, total / max(total.sum(), 1))}})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- PLANTED truth (the validation section)

def planted_gender(manifests: pd.DataFrame, genders: tuple[str, ...]) -> pd.DataFrame:
    """Per planted model × prompt: the planted gender shares p_<gender> (the manifest's extra)."""
    if manifests.empty or "planted_gender" not in manifests:
        return pd.DataFrame()
    m = manifests[manifests["planted_gender"].notna() & (manifests["status"] == "ok")]
    if m.empty:
        return pd.DataFrame()
    extra = m["extra"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    shares = np.array([e.get("planted_gender_shares", [np.nan] * len(genders)) for e in extra], dtype=float)
    out = m[["model", "prompt_id"]].astype(str).reset_index(drop=True)
    drawn = m["planted_gender"].astype(str).to_numpy()
    for j, g in enumerate(genders):
        out[f"p_{g}"] = shares[:, j]
        out[f"r_{g}"] = (drawn == g).astype(float)  # realised: the planted genders actually drawn
    return out.groupby(["model", "prompt_id"], as_index=False).agg(
        {**{f"p_{g}": "first" for g in genders}, **{f"r_{g}": "mean" for g in genders}})


def validation_rows(inputs: Inputs, cfg: Any, genders: tuple[str, ...]) -> list[dict]:
    """The planted gender distortion beside its estimates, per planted model × category: the corrected mean
    TVD and the corrected mean women's deviation (honest intervals, checked) and the raw mean TVD (shown)."""
    truth = planted_gender(inputs.manifests, genders)
    if truth.empty:
        return []
    boot = Boot.of(cfg)
    M, source = gender_confusion(cfg, genders)
    pp = per_prompt_table(inputs.labels, inputs.prompts, genders)
    if pp.empty:
        return []
    pp = pp.merge(truth, on=["model", "prompt_id"], how="inner")
    summary = summary_table(pp, boot, genders, M, source).set_index(["model", "category"])
    rows = []
    for model, cat, sub in _by_category(pp[pp["n"] > 0]):
        P = sub[[f"p_{g}" for g in genders]].to_numpy(float)
        Q = sub[[f"bench_{g}" for g in genders]].to_numpy(float)
        s = summary.loc[(model, cat)]
        dev_g = s["deviation_group"]
        planted_tvd, planted_dev = float(tvd(P, Q).mean()), float((P - Q)[:, genders.index(dev_g)].mean())
        R = sub[[f"r_{g}" for g in genders]].to_numpy(float)
        drawn = f"; the planted genders actually drawn: {float((R - Q)[:, genders.index(dev_g)].mean()):+.3f}"
        keys = {"model": model, "category_or_group": f"gender/{cat}"}
        rows.append(K.row("gender_debiased_mean_tvd", planted_tvd, s["tvd_corrected"], s["tvd_corrected_low"],
                          s["tvd_corrected_high"], 1.0, f"apparent gender vs {s['benchmark']}; classifier error "
                          f"(M {source or 'none'}) and finite n corrected, honest interval", **keys))
        rows.append(K.row(f"gender_mean_deviation_{dev_g}", planted_dev, s["mean_deviation_corrected"],
                          s["mean_deviation_corrected_low"], s["mean_deviation_corrected_high"], 1.0,
                          "the planted distortion: mean (planted share − benchmark share) over prompts, corrected "
                          f"for classifier error{drawn}", null=0.0, **keys))
        rows.append(K.row("gender_mean_tvd", planted_tvd, s["mean_tvd"], s["mean_tvd_low"], s["mean_tvd_high"], 1.0,
                          "raw classified genders (not a check): classifier error and finite n bias it", check=False,
                          **keys))
    return rows


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Tables gender_per_prompt, gender_summary, gender_by_race; metrics per model × category."""
    res = Result("gender", "Apparent gender: occupations against BLS Table 11's share of women (beyond the paper)")
    genders = cfg.genders
    if not genders:
        res.status, res.reason = NO_DATA, "gender is not asked (benchmarks.gender_set is empty)"
        return res
    if inputs.labels.empty or "gender" not in inputs.labels:
        res.status, res.reason = NO_DATA, inputs.notes.get("labels") or "the labels carry no gender column yet " \
            "(the classify stage asks apparent gender when benchmarks.gender_set is set)"
        return res
    boot = Boot.of(cfg)
    pp = per_prompt_table(inputs.labels, inputs.prompts, genders)
    if pp.empty:
        res.status, res.reason = NO_DATA, "no gender answer matches a prompt"
        return res
    M, source = gender_confusion(cfg, genders)
    summary = summary_table(pp, boot, genders, M, source)
    joint = intersection_table(inputs.labels, inputs.prompts, inputs.groups, genders, boot)
    res.tables = {C.GENDER_SUMMARY.name: summary, C.GENDER_PER_PROMPT.name: pp, C.GENDER_BY_RACE.name: joint}
    res.notes.append(f"benchmark: {BLS} for occupational prompts; {PARITY} for the others")
    res.notes.append(f"race × gender: {NO_JOINT}")
    if M is None:
        res.notes.append(source)
    res.metrics = {"gender_tvd": {f"{r.model}/{r.category}": {
        "mean": r.mean_tvd, "low": r.mean_tvd_low, "high": r.mean_tvd_high, "corrected": r.tvd_corrected,
        "corrected_low": r.tvd_corrected_low, "corrected_high": r.tvd_corrected_high,
        "mean_deviation": r.mean_deviation, "deviation_group": r.deviation_group, "benchmark": r.benchmark}
        for r in summary.itertuples()}}
    return res
