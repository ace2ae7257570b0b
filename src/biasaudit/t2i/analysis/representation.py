"""Section `representation`: TVD against the benchmarks per prompt and model × category, per-race
deviations and the threshold analysis, each with a cluster-bootstrap CI over prompts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import UNKNOWN
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.resample import (
    p_adjust,
    sign_flip_pvalue,
)
from biasaudit.stats.tvd import bias_corrected_tvd, null_floor, tvd
from biasaudit.t2i.analysis.inputs import PLOTS, Boot, Inputs
from biasaudit.t2i.figures import plot_shares, plot_tvd


def per_prompt_table(labels: pd.DataFrame, prompts: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """One row per model × prompt: counts, shares and benchmark shares of the groups
    (the group set's labels), TVD.

    Abstentions (any label outside the groups) are excluded from the shares and counted in
    n_unknown; a prompt whose every image abstained has NaN shares and TVD."""
    if labels.empty or prompts.empty:
        return pd.DataFrame()
    lab = labels[["model", "prompt_id", "label"]].copy()
    lab["label"] = lab["label"].where(lab["label"].isin(groups), UNKNOWN)
    counts = pd.crosstab([lab["model"], lab["prompt_id"]], lab["label"])
    counts = counts.reindex(columns=[*groups, UNKNOWN], fill_value=0)
    out = pd.DataFrame(index=counts.index)
    out["n"] = counts[list(groups)].sum(axis=1)
    out["n_unknown"] = counts[UNKNOWN]
    for g in groups:
        out[f"n_{g}"] = counts[g]
    shares = counts[list(groups)].div(out["n"].where(out["n"] > 0), axis=0)
    for g in groups:
        out[f"share_{g}"] = shares[g]
    out = out.reset_index()
    meta = prompts[["prompt_id", "category", "instance", "selected_for", *groups]].rename(
        columns={g: f"bench_{g}" for g in groups})
    out = out.merge(meta, on="prompt_id", how="inner")
    p = out[[f"share_{g}" for g in groups]].to_numpy()
    q = out[[f"bench_{g}" for g in groups]].to_numpy()
    out["tvd"] = tvd(p, q)
    out["null_floor"] = null_floor(out["n"].to_numpy(), q)
    out["tvd_bias_corrected"] = bias_corrected_tvd(out[[f"n_{g}" for g in groups]].to_numpy(float), q)
    first = ["model", "category", "prompt_id", "instance", "selected_for", "n", "n_unknown", "tvd", "null_floor",
             "tvd_bias_corrected"]
    return out[first + [c for c in out.columns if c not in first]].sort_values(["model", "category", "prompt_id"],
                                                                              ignore_index=True)


def _tvd_totals(pp: pd.DataFrame, groups: tuple[str, ...]) -> np.ndarray:
    """Per-prompt totals: valid, tvd, n_g (G), n, n·bench_g (G), bias-corrected tvd, null floor."""
    n = pp["n"].to_numpy(float)
    valid = (n > 0).astype(float)
    t = np.nan_to_num(pp["tvd"].to_numpy(float)) * valid
    counts = pp[[f"n_{g}" for g in groups]].to_numpy(float)
    bench = pp[[f"bench_{g}" for g in groups]].to_numpy(float) * n[:, None]
    corr = np.nan_to_num(pp["tvd_bias_corrected"].to_numpy(float)) * valid
    floor = np.nan_to_num(pp["null_floor"].to_numpy(float)) * valid
    return np.column_stack([valid, t, counts, n, bench, corr, floor])


def _tvd_stat(s: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        G = (s.shape[-1] - 5) // 2  # the groups' count, from _tvd_totals' layout
        mean = s[..., 1] / s[..., 0]
        n = s[..., 2 + G][..., None]
        pooled = tvd(s[..., 2:2 + G] / n, s[..., 3 + G:3 + 2 * G] / n)
        corrected = s[..., 3 + 2 * G] / s[..., 0]
    return np.stack([mean, pooled, corrected], axis=-1)


def _by_category(pp: pd.DataFrame):
    """(model, category, rows) for every model × category plus model × 'all'."""
    for model, rows in pp.groupby("model", sort=True):
        for cat, sub in rows.groupby("category", sort=True):
            yield model, cat, sub
        yield model, "all", rows


def tvd_summary(pp: pd.DataFrame, boot: Boot, groups: tuple[str, ...]) -> pd.DataFrame:
    """Per model × category (and 'all'): mean per-prompt TVD and pooled TVD with cluster-bootstrap CIs,
    the null floor (mean expected TVD of a model drawing exactly from the benchmark at each prompt's n)
    and the bias-corrected mean TVD with its CI (stats.tvd; `tvd_corrected*` are the same numbers
    under the short name — finite-n bias, not classifier error, which is `tvd_corrected_summary`)."""
    rows = []
    for model, cat, sub in _by_category(pp):
        totals = _tvd_totals(sub, groups)
        mean, pooled, corrected = boot.run(totals, _tvd_stat, "tvd", model, cat)
        valid = totals[:, 0].sum()
        floor = float(totals[:, -1].sum() / valid) if valid else np.nan
        rows.append({"model": model, "category": cat, "n_prompts": int((sub["n"] > 0).sum()),
                     "n_prompts_all_abstained": int((sub["n"] == 0).sum()), "n_images": int(sub["n"].sum()),
                     "n_unknown": int(sub["n_unknown"].sum()),
                     **{k: v for k, v in mean.as_dict("mean_tvd_").items() if k != "mean_tvd_n_clusters"},
                     **{k: v for k, v in pooled.as_dict("pooled_tvd_").items() if k != "pooled_tvd_n_clusters"},
                     "null_floor": floor, "tvd_bias_corrected": corrected.estimate,
                     "tvd_bias_corrected_low": corrected.low, "tvd_bias_corrected_high": corrected.high,
                     "tvd_bias_corrected_reason": corrected.reason,
                     "tvd_corrected": corrected.estimate, "tvd_corrected_low": corrected.low,
                     "tvd_corrected_high": corrected.high})
    return pd.DataFrame(rows).rename(columns={"mean_tvd_estimate": "mean_tvd", "pooled_tvd_estimate": "pooled_tvd"})


def _pair_stat(s: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return (s[..., 1] - s[..., 2]) / s[..., 0]


def tvd_paired(pp: pd.DataFrame, boot: Boot) -> pd.DataFrame:
    """Paired model comparison: mean TVD of model_a minus model_b over the prompts both answered
    (n > 0 for both), per category and 'all', with a cluster-bootstrap CI over those prompts (both
    models resampled together), a two-sided sign-flip permutation p-value of the per-prompt
    differences (exact when the two models are exchangeable on every prompt) and its adjustment over
    the table. Negative diff: model_a is closer to the benchmark."""
    cols = ["model_a", "model_b", "category", "n_prompts", "tvd_a", "tvd_b", "diff", "low", "high", "p_value",
            "p_adjusted", "p_adjust_method", "reason"]
    valid = pp[pp["n"] > 0]
    models = sorted(valid["model"].unique())
    rows = []
    cats = [*sorted(valid["category"].unique()), "all"]
    for i, a in enumerate(models):
        for b in models[i + 1:]:
            A = valid[valid["model"] == a].set_index("prompt_id")
            B = valid[valid["model"] == b].set_index("prompt_id")
            shared = A.index.intersection(B.index)
            for cat in cats:
                keep = shared if cat == "all" else shared[A.loc[shared, "category"].to_numpy() == cat]
                ta, tb = A.loc[keep, "tvd"].to_numpy(float), B.loc[keep, "tvd"].to_numpy(float)
                totals = np.column_stack([np.ones(len(keep)), ta, tb])
                iv = boot.run(totals, _pair_stat, "tvd_paired", a, b, cat)[0]
                p = sign_flip_pvalue(ta - tb, 9999, derive_seed(boot.seed, "tvd_paired_test", a, b, cat) % 2**32)[1]
                rows.append({"model_a": a, "model_b": b, "category": cat, "n_prompts": len(keep),
                             "tvd_a": float(ta.mean()) if len(keep) else np.nan,
                             "tvd_b": float(tb.mean()) if len(keep) else np.nan, "diff": iv.estimate,
                             "low": iv.low, "high": iv.high, "p_value": p,
                             "reason": iv.reason or ("" if len(keep) else "no prompt answered by both models")})
    out = pd.DataFrame(rows, columns=[c for c in cols if c not in ("p_adjusted", "p_adjust_method")])
    out["p_adjusted"] = p_adjust(out["p_value"].to_numpy(float), boot.p_adjust) if len(out) else []
    out["p_adjust_method"] = boot.p_adjust
    return out[cols]


def shares_long(pp: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """Figure 2 data: one row per model × prompt × race with model and benchmark share."""
    valid = pp[pp["n"] > 0]
    parts = [valid[["model", "category", "prompt_id", "instance", "n"]].assign(
        race=g, benchmark_share=valid[f"bench_{g}"], model_share=valid[f"share_{g}"]) for g in groups]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    out["deviation"] = out["model_share"] - out["benchmark_share"]
    return out


def deviation_summary(pp: pd.DataFrame, boot: Boot, groups: tuple[str, ...]) -> pd.DataFrame:
    """Per model × category × race: share of prompts below the benchmark and mean signed deviation."""
    rows = []
    for model, cat, sub in _by_category(pp):
        sub = sub[sub["n"] > 0]
        share = sub[[f"share_{g}" for g in groups]].to_numpy(float)
        bench = sub[[f"bench_{g}" for g in groups]].to_numpy(float)
        totals = np.column_stack([np.ones(len(sub)), share < bench, share - bench])

        def stat(s: np.ndarray, G: int = len(groups)) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.concatenate([s[..., 1:1 + G] / s[..., :1], s[..., 1 + G:] / s[..., :1]], axis=-1)

        intervals = boot.run(totals, stat, "deviation", model, cat)
        for i, g in enumerate(groups):
            below, dev = intervals[i], intervals[len(groups) + i]
            rows.append({"model": model, "category": cat, "race": g, "n_prompts": len(sub),
                         "share_below": below.estimate, "share_below_low": below.low,
                         "share_below_high": below.high, "mean_deviation": dev.estimate,
                         "mean_deviation_low": dev.low, "mean_deviation_high": dev.high,
                         "direction": ("under" if dev.high < 0 else "over" if dev.low > 0 else "n.s.")
                         if np.isfinite(dev.low) else ""})
    return pd.DataFrame(rows)


def threshold_analysis(pp: pd.DataFrame, group: str, threshold: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prompts whose benchmark share of `group` exceeds `threshold`: does the model reach it?"""
    sub = pp[(pp["n"] > 0) & (pp[f"bench_{group}"] > threshold)].copy()
    sub["model_share"] = sub[f"share_{group}"]
    sub["benchmark_share"] = sub[f"bench_{group}"]
    sub["reaches"] = sub["model_share"] >= sub["benchmark_share"]
    detail = sub[["model", "category", "prompt_id", "instance", "n", "benchmark_share", "model_share", "reaches"]]
    rows = []
    for model, cat, s in _by_category(sub) if len(sub) else []:
        rows.append({"model": model, "category": cat, "group": group, "threshold": threshold,
                     "n_prompts_above": len(s), "n_reaching": int(s["reaches"].sum()),
                     "share_reaching": float(s["reaches"].mean()),
                     "mean_shortfall": float((s["benchmark_share"] - s["model_share"]).clip(lower=0).mean())})
    return pd.DataFrame(rows), detail.reset_index(drop=True)


def compute(inputs: Inputs, cfg: Any) -> Result:
    """TVD per prompt and model × category (mean and pooled, null floor, bias-corrected, paired model
    differences), per-race deviations, and the threshold analysis of `analyze.threshold_group`."""
    boot, a = Boot.of(cfg), cfg.analyze
    res = Result("representation", "Representation against the benchmarks")
    if inputs.labels.empty or inputs.prompts.empty:
        res.status, res.reason = NO_DATA, inputs.notes.get("labels") or inputs.notes.get("prompts", "no labels")
        return res
    groups = inputs.groups
    pp = per_prompt_table(inputs.labels, inputs.prompts, groups)
    if pp.empty:
        res.status, res.reason = NO_DATA, "no labelled image matches a prompt in data/t2i/prompts.csv"
        return res
    summary = tvd_summary(pp, boot, groups)
    paired = tvd_paired(pp, boot)
    long = shares_long(pp, groups)
    deviations = deviation_summary(pp, boot, groups)
    thr, thr_detail = threshold_analysis(pp, a.threshold_group, a.threshold_share)
    res.tables = {C.TVD_SUMMARY.name: summary, C.TVD_PAIRED.name: paired, C.TVD_PER_PROMPT.name: pp,
                  "deviation_by_race": deviations, "threshold_summary": thr, "threshold_prompts": thr_detail}
    res.plots = {"shares": long[PLOTS["shares"]], "tvd": summary[PLOTS["tvd"]]}
    if len(long):
        res.figures["figure2_shares"] = plot_shares(long, inputs.colours)
    res.figures["tvd_by_category"] = plot_tvd(summary, boot.level)
    res.metrics = {"tvd": {f"{r.model}/{r.category}": {"mean": r.mean_tvd, "low": r.mean_tvd_low,
                                                      "high": r.mean_tvd_high, "pooled": r.pooled_tvd,
                                                      "n_prompts": r.n_prompts, "null_floor": r.null_floor,
                                                      "bias_corrected": r.tvd_bias_corrected,
                                                      "bias_corrected_low": r.tvd_bias_corrected_low,
                                                      "bias_corrected_high": r.tvd_bias_corrected_high}
                           for r in summary.itertuples()},
                   "tvd_paired": {f"{r.model_a}-{r.model_b}/{r.category}": {
                       "diff": r.diff, "low": r.low, "high": r.high, "p": r.p_value, "p_adjusted": r.p_adjusted}
                       for r in paired.itertuples()}}
    res.notes.append("null floor: the mean TVD a model drawing exactly from the benchmark would score at these "
                     "per-prompt n; bias-corrected TVD: 2·TVD − E*[TVD*] per prompt (exact multinomial bootstrap)")
    n_unknown = int(pp["n_unknown"].sum())
    if n_unknown:
        res.notes.append(f"{n_unknown} abstentions (label unknown) excluded from shares and TVD")
    return res
