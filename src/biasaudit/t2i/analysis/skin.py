"""Section `skin`: skin tone (CIELAB) by classified label."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import UNKNOWN, l_bin
from biasaudit.faces import skin_scales
from biasaudit.pipeline.io import stable_table
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.regression import ols_cluster
from biasaudit.stats.skin_summary import skin_summary
from biasaudit.t2i.analysis.inputs import PLOTS, Boot, Inputs
from biasaudit.t2i.figures import plot_diversity, plot_earnings, plot_L_by_label, plot_L_vs_C, plot_skin_scales


def skin_table(faces: pd.DataFrame, labels: pd.DataFrame, prompts: pd.DataFrame,
               groups: tuple[str, ...]) -> pd.DataFrame:
    """Measured faces (status ok, L* present) joined with the label (one of `groups`, else unknown) and the prompt."""
    if faces.empty or "L" not in faces:
        return pd.DataFrame()
    ok = faces[(faces.get("status", "ok") == "ok") & faces["L"].notna()].copy()
    if labels.empty:
        ok["label"] = UNKNOWN
    else:
        ok = ok.merge(labels[["image_id", "label"]].drop_duplicates("image_id"), on="image_id", how="left")
        ok["label"] = ok["label"].where(ok["label"].isin(groups), UNKNOWN)
    if not prompts.empty:
        cols = [c for c in ("prompt_id", "category", "instance", "median_weekly_earnings_usd", "pct_women")
                if c in prompts]
        ok = ok.merge(prompts[cols], on="prompt_id", how="left")
    if "C" not in ok and {"a", "b"} <= set(ok.columns):
        ok["C"] = np.hypot(ok["a"], ok["b"])
    return ok.reset_index(drop=True)


def dark_share(skin: pd.DataFrame, boot: Boot, analyze: Any) -> pd.DataFrame:
    """Per model: among measured faces with L* below `analyze.dark_L_threshold` ("very dark"), the share
    classified `analyze.dark_group` (CI over prompts)."""
    threshold, group = analyze.dark_L_threshold, analyze.dark_group
    rows = []
    for model, sub in skin.groupby("model", sort=True):
        sub = sub.assign(dark=sub["L"] < threshold, hit=(sub["L"] < threshold) & (sub["label"] == group))
        per = sub.groupby("prompt_id")[["dark", "hit"]].sum().to_numpy(float)
        iv = boot.run(per, lambda s: np.where(s[..., 0] > 0, s[..., 1] / np.maximum(s[..., 0], 1), np.nan),
                      "dark", model)[0]
        rows.append({"model": model, "L_threshold": threshold, "group": group, "n_measured": len(sub),
                     "n_dark": int(sub["dark"].sum()), f"n_dark_{group}": int(sub["hit"].sum()),
                     "share": iv.estimate, "share_low": iv.low, "share_high": iv.high,
                     "n_prompts": iv.n_clusters, "note": iv.reason or ("" if sub["dark"].any() else
                                                                      f"no face with L* < {threshold:g}")})
    return pd.DataFrame(rows)


def labels_by_L_bin(skin: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """Counts and row shares of each label (`groups`, then unknown) within each L* bin, per model."""
    if "L_bin" not in skin:
        skin = skin.assign(L_bin=l_bin(skin["L"].to_numpy(float)))
    counts = pd.crosstab([skin["model"], skin["L_bin"].astype(str)], skin["label"]).reindex(
        columns=[*groups, UNKNOWN], fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0).add_prefix("share_")
    return pd.concat([counts.add_prefix("n_"), shares], axis=1).reset_index()


def earnings_regression(skin: pd.DataFrame, group: str, unit_usd: float, level: float) -> pd.DataFrame:
    """Per model: L* ~ median weekly earnings for `group`-classified occupational images, clustered by prompt."""
    rows = []
    for model, sub in skin.groupby("model", sort=True):
        s = sub[(sub["label"] == group) & (sub.get("category") == "occupation")]
        if "median_weekly_earnings_usd" in s:
            s = s[s["median_weekly_earnings_usd"].notna()]
        x = s["median_weekly_earnings_usd"] / unit_usd if len(s) else pd.Series(dtype=float)
        fit = ols_cluster(s["L"], x, s["prompt_id"], level=level) if len(s) else ols_cluster([], [], [])
        rows.append({"model": model, "group": group, "slope_unit_usd": unit_usd, **fit.as_dict()})
    return pd.DataFrame(rows)


WOMEN_UNIT = 0.10  # the slope's unit: 10 percentage points of women in the occupation


SEED_SUBSET = "seed"  # skin_women_share_ols.subset: the paper's subset (one label's faces)
LABEL_ADJUSTED = "extension: all labels, label fixed effects"


def women_share_regression(skin: pd.DataFrame, group: str, level: float) -> pd.DataFrame:
    """Per model, L* ~ the occupation's share of women (BLS table 11) over the occupational prompts' measured
    faces, clustered by prompt, slope per 10 points of women; two rows (`subset`):

    - `seed`: the `group`-classified faces only, the paper's subset ("In Flux Schnell's Black-classified
      occupational outputs, … higher L* values appear for stereotypically female occupations");
    - the extension: every labelled face, with a fixed effect per label. Pooling the labels without it answers
      another question: where only the label mix moves with the share of women, the pooled slope is the
      mix's, not a within-label change of skin tone (tests/test_analysis.py simulates it)."""
    rows = []
    for model, sub in skin.groupby("model", sort=True):
        s = sub[sub.get("category") == "occupation"]
        s = s[s["pct_women"].notna()] if "pct_women" in s else s.iloc[:0].assign(pct_women=np.nan)
        x = s["pct_women"] / WOMEN_UNIT
        seed = s["label"] == group
        pooled = s["label"] != UNKNOWN
        fits = {SEED_SUBSET: (seed, None), LABEL_ADJUSTED: (pooled, s["label"])}
        for subset, (keep, fixed) in fits.items():
            fit = ols_cluster(s.loc[keep, "L"], x[keep], s.loc[keep, "prompt_id"], level=level,
                              fixed=None if fixed is None else fixed[keep]) if keep.any() else ols_cluster([], [], [])
            rows.append({"model": model, "subset": subset, "group": group if subset == SEED_SUBSET else "all",
                         "faces": int(keep.sum()), "slope_unit_pct_women": 100 * WOMEN_UNIT, **fit.as_dict()})
    return pd.DataFrame(rows)


def scale_distribution(skin: pd.DataFrame, scales: skin_scales.Scales) -> pd.DataFrame:
    """Per model × label × prompt category (and 'all') × scale (ita | monk): the count and share of faces in
    each ITA category and Monk tone (every category and tone, lightest first, zeros included). `skin` carries
    skin_scales.annotate's columns."""
    parts = []
    cats = skin.get("category", pd.Series("", index=skin.index)).fillna("").astype(str)
    frame = pd.concat([skin.assign(category=cats), skin.assign(category="all")], ignore_index=True)
    for scale, column, tones in (("ita", "ita_category", scales.ita_categories), ("monk", "monk_tone", scales.monk_tones)):
        have = frame[frame[column] != skin_scales.NO_TONE]
        counts = pd.crosstab([have["model"], have["label"], have["category"]], have[column]).reindex(
            columns=list(tones), fill_value=0)
        shares = counts.div(counts.sum(axis=1), axis=0)
        long = counts.stack().rename("n").to_frame().join(shares.stack().rename("share"))
        long.index.names = ["model", "label", "category", "tone"]
        parts.append(long.reset_index().assign(scale=scale))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return out[["model", "label", "category", "scale", "tone", "n", "share"]]


def scales_by_label(skin: pd.DataFrame, scales: skin_scales.Scales) -> pd.DataFrame:
    """Per model × label, the two scales beside L*: mean L*, mean ITA° and its modal category, the median Monk
    tone, and the ΔE2000 from each face to its nearest Monk tone (median, 90th percentile, max: a large value is
    a face whose colour lies far from every swatch)."""
    rank = {t: i for i, t in enumerate(scales.monk_tones)}
    rows = []
    for (model, label), g in skin.groupby(["model", "label"], sort=True):
        tones = g["monk_tone"][g["monk_tone"] != skin_scales.NO_TONE]
        cats = g["ita_category"][g["ita_category"] != skin_scales.NO_TONE]
        de = g["monk_de2000"].dropna()
        ranks = np.sort(tones.map(rank).to_numpy(int))
        rows.append({"model": model, "label": label, "n": len(g), "L_mean": float(g["L"].mean()),
                     "ita_mean": float(g["ita"].mean()),
                     "ita_category_mode": cats.value_counts().idxmax() if len(cats) else "",
                     "monk_tone_median": scales.monk_tones[ranks[(len(ranks) - 1) // 2]] if len(ranks) else "",
                     "monk_de2000_median": float(de.median()) if len(de) else np.nan,
                     "monk_de2000_p90": float(de.quantile(0.9)) if len(de) else np.nan,
                     "monk_de2000_max": float(de.max()) if len(de) else np.nan})
    return pd.DataFrame(rows)


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Skin tone by classified label: the very-dark share, labels by L* bin, L* against earnings and against
    the occupation's share of women, mean L* and ΔE2000 diversity per label."""
    boot, a = Boot.of(cfg), cfg.analyze
    res = Result("skin", "Skin tone (CIELAB)")
    skin = skin_table(inputs.faces, inputs.labels, inputs.prompts, inputs.groups)
    if skin.empty:
        n_faces = len(inputs.faces)
        res.status = NO_DATA
        res.reason = inputs.notes.get("faces") or f"no measured face among {n_faces} face rows" + (
            "" if inputs.faces.empty or "reason" not in inputs.faces else
            " (reasons: " + "; ".join(f"{r} ×{c}" for r, c in inputs.faces["reason"].value_counts().head(4).items()) + ")")
        return res
    dark = dark_share(skin, boot, a)
    fits = earnings_regression(skin, a.earnings_group, a.earnings_unit_usd, boot.level)
    women = women_share_regression(skin, a.earnings_group, boot.level)
    res.tables = {C.SKIN_DARK_SHARE.name: dark, "skin_labels_by_L_bin": labels_by_L_bin(skin, inputs.groups),
                  "skin_earnings_ols": fits, C.SKIN_WOMEN_SHARE_OLS.name: women}
    res.plots = {"skin_L_C": skin[PLOTS["skin_L_C"]]}
    colours = inputs.colours
    res.figures = {"skin_L_by_label": plot_L_by_label(skin, dark, colours), "skin_L_vs_C": plot_L_vs_C(skin, colours),
                   "skin_L_vs_earnings": plot_earnings(skin, stable_table(fits), colours)}
    scales = skin_scales.load()
    toned = skin_scales.annotate(skin, scales)
    by_label = scales_by_label(toned, scales)
    distribution = scale_distribution(toned, scales)
    res.tables[C.SKIN_SCALES_BY_LABEL.name] = by_label
    res.tables[C.SKIN_SCALES.name] = distribution
    res.figures["skin_scales"] = plot_skin_scales(distribution, scales)
    res.notes.append("ITA° = atan2(L* − 50, b*)·180/π in Chardon et al.'s (1991) six categories; Monk tone: the "
                     "nearest of the 10 published MST swatches by ΔE2000 in CIELAB "
                     "(data/reference/skin_scales/README.md); monk_de2000 says how far that nearest swatch is")
    summary = skin_summary(skin, by=["model", "label"], cluster="prompt_id", n_boot=boot.n_boot, ci=boot.level,
                           seed=derive_seed(boot.seed, "skin_summary") % 2**32, method=boot.method)
    res.tables[C.SKIN_SUMMARY_BY_LABEL.name] = summary
    # every face of a model whatever its label (the seed's "lightest", "most diverse skin tones" of a model)
    res.tables[C.SKIN_SUMMARY_BY_MODEL.name] = skin_summary(
        skin, by=["model"], cluster="prompt_id", n_boot=boot.n_boot, ci=boot.level,
        seed=derive_seed(boot.seed, "skin_summary_by_model") % 2**32, method=boot.method)
    res.figures["skin_diversity"] = plot_diversity(summary, inputs.colours)
    res.metrics = {"dark_share": {r.model: {"group": r.group, "share": r.share, "low": r.share_low, "high": r.share_high,
                                                  "n_dark": r.n_dark} for r in dark.itertuples()},
                   "earnings_slope": {r.model: {"slope": r.slope, "low": r.ci_low, "high": r.ci_high,
                                                "p": r.p_value} for r in fits.itertuples()},
                   "women_share_slope": {f"{r.model}/{r.subset}": {"slope": r.slope, "low": r.ci_low,
                                                                   "high": r.ci_high, "p": r.p_value}
                                         for r in women.itertuples()}}
    res.metrics["skin_scales"] = {f"{r.model}/{r.label}": {
        "L_mean": r.L_mean, "ita_mean": r.ita_mean, "ita_category": r.ita_category_mode,
        "monk_tone": r.monk_tone_median, "monk_de2000_median": r.monk_de2000_median} for r in by_label.itertuples()}
    if summary is not None and len(summary):
        res.metrics["by_label"] = {f"{r['model']}/{r['label']}": {
            k: r.get(k) for k in ("n", "L_mean", "L_mean_lo", "L_mean_hi", "diversity_de2000",
                                  "diversity_de2000_lo", "diversity_de2000_hi") if k in r}
            for r in summary.to_dict("records")}
    return res
