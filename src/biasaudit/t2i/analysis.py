"""Method A analysis: representation (TVD, per-race deviations, thresholds), skin tone, homogeneity
and classifier reliability, each with cluster-bootstrap confidence intervals over prompts.

Every section function takes stage outputs (formats in biasaudit.contracts) and returns a
`Result` with tables, figures and headline metrics; an empty input gives status 'no data' with the
reason, a function owned by another stage that has not landed gives status 'pending'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.contracts import GROUPS, L_BIN_LABELS, LABEL_ORDER, UNKNOWN, l_bin
from biasaudit.outputs import NO_DATA, Figure, Result
from biasaudit.params.analysis import Analyze
from biasaudit.provenance import derive_seed
from biasaudit.stats.correction import (
    classifier_corrected_tvd,
    corrected_deviation,
    corrected_per_prompt,
    debiased_tvd,
    image_confusions,
    matrix_from_counts,
    reference_labels,
)
from biasaudit.stats.homogeneity import add_p_adjusted, homogeneity_table
from biasaudit.stats.regression import ols_cluster
from biasaudit.stats.resample import (
    Interval,
    Replicates,
    cluster_bootstrap,
    p_adjust,
    replicates,
    sign_flip_pvalue,
    sums_statistic,
)
from biasaudit.stats.skin_summary import skin_summary
from biasaudit.stats.tvd import bias_corrected_tvd, null_floor, tvd

G = len(GROUPS)
PALETTE = dict(zip(LABEL_ORDER, ("#4c72b0", "#1f3a93", "#dd8452", "#55a868", "#8172b3", "#999999")))
PALETTE["black"] = "#1f77b4"  # the paper's blue points (Black) in Figure 2
PALETTE["white"] = "#7f7f7f"
L_BINS = L_BIN_LABELS  # the faces stage writes these (biasaudit.contracts)
# CSVs declared as DVC plots (always written, empty with this header when a section has no data).
_DEFAULTS = Analyze()  # function defaults come from the schema (params.yaml overrides them in the notebook)
PLOTS = {"shares": ["model", "category", "prompt_id", "race", "benchmark_share", "model_share"],
         "tvd": ["model", "category", "mean_tvd", "mean_tvd_low", "mean_tvd_high", "pooled_tvd", "null_floor",
                 "tvd_bias_corrected", "tvd_bias_corrected_low", "tvd_bias_corrected_high"],
         "skin_L_C": ["model", "image_id", "label", "L", "C"]}


@dataclass(frozen=True)
class Boot:
    """Bootstrap settings shared by every interval of one run."""

    n_boot: int = 2000
    level: float = 0.95
    method: str = "percentile"
    seed: int = 0
    p_adjust: str = "holm"  # holm | bh | none: adjustment of the p-values of one table
    permutation_design: str = "within"  # homogeneity permutation test: within | across prompts

    def run(self, totals: np.ndarray, statistic, *key: Any) -> list[Interval]:
        return cluster_bootstrap(totals, statistic, n_boot=self.n_boot, level=self.level,
                                 seed=derive_seed(self.seed, *key), method=self.method)

    def replicates(self, totals: np.ndarray, statistic, *key: Any) -> Replicates:
        totals = np.asarray(totals, dtype=float)
        return replicates(sums_statistic(totals, statistic), len(totals), n_boot=self.n_boot,
                          seed=derive_seed(self.seed, *key), method=self.method)


# ---------------------------------------------------------------- inputs

@dataclass
class Inputs:
    prompts: pd.DataFrame
    manifests: pd.DataFrame
    labels: pd.DataFrame
    faces: pd.DataFrame
    root: Path
    notes: dict[str, str] = field(default_factory=dict)  # input → why it is empty or partial

    @property
    def models(self) -> list[str]:
        seen = [*self.manifests.get("model", []), *self.labels.get("model", []), *self.faces.get("model", [])]
        return list(dict.fromkeys(map(str, seen)))


def _read_parquets(paths: list[Path], what: str, notes: dict[str, str]) -> pd.DataFrame:
    frames, bad = [], []
    for path in sorted(paths):
        try:
            frames.append(pd.read_parquet(path))
        except Exception as exc:
            bad.append(f"{path.name}: {type(exc).__name__}")
    if bad:
        notes[what] = "unreadable: " + "; ".join(bad)
    elif not paths:
        notes[what] = f"no {what} files yet ({(C.T2I / what).as_posix()}/)"
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_inputs(root: str | Path = ".", prompts_file: str | Path = C.PROMPTS_CSV,
                images_dir: str | Path = C.IMAGES_DIR) -> Inputs:
    """Read the upstream stage outputs under `root` (missing ones become empty frames + a note);
    `prompts_file` and `images_dir` are generate.prompts_file and generate.images_dir."""
    root = Path(root)
    notes: dict[str, str] = {}
    prompts_path = root / prompts_file
    prompts = pd.read_csv(prompts_path) if prompts_path.exists() else pd.DataFrame()
    if prompts.empty:
        notes["prompts"] = f"{prompts_path.as_posix()} missing or empty"
    manifests = _read_parquets(list((root / images_dir).glob("*/manifest.parquet")), "images", notes)
    labels = _read_parquets(list((root / C.LABELS_DIR).glob("*.parquet")), "labels", notes)
    faces = _read_parquets(list((root / C.FACES_DIR).glob("*.parquet")), "faces", notes)
    return Inputs(prompts, manifests, labels, faces, root, notes)


# ---------------------------------------------------------------- representation

def per_prompt_table(labels: pd.DataFrame, prompts: pd.DataFrame) -> pd.DataFrame:
    """One row per model × prompt: counts, shares and benchmark shares of the five groups, TVD.

    Abstentions (any label outside the five groups) are excluded from the shares and counted in
    n_unknown; a prompt whose every image abstained has NaN shares and TVD."""
    if labels.empty or prompts.empty:
        return pd.DataFrame()
    lab = labels[["model", "prompt_id", "label"]].copy()
    lab["label"] = lab["label"].where(lab["label"].isin(GROUPS), UNKNOWN)
    counts = pd.crosstab([lab["model"], lab["prompt_id"]], lab["label"])
    counts = counts.reindex(columns=list(LABEL_ORDER), fill_value=0)
    out = pd.DataFrame(index=counts.index)
    out["n"] = counts[list(GROUPS)].sum(axis=1)
    out["n_unknown"] = counts[UNKNOWN]
    for g in GROUPS:
        out[f"n_{g}"] = counts[g]
    shares = counts[list(GROUPS)].div(out["n"].where(out["n"] > 0), axis=0)
    for g in GROUPS:
        out[f"share_{g}"] = shares[g]
    out = out.reset_index()
    meta = prompts[["prompt_id", "category", "instance", "selected_for", *GROUPS]].rename(
        columns={g: f"bench_{g}" for g in GROUPS})
    out = out.merge(meta, on="prompt_id", how="inner")
    p = out[[f"share_{g}" for g in GROUPS]].to_numpy()
    q = out[[f"bench_{g}" for g in GROUPS]].to_numpy()
    out["tvd"] = tvd(p, q)
    out["null_floor"] = null_floor(out["n"].to_numpy(), q)
    out["tvd_bias_corrected"] = bias_corrected_tvd(out[[f"n_{g}" for g in GROUPS]].to_numpy(float), q)
    first = ["model", "category", "prompt_id", "instance", "selected_for", "n", "n_unknown", "tvd", "null_floor",
             "tvd_bias_corrected"]
    return out[first + [c for c in out.columns if c not in first]].sort_values(["model", "category", "prompt_id"],
                                                                              ignore_index=True)


def _tvd_totals(pp: pd.DataFrame) -> np.ndarray:
    """Per-prompt totals: valid, tvd, n_g (5), n, n·bench_g (5), bias-corrected tvd, null floor."""
    n = pp["n"].to_numpy(float)
    valid = (n > 0).astype(float)
    t = np.nan_to_num(pp["tvd"].to_numpy(float)) * valid
    counts = pp[[f"n_{g}" for g in GROUPS]].to_numpy(float)
    bench = pp[[f"bench_{g}" for g in GROUPS]].to_numpy(float) * n[:, None]
    corr = np.nan_to_num(pp["tvd_bias_corrected"].to_numpy(float)) * valid
    floor = np.nan_to_num(pp["null_floor"].to_numpy(float)) * valid
    return np.column_stack([valid, t, counts, n, bench, corr, floor])


def _tvd_stat(s: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
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


def tvd_summary(pp: pd.DataFrame, boot: Boot) -> pd.DataFrame:
    """Per model × category (and 'all'): mean per-prompt TVD and pooled TVD with cluster-bootstrap CIs,
    the null floor (mean expected TVD of a model drawing exactly from the benchmark at each prompt's n)
    and the bias-corrected mean TVD with its CI (stats.tvd; `tvd_corrected*` are the same numbers
    under the short name — finite-n bias, not classifier error, which is `tvd_corrected_summary`)."""
    rows = []
    for model, cat, sub in _by_category(pp):
        totals = _tvd_totals(sub)
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


def shares_long(pp: pd.DataFrame) -> pd.DataFrame:
    """Figure 2 data: one row per model × prompt × race with model and benchmark share."""
    valid = pp[pp["n"] > 0]
    parts = [valid[["model", "category", "prompt_id", "instance", "n"]].assign(
        race=g, benchmark_share=valid[f"bench_{g}"], model_share=valid[f"share_{g}"]) for g in GROUPS]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    out["deviation"] = out["model_share"] - out["benchmark_share"]
    return out


def deviation_summary(pp: pd.DataFrame, boot: Boot) -> pd.DataFrame:
    """Per model × category × race: share of prompts below the benchmark and mean signed deviation."""
    rows = []
    for model, cat, sub in _by_category(pp):
        sub = sub[sub["n"] > 0]
        share = sub[[f"share_{g}" for g in GROUPS]].to_numpy(float)
        bench = sub[[f"bench_{g}" for g in GROUPS]].to_numpy(float)
        totals = np.column_stack([np.ones(len(sub)), share < bench, share - bench])

        def stat(s: np.ndarray) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.concatenate([s[..., 1:1 + G] / s[..., :1], s[..., 1 + G:] / s[..., :1]], axis=-1)

        intervals = boot.run(totals, stat, "deviation", model, cat)
        for i, g in enumerate(GROUPS):
            below, dev = intervals[i], intervals[G + i]
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


def _facet_grid(nrows: int, ncols: int, size: float = 3.2):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 1.2, size * nrows), squeeze=False,
                             sharex=True, sharey=True)
    return fig, axes


def plot_shares(long: pd.DataFrame) -> Figure:
    """The paper's Figure 2: model share against benchmark share per race and prompt, with the diagonal."""
    models, cats = sorted(long["model"].unique()), sorted(long["category"].unique())
    fig, axes = _facet_grid(len(models), len(cats))
    for i, model in enumerate(models):
        for j, cat in enumerate(cats):
            ax = axes[i, j]
            ax.plot([0, 1], [0, 1], color="0.3", lw=1, ls="--", zorder=0)
            sub = long[(long["model"] == model) & (long["category"] == cat)]
            for g in GROUPS:
                s = sub[sub["race"] == g]
                ax.scatter(s["benchmark_share"], s["model_share"], s=22, alpha=0.8, color=PALETTE[g],
                           label=g, edgecolor="white", linewidth=0.4)
            ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), title=f"{model} · {cat}")
            if i == len(models) - 1:
                ax.set_xlabel("benchmark share")
            if j == 0:
                ax.set_ylabel("model share")
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", title="race (classified)")
    fig.tight_layout(rect=(0, 0, 0.88, 1))
    return Figure(fig, "Model share vs benchmark share (Figure 2)",
                  "Each point is one prompt and race: below the dashed diagonal the model under-represents "
                  "that group relative to the Census/BLS benchmark. Abstentions excluded.")


def plot_tvd(summary: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    cats = list(dict.fromkeys(summary["category"]))
    models = sorted(summary["model"].unique())
    width = 0.8 / max(len(models), 1)
    for k, model in enumerate(models):
        s = summary[summary["model"] == model].set_index("category").reindex(cats)
        x = np.arange(len(cats)) + (k - (len(models) - 1) / 2) * width
        err = np.vstack([s["mean_tvd"] - s["mean_tvd_low"], s["mean_tvd_high"] - s["mean_tvd"]])
        ax.errorbar(x, s["mean_tvd"], yerr=np.nan_to_num(err), fmt="o", capsize=3, label=model)
    ax.set_xticks(np.arange(len(cats)), cats)
    ax.set(ylabel="mean per-prompt TVD", ylim=(0, 1), title="Distance from the benchmark (TVD)")
    ax.legend(title="model", fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Mean per-prompt TVD by model and category",
                  "Total variation distance between the classified and the benchmark distribution, averaged "
                  "over prompts; bars are cluster-bootstrap CIs over prompts.")


def representation(inputs: Inputs, boot: Boot, threshold_group: str = "black",
                   threshold_share: float = 0.05) -> Result:
    res = Result("representation", "Representation against the benchmarks")
    if inputs.labels.empty or inputs.prompts.empty:
        res.status, res.reason = NO_DATA, inputs.notes.get("labels") or inputs.notes.get("prompts", "no labels")
        return res
    pp = per_prompt_table(inputs.labels, inputs.prompts)
    if pp.empty:
        res.status, res.reason = NO_DATA, "no labelled image matches a prompt in data/t2i/prompts.csv"
        return res
    summary = tvd_summary(pp, boot)
    paired = tvd_paired(pp, boot)
    long = shares_long(pp)
    deviations = deviation_summary(pp, boot)
    thr, thr_detail = threshold_analysis(pp, threshold_group, threshold_share)
    res.tables = {"tvd_summary": summary, "tvd_paired": paired, "tvd_per_prompt": pp,
                  "deviation_by_race": deviations, "threshold_summary": thr, "threshold_prompts": thr_detail}
    res.plots = {"shares": long[PLOTS["shares"]], "tvd": summary[PLOTS["tvd"]]}
    if len(long):
        res.figures["figure2_shares"] = plot_shares(long)
    res.figures["tvd_by_category"] = plot_tvd(summary)
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


# ---------------------------------------------------------------- skin tone

def skin_table(faces: pd.DataFrame, labels: pd.DataFrame, prompts: pd.DataFrame) -> pd.DataFrame:
    """Measured faces (status ok, L* present) joined with the race label and the prompt."""
    if faces.empty or "L" not in faces:
        return pd.DataFrame()
    ok = faces[(faces.get("status", "ok") == "ok") & faces["L"].notna()].copy()
    if labels.empty:
        ok["label"] = UNKNOWN
    else:
        ok = ok.merge(labels[["image_id", "label"]].drop_duplicates("image_id"), on="image_id", how="left")
        ok["label"] = ok["label"].where(ok["label"].isin(GROUPS), UNKNOWN)
    if not prompts.empty:
        cols = [c for c in ("prompt_id", "category", "instance", "median_weekly_earnings_usd") if c in prompts]
        ok = ok.merge(prompts[cols], on="prompt_id", how="left")
    if "C" not in ok and {"a", "b"} <= set(ok.columns):
        ok["C"] = np.hypot(ok["a"], ok["b"])
    return ok.reset_index(drop=True)


def dark_share(skin: pd.DataFrame, boot: Boot, threshold: float = _DEFAULTS.dark_L_threshold, group: str = "black") -> pd.DataFrame:
    """Per model: among measured faces with L* < threshold, the share classified `group` (CI over prompts)."""
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


def labels_by_L_bin(skin: pd.DataFrame) -> pd.DataFrame:
    """Counts and row shares of each label within each L* bin, per model."""
    if "L_bin" not in skin:
        skin = skin.assign(L_bin=l_bin(skin["L"].to_numpy(float)))
    counts = pd.crosstab([skin["model"], skin["L_bin"].astype(str)], skin["label"]).reindex(
        columns=list(LABEL_ORDER), fill_value=0)
    shares = counts.div(counts.sum(axis=1), axis=0).add_prefix("share_")
    return pd.concat([counts.add_prefix("n_"), shares], axis=1).reset_index()


def earnings_regression(skin: pd.DataFrame, group: str = "black", unit_usd: float = 100.0,
                        level: float = 0.95) -> pd.DataFrame:
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


def plot_L_by_label(skin: pd.DataFrame, dark_L: float) -> Figure:
    import matplotlib.pyplot as plt
    import seaborn as sns

    order = [g for g in LABEL_ORDER if g in set(skin["label"])]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    sns.boxplot(skin, x="label", y="L", hue="model", order=order, ax=ax, fliersize=0, boxprops={"alpha": 0.5})
    sns.stripplot(skin, x="label", y="L", hue="model", order=order, ax=ax, dodge=True, size=3, legend=False)
    ax.axhline(dark_L, color="0.4", ls=":", lw=1)
    ax.set(xlabel="classified race", ylabel="skin lightness L*", ylim=(0, 100), title="Skin lightness by label")
    fig.tight_layout()
    return Figure(fig, "L* by classified race and model",
                  f"Mean skin-pixel L* (CIELAB, D65) per image; dotted line: L* = {dark_L:g} (analyze.dark_L_threshold).")


def plot_L_vs_C(skin: pd.DataFrame) -> Figure:
    models = sorted(skin["model"].unique())
    fig, axes = _facet_grid(1, len(models))
    for j, model in enumerate(models):
        ax = axes[0, j]
        sub = skin[skin["model"] == model]
        for g in LABEL_ORDER:
            s = sub[sub["label"] == g]
            if len(s):
                ax.scatter(s["C"], s["L"], s=14, alpha=0.8, color=PALETTE[g], label=g)
        ax.set(title=model, xlabel="chroma C*", ylabel="lightness L*" if j == 0 else "")
    handles, names = [], []
    for ax in axes[0]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="center right", title="label")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return Figure(fig, "L* vs C* per model", "Skin lightness against chroma, coloured by classified race.")


def plot_earnings(skin: pd.DataFrame, fits: pd.DataFrame, group: str, unit_usd: float) -> Figure:
    models = sorted(fits["model"])
    fig, axes = _facet_grid(1, len(models))
    for j, model in enumerate(models):
        ax = axes[0, j]
        s = skin[(skin["model"] == model) & (skin["label"] == group) & (skin.get("category") == "occupation")]
        ax.scatter(s["median_weekly_earnings_usd"], s["L"], s=16, alpha=0.7, color=PALETTE[group])
        f = fits.set_index("model").loc[model]
        if np.isfinite(f["slope"]):
            xs = np.linspace(s["median_weekly_earnings_usd"].min(), s["median_weekly_earnings_usd"].max(), 50)
            ax.plot(xs, f["intercept"] + f["slope"] * xs / unit_usd, color="k")
            ax.set_title(f"{model}\nslope {f['slope']:.2f} [{f['ci_low']:.2f}, {f['ci_high']:.2f}] "
                         f"per ${unit_usd:g}/wk, p={f['p_value']:.2g}", fontsize=9)
        else:
            ax.set_title(f"{model}\nno fit: {f['reason']}", fontsize=9)
        ax.set(xlabel="median weekly earnings (USD, BLS)", ylabel="L*" if j == 0 else "")
    fig.tight_layout()
    return Figure(fig, f"L* vs median weekly earnings ({group}-classified occupational images)",
                  "OLS with errors clustered by prompt; line = fit, title = slope with CI and p-value.")


def plot_diversity(summary: pd.DataFrame) -> Figure:
    """Mean pairwise ΔE2000 per label and model, with its bootstrap CI where there is one."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [g for g in LABEL_ORDER if g in set(summary["label"])]
    models = sorted(summary["model"].unique())
    width = 0.8 / max(len(models), 1)
    for k, model in enumerate(models):
        s = summary[summary["model"] == model].set_index("label").reindex(labels)
        x = np.arange(len(labels)) + (k - (len(models) - 1) / 2) * width
        y = s["diversity_de2000"].to_numpy(float)
        if {"diversity_de2000_lo", "diversity_de2000_hi"} <= set(s.columns):
            err = np.nan_to_num(np.vstack([y - s["diversity_de2000_lo"], s["diversity_de2000_hi"] - y]).clip(min=0))
        else:
            err = None
        ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, label=model)
    ax.set_xticks(np.arange(len(labels)), labels)
    ax.set(xlabel="classified race", ylabel="mean pairwise ΔE2000", title="Skin-tone diversity")
    ax.legend(title="model", fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Skin-tone diversity by label and model",
                  "Mean pairwise CIEDE2000 difference between the images' skin colours (higher = more varied); "
                  "bars are cluster-bootstrap CIs over prompts.")


def skin_tone(inputs: Inputs, boot: Boot, dark_L: float = _DEFAULTS.dark_L_threshold,
              earnings_group: str = _DEFAULTS.earnings_group, unit_usd: float = _DEFAULTS.earnings_unit_usd) -> Result:
    res = Result("skin", "Skin tone (CIELAB)")
    skin = skin_table(inputs.faces, inputs.labels, inputs.prompts)
    if skin.empty:
        n_faces = len(inputs.faces)
        res.status = NO_DATA
        res.reason = inputs.notes.get("faces") or f"no measured face among {n_faces} face rows" + (
            "" if inputs.faces.empty or "reason" not in inputs.faces else
            " (reasons: " + "; ".join(f"{r} ×{c}" for r, c in inputs.faces["reason"].value_counts().head(4).items()) + ")")
        return res
    dark = dark_share(skin, boot, dark_L, "black")
    fits = earnings_regression(skin, earnings_group, unit_usd, boot.level)
    res.tables = {"skin_dark_share": dark, "skin_labels_by_L_bin": labels_by_L_bin(skin),
                  "skin_earnings_ols": fits}
    res.plots = {"skin_L_C": skin[PLOTS["skin_L_C"]]}
    res.figures = {"skin_L_by_label": plot_L_by_label(skin, dark_L), "skin_L_vs_C": plot_L_vs_C(skin),
                   "skin_L_vs_earnings": plot_earnings(skin, fits, earnings_group, unit_usd)}
    summary = skin_summary(skin, by=["model", "label"], cluster="prompt_id", n_boot=boot.n_boot, ci=boot.level,
                           seed=derive_seed(boot.seed, "skin_summary") % 2**32, method=boot.method)
    res.tables["skin_summary_by_label"] = summary
    res.figures["skin_diversity"] = plot_diversity(summary)
    res.metrics = {"dark_share_black": {r.model: {"share": r.share, "low": r.share_low, "high": r.share_high,
                                                  "n_dark": r.n_dark} for r in dark.itertuples()},
                   "earnings_slope": {r.model: {"slope": r.slope, "low": r.ci_low, "high": r.ci_high,
                                                "p": r.p_value} for r in fits.itertuples()}}
    if summary is not None and len(summary):
        res.metrics["by_label"] = {f"{r['model']}/{r['label']}": {
            k: r.get(k) for k in ("n", "L_mean", "L_mean_lo", "L_mean_hi", "diversity_de2000",
                                  "diversity_de2000_lo", "diversity_de2000_hi") if k in r}
            for r in summary.to_dict("records")}
    return res


# ---------------------------------------------------------------- homogeneity

SPACES = ("clip", "face")


def load_embeddings(root: Path, model: str, space: str) -> tuple[pd.DataFrame, np.ndarray] | None:
    """(index rows with a vector in `space`, the matching float32 rows) or None when absent."""
    base = root / C.embeddings_dir(model)
    index_path, matrix_path = base / "index.parquet", base / f"{space}.npy"
    if not (index_path.exists() and matrix_path.exists()):
        return None
    index = pd.read_parquet(index_path)
    matrix = np.load(matrix_path, mmap_mode="r")
    rows = index[index[f"{space}_row"] >= 0]
    return rows.reset_index(drop=True), np.asarray(matrix[rows[f"{space}_row"].to_numpy()])


def _embedding_meta(inputs: Inputs, index: pd.DataFrame, model: str) -> pd.DataFrame:
    meta = index[["image_id"]].assign(model=model)
    lab = inputs.labels[["image_id", "prompt_id", "label"]] if not inputs.labels.empty else pd.DataFrame(
        columns=["image_id", "prompt_id", "label"])
    meta = meta.merge(lab.drop_duplicates("image_id"), on="image_id", how="left")
    if meta["prompt_id"].isna().any() and not inputs.manifests.empty:
        pid = inputs.manifests.drop_duplicates("image_id").set_index("image_id")["prompt_id"]
        meta["prompt_id"] = meta["prompt_id"].fillna(meta["image_id"].map(pid))
    meta["race"] = meta["label"].where(meta["label"].isin(GROUPS))  # abstentions are no group
    if not inputs.faces.empty and "L_bin" in inputs.faces:
        meta = meta.merge(inputs.faces[["image_id", "L_bin"]].drop_duplicates("image_id"), on="image_id", how="left")
    else:
        meta["L_bin"] = None
    return meta


def plot_gap_heatmap(table: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt
    import seaborn as sns

    spaces = [s for s in SPACES if s in set(table["space"])]
    grids = []
    for space in spaces:
        grid = table[table["space"] == space].pivot(index="group", columns="model", values="gap")
        grids.append(grid.reindex([g for g in GROUPS if g in grid.index]))
    n_rows = max((len(g) for g in grids), default=1)
    n_cols = max((g.shape[1] for g in grids), default=1)
    # room per cell: 0.45 in per row (horizontal labels never touch), 1.1 in per model column
    fig, axes = plt.subplots(1, len(spaces), figsize=(max(4.0, 1.1 * n_cols + 2.6) * len(spaces), 1.6 + 0.45 * n_rows),
                             squeeze=False)
    for ax, space, grid in zip(axes[0], spaces, grids):
        sns.heatmap(grid, annot=True, fmt=".3f", cmap="RdBu_r", center=0, ax=ax, cbar_kws={"label": "gap"},
                    annot_kws={"fontsize": 8})
        ax.set(title=f"{space} embeddings", xlabel="model", ylabel="classified race")
        ax.set_yticks(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()], rotation=0)
        ax.set_xticks(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()], rotation=25, ha="right")
    fig.tight_layout()
    return Figure(fig, "Homogeneity gap by race and model",
                  "Mean intra-group minus mean inter-group cosine similarity (positive = more self-similar); "
                  "CIs and permutation p-values in the table.")


def plot_similarity_by_bin(table: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    spaces = [s for s in SPACES if s in set(table["space"])]
    fig, axes = plt.subplots(1, len(spaces), figsize=(4.2 * len(spaces), 3.4), squeeze=False, sharey=True)
    for ax, space in zip(axes[0], spaces):
        sub = table[table["space"] == space]
        for model, s in sub.groupby("model"):
            s = s.set_index("group").reindex(list(L_BINS))
            ax.plot(list(L_BINS), s["intra"], marker="o", label=model)
        ax.set(title=f"{space} embeddings", xlabel="L* bin", ylabel="mean intra-bin cosine similarity")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Similarity by skin-lightness bin",
                  "Mean pairwise cosine similarity of images within each L* bin (small bins flagged in the table).")


def homogeneity(inputs: Inputs, boot: Boot, n_permutations: int = 1000, min_group_size: int = 30) -> Result:
    """Gap tables by race and by L* bin, per model and embedding space (biasaudit.stats.homogeneity)."""
    res = Result("homogeneity", "Homogeneity gap (CLIP and face embeddings)")
    race, bins = [], []
    for model in inputs.models:
        for space in SPACES:
            loaded = load_embeddings(inputs.root, model, space)
            if loaded is None or len(loaded[0]) == 0:
                continue
            index, X = loaded
            meta = _embedding_meta(inputs, index, model)
            kw = dict(within="model", cluster="prompt_id", n_boot=boot.n_boot, n_perm=n_permutations,
                      seed=derive_seed(boot.seed, "homogeneity", model, space), small_group=min_group_size,
                      method=boot.method, design=boot.permutation_design, p_adjust_method=None, level=boot.level)
            meta = meta.assign(prompt_id=meta["prompt_id"].fillna("?"))
            for by, sink in (("race", race), ("L_bin", bins)):
                if meta[by].notna().any():
                    sink.append(homogeneity_table(X, meta, by=by, **kw).assign(space=space))
    if not race and not bins:
        res.status, res.reason = NO_DATA, ("no embeddings under data/t2i/embeddings/ for any model"
                                           if inputs.models else "no models found")
        return res
    adjust = (lambda t: add_p_adjusted(t, boot.p_adjust)) if n_permutations > 0 else (lambda t: t)
    if n_permutations > 0:
        res.notes.append(f"permutation test: labels permuted {boot.permutation_design} prompts "
                         + ("(does the label add similarity beyond what the prompt explains?)"
                            if boot.permutation_design == "within" else "(are embeddings independent of the label?)")
                         + f"; p_adjusted: {boot.p_adjust} over every group, space and model of a table")
    if race:
        t = adjust(pd.concat(race, ignore_index=True))
        res.tables["homogeneity_by_race"] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["homogeneity_gap_heatmap"] = plot_gap_heatmap(t)
        res.metrics["gap"] = {f"{r.model}/{r.space}/{r.group}": {
            "gap": r.gap, "n": r.n, "low": getattr(r, "gap_lo", None), "high": getattr(r, "gap_hi", None),
            "p": getattr(r, "p_value", None), "p_adjusted": getattr(r, "p_adjusted", None)} for r in t.itertuples()}
        baseline_path = inputs.root / C.BASELINE_DIR / "gaps.parquet"
        baseline = pd.read_parquet(baseline_path) if baseline_path.exists() else pd.DataFrame()
        if baseline.empty:
            res.notes.append("no real-portrait baseline (baseline.source: none or no portraits embedded)")
        else:
            from biasaudit.stats.homogeneity import relative_gaps

            rel = relative_gaps(t[["model", "space", "group", "gap", "n"]], baseline)
            res.tables["homogeneity_vs_baseline"] = rel
            if bool(baseline.get("stand_in", pd.Series([False])).any()):
                res.notes.append("the real-portrait baseline is a STAND-IN (packaged photos dealt into group "
                                 "folders): its gaps and the differences mean nothing")
    else:
        res.notes.append("no labelled image has an embedding: race gaps not computed")
    if bins:
        t = adjust(pd.concat(bins, ignore_index=True))
        res.tables["homogeneity_by_L_bin"] = t[["model", "space", *[c for c in t.columns if c not in ("model", "space")]]]
        res.figures["similarity_by_L_bin"] = plot_similarity_by_bin(t)
    return res


# ---------------------------------------------------------------- reliability

def reliability(inputs: Inputs) -> Result:
    res = Result("reliability", "Classifier reliability")
    rel = inputs.root / C.RELIABILITY_DIR
    if not rel.is_dir() or not any(rel.iterdir()):
        res.status, res.reason = NO_DATA, "no reliability outputs (reports/t2i/reliability/ missing or empty)"
        return res
    summary_path = rel / "summary.json"
    if summary_path.exists():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError as exc:
            summary = {}
            res.notes.append(f"summary.json unreadable: {exc}")
        flat = pd.json_normalize(summary, sep=".").to_dict("records")
        res.metrics = {k: v for k, v in (flat[0] if flat else {}).items() if isinstance(v, (int, float))}
        if summary.get("status") not in (None, "ok"):
            res.status, res.reason = NO_DATA, str(summary.get("reason") or summary.get("status"))
    res.notes.append("tables: " + ", ".join(sorted(p.name for p in rel.glob("*.csv"))))
    return res


CONFUSION_FILES = ("confusion_matrix.csv", "confusion.csv")


def confusion_pairs(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(human, classifier) label pairs from a confusion-matrix CSV (rows human, columns classifier,
    first column the human label): each cell's count becomes that many pairs."""
    cm = pd.read_csv(path)
    cm = cm.set_index(cm.columns[0])
    true, pred = [], []
    for t, row in cm.iterrows():
        for c, k in row.items():
            if str(t) in GROUPS and str(c) in GROUPS and int(k) > 0:
                true += [str(t)] * int(k)
                pred += [str(c)] * int(k)
    return np.array(true, dtype=str), np.array(pred, dtype=str)


def annotated_images(rel: Path, reference: str = "consensus") -> tuple[np.ndarray, str, str]:
    """(per-image confusion counts E (images × K·K), source file, note) from the reliability stage:
    ratings.csv (one row per annotated image: every rater and the classifier; the human labels M is
    estimated against by `reference`, stats.correction.reference_labels) — or, from an older run, a
    confusion-matrix CSV whose pairs then stand in for images."""
    path = rel / "ratings.csv"
    if path.exists():
        r = pd.read_csv(path, dtype=str, keep_default_na=False)
        raters = [c for c in r.columns if c not in ("image_id", "classifier", "raters_source", "")]
        humans = reference_labels([[v for v in row if v in GROUPS] for row in r[raters].to_numpy(object)], reference)
        used = sum(1 for h in humans if h)
        return image_confusions(humans, list(r.get("classifier", [])), GROUPS), path.name, \
            (f"bootstrap resamples the {len(r)} annotated images (all their labels together); M against "
             f"{reference} labels ({used} of {len(r)} images)")
    path = next((rel / n for n in CONFUSION_FILES if (rel / n).exists()), None)
    if path is None:
        return np.zeros((0, G * G)), "", ""
    true, pred = confusion_pairs(path)
    return image_confusions([[t] for t in true], list(pred), GROUPS), path.name, (
        "no ratings.csv: each (human, classifier) pair of the confusion matrix is resampled as if it were an image")


def corrected_tvd(inputs: Inputs, boot: Boot, method: str | None = None) -> Result:
    """Mean TVD raw and corrected for classifier error (biasaudit.stats.correction), per model ×
    category, with one bootstrap over prompts and annotated images. This is the only place the
    correction is computed; `method` defaults to the reliability stage's correction_method.
    `tvd_debiased*` is corrected for classifier error and finite n together, with the honest interval
    (stats.correction.debiased_tvd): the estimate to compare with the true TVD at small n."""
    res = Result("corrected_tvd", "TVD corrected for classifier error")
    rel = inputs.root / C.RELIABILITY_DIR
    recorded = {}
    summary_path = rel / "summary.json"
    if summary_path.exists():
        try:
            recorded = json.loads(summary_path.read_text()).get("correction") or {}
        except json.JSONDecodeError:
            recorded = {}
    E, source, note = annotated_images(rel, recorded.get("confusion_reference") or "consensus")
    if not source:
        res.status, res.reason = NO_DATA, ("no ratings.csv or confusion matrix in reports/t2i/reliability/ "
                                           f"({' or '.join(CONFUSION_FILES)})")
        return res
    if inputs.labels.empty or inputs.prompts.empty:
        res.status, res.reason = NO_DATA, "no labels"
        return res
    if E.sum() == 0:
        res.status, res.reason = NO_DATA, f"{source} has no (human, classifier) labels of the five groups"
        return res
    recorded = recorded.get("correction_method")
    method = method or recorded or "lsq"
    pp = per_prompt_table(inputs.labels, inputs.prompts)
    pp = pp[pp["n"] > 0]
    M = matrix_from_counts(E.sum(axis=0), G)
    counts_all = pp[[f"n_{g}" for g in GROUPS]].to_numpy(float)
    bench_all = pp[[f"bench_{g}" for g in GROUPS]].to_numpy(float)
    shares, tvd_corr, why = corrected_per_prompt(counts_all, bench_all, M, method)
    per = pp[["model", "category", "prompt_id", "n", "tvd"]].rename(columns={"tvd": "tvd_raw"}).assign(
        tvd_classifier_corrected=tvd_corr)
    for j, g in enumerate(GROUPS):
        per[f"raw_{g}"] = pp[f"share_{g}"].to_numpy()
        per[f"corrected_{g}"] = shares[:, j]
    per["correction_method"] = method
    rows, dev_rows = [], []
    for model, cat, sub in _by_category(pp):
        counts = sub[[f"n_{g}" for g in GROUPS]].to_numpy(float)
        bench = sub[[f"bench_{g}" for g in GROUPS]].to_numpy(float)
        raw, corr, info = classifier_corrected_tvd(
            counts, bench, E, GROUPS, method=method, n_boot=min(boot.n_boot, 1000), level=boot.level,
            seed=derive_seed(boot.seed, "corrected", model, cat), boot_method=boot.method)
        deb, dinfo = debiased_tvd(counts, bench, E, GROUPS, n_boot=min(boot.n_boot, 1000), level=boot.level,
                                  seed=derive_seed(boot.seed, "debiased", model, cat))
        for g, d in zip(GROUPS, corrected_deviation(counts, bench, E, GROUPS, n_boot=min(boot.n_boot, 1000),
                                                     level=boot.level, seed=derive_seed(boot.seed, "dev", model, cat))):
            dev_rows.append({"model": model, "category": cat, "race": g, "mean_deviation_corrected": d.estimate,
                             "mean_deviation_corrected_low": d.low, "mean_deviation_corrected_high": d.high,
                             "reason": d.reason})
        n_p = counts.sum(axis=1, keepdims=True)
        pooled, _ = debiased_tvd(counts.sum(axis=0, keepdims=True), (n_p * bench).sum(axis=0, keepdims=True) / n_p.sum(),
                                 E, GROUPS, n_boot=min(boot.n_boot, 1000), level=boot.level,
                                 seed=derive_seed(boot.seed, "debiased-pooled", model, cat))
        rows.append({"model": model, "category": cat, "n_prompts": len(sub), "mean_tvd_raw": raw.estimate,
                     "mean_tvd_raw_low": raw.low, "mean_tvd_raw_high": raw.high,
                     "tvd_classifier_corrected": corr.estimate, "tvd_classifier_corrected_low": corr.low,
                     "tvd_classifier_corrected_high": corr.high, "correction_method": method,
                     "tvd_debiased": deb.estimate, "tvd_debiased_low": deb.low, "tvd_debiased_high": deb.high,
                     "tvd_linear_plug_in": dinfo["plug_in"], "bias_bound": dinfo["bias_bound"],
                     "pooled_tvd_debiased": pooled.estimate, "pooled_tvd_debiased_low": pooled.low,
                     "pooled_tvd_debiased_high": pooled.high,
                     "condition_number": info["condition_number"], "identifiable": info["identifiable"],
                     "n_annotated_images": info["n_annotated_images"],
                     "reason": "; ".join(dict.fromkeys(r for r in (corr.reason, deb.reason) if r))})
    summary = pd.DataFrame(rows)
    res.tables = {"tvd_corrected_summary": summary, "tvd_corrected_per_prompt": per,
                  "deviation_corrected": pd.DataFrame(dev_rows)}
    res.notes.append(f"{source}: {note}; correction_method {method}"
                     + (" (recorded by the reliability stage)" if recorded == method else ""))
    if why:
        res.notes.append(why)
    res.metrics = {f"{r.model}/{r.category}": {"raw": r.mean_tvd_raw, "classifier_corrected": r.tvd_classifier_corrected,
                                               "low": r.tvd_classifier_corrected_low,
                                               "high": r.tvd_classifier_corrected_high,
                                               "debiased": r.tvd_debiased, "debiased_low": r.tvd_debiased_low,
                                               "debiased_high": r.tvd_debiased_high,
                                               "identifiable": bool(r.identifiable)}
                   for r in summary.itertuples()}
    return res


# ---------------------------------------------------------------- calibration

CALIBRATION_FILES = ("benchmarks/results/calibration.csv", "reports/calibration/calibration.csv")  # committed copy first


def calibration(inputs: Inputs) -> Result:
    """The calibration table of benchmarks/calibration.py: how far each interval and test can be
    trusted (coverage of the nominal 95%, rejection at 0.05 under a true null, by simulation)."""
    res = Result("calibration", "Calibration: every interval and test checked by simulation with known truth")
    path = next((inputs.root / f for f in CALIBRATION_FILES if (inputs.root / f).exists()), None)
    if path is None:
        res.status, res.reason = NO_DATA, f"no calibration table ({' or '.join(CALIBRATION_FILES)}): run benchmarks/calibration.py"
        return res
    table = pd.read_csv(path)
    res.tables = {"calibration": table}
    res.notes.append(f"from {path.relative_to(inputs.root).as_posix()}: coverage ok within [0.93, 0.97], rejection within "
                     "[0.03, 0.07]; other rows are labelled (small scale, conservative, known limitation)")
    res.metrics = {f"{r.method} · {r.setting}": {"observed": r.observed, "nominal": r.nominal, "mc_se": r.mc_se,
                                                 "flag": r.flag} for r in table.itertuples()}
    return res


# ---------------------------------------------------------------- counts for provenance

def stage_counts(inputs: Inputs) -> pd.DataFrame:
    """Per stage and model: rows, and counts by status (ok / refused / failed / …), abstentions, stand-in."""
    rows = []
    for stage, frame in (("generate", inputs.manifests), ("classify", inputs.labels), ("faces", inputs.faces)):
        if frame.empty:
            rows.append({"stage": stage, "model": "", "rows": 0, "note": inputs.notes.get(
                {"generate": "images", "classify": "labels"}.get(stage, stage), "")})
            continue
        for model, sub in frame.groupby("model", sort=True):
            row = {"stage": stage, "model": model, "rows": len(sub)}
            if "status" in sub:
                row.update({f"status_{k}": int(v) for k, v in sub["status"].value_counts().items()})
            if stage == "classify":
                row["abstentions"] = int((~sub["label"].isin(GROUPS)).sum())
            if stage == "faces" and "n_faces" in sub:
                row["no_face"] = int((sub["n_faces"].fillna(0) == 0).sum())
            if "stand_in" in sub:
                row["stand_in"] = bool(sub["stand_in"].astype(bool).any())
            rows.append(row)
    out = pd.DataFrame(rows)
    status_cols = sorted(c for c in out.columns if c.startswith("status_"))
    out[status_cols] = out[status_cols].fillna(0).astype(int)
    return out


def model_provenance(manifests: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ("model", "backend", "model_id", "model_revision", "stand_in") if c in manifests]
    if manifests.empty or "model" not in cols:
        return pd.DataFrame(columns=["model", "backend", "model_id", "model_revision", "stand_in"])
    return manifests[cols].astype(str).drop_duplicates().sort_values("model", ignore_index=True)
