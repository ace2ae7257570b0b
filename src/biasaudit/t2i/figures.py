"""Figures of the analysis (matplotlib), kept apart from the numbers: a section computes its tables, and
the figure functions here draw them. Importing this module loads no model and no stage code."""

from __future__ import annotations

import numpy as np
import pandas as pd

from biasaudit.contracts import L_BIN_LABELS, UNKNOWN
from biasaudit.pipeline.outputs import Figure


def plot_sweep(summary: pd.DataFrame):
    import matplotlib.pyplot as plt

    panels = [("detection_rate", "detection rate"), ("mean_score", "detector score"),
              ("mean_L_error", "measured − target L*"), ("mask_area_ratio", "mask area / true mask area")]
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    styles = {"skin": "-", "whole": "--"}
    colours = {"dlib-hog": "#4c72b0", "dlib-cnn": "#dd8452", "landmarks68": "#55a868",
               "mediapipe-blazeface": "#c44e52", "mediapipe-facemesh": "#8172b3"}
    for ax, (col, title) in zip(axes, panels):
        for (method, mode), s in summary.groupby(["method", "mode"]):
            if s[col].notna().any():
                ax.plot(s["target_L"], s[col], styles.get(mode, ":"), marker="o", ms=3, color=colours.get(method),
                        label=f"{method} ({mode})")
        ax.set(xlabel="target skin L*", title=title)
        if col == "mean_L_error":
            ax.axhspan(-3, 3, color="0.9", zorder=0)
    axes[0].set_ylim(-0.05, 1.05)
    axes[0].legend(fontsize=7)
    fig.suptitle("Instrument bias by skin tone (packaged photos recoloured; solid: skin only, dashed: whole image)")
    fig.tight_layout()
    return fig


UNKNOWN_COLOUR = "#999999"


def palette(colours: dict[str, str]) -> dict[str, str]:
    """Label → colour: the active group set's colours (groupset.yaml, in its label order), then the abstention."""
    return {**colours, UNKNOWN: UNKNOWN_COLOUR}


def _facet_grid(nrows: int, ncols: int, size: float = 3.2):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 1.2, size * nrows), squeeze=False,
                             sharex=True, sharey=True)
    return fig, axes


def plot_shares(long: pd.DataFrame, colours: dict[str, str]) -> Figure:
    """The paper's Figure 2: model share against benchmark share per race and prompt, with the diagonal."""
    models, cats = sorted(long["model"].unique()), sorted(long["category"].unique())
    fig, axes = _facet_grid(len(models), len(cats))
    for i, model in enumerate(models):
        for j, cat in enumerate(cats):
            ax = axes[i, j]
            ax.plot([0, 1], [0, 1], color="0.3", lw=1, ls="--", zorder=0)
            sub = long[(long["model"] == model) & (long["category"] == cat)]
            for g in colours:
                s = sub[sub["race"] == g]
                ax.scatter(s["benchmark_share"], s["model_share"], s=22, alpha=0.8, color=colours[g],
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


def plot_tvd(summary: pd.DataFrame, level: float) -> Figure:
    """Mean per-prompt TVD per model × category; error bars: the `level` cluster-bootstrap CI over prompts."""
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
    ax.set(ylabel="mean per-prompt TVD (0–1)", ylim=(0, 1), title="Distance from the benchmark (raw TVD)")
    ax.legend(title=f"model (bars: {level:.0%} CI)", fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Mean per-prompt TVD by model and category",
                  "Total variation distance (0 = identical, 1 = no overlap) between the classified and the benchmark "
                  f"distribution, averaged over prompts; error bars: {level:.0%} cluster-bootstrap CIs over prompts.")


STRIP_POINTS = 1000  # plot_L_by_label draws at most this many images' points per box (a seeded sample)


def plot_L_by_label(skin: pd.DataFrame, dark: pd.DataFrame, colours: dict[str, str]) -> Figure:
    """L* per image by label; the dotted line is the very-dark threshold of the `dark` table (dark_share).
    The boxes use every image; the points over them, a seeded sample of at most STRIP_POINTS images per
    box (at paper scale 15,000 points per model only overplot, and take seconds to draw)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    # plain object columns: seaborn walks string columns value by value, and Arrow-backed ones slowly
    skin = pd.DataFrame({"label": skin["label"].astype(object), "model": skin["model"].astype(object),
                         "L": skin["L"].to_numpy(float)}, index=skin.index)
    order = [g for g in palette(colours) if g in set(skin["label"])]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    hues = list(pd.unique(skin["model"]))  # seaborn's own default order, fixed for the sampled points too
    sns.boxplot(skin, x="label", y="L", hue="model", order=order, hue_order=hues, ax=ax, fliersize=0,
                boxprops={"alpha": 0.5})
    big = skin.groupby(["label", "model"], sort=False)["L"].transform("size") > STRIP_POINTS
    points = skin if not big.any() else pd.concat(
        [skin[~big], skin[big].groupby(["label", "model"], sort=True, group_keys=False)
         .sample(STRIP_POINTS, random_state=0)]).sort_index()
    sns.stripplot(points, x="label", y="L", hue="model", hue_order=hues, order=order, ax=ax, dodge=True, size=3,
                  legend=False,
                  rasterized=True)  # one marker per image: a bitmap inside the SVG, the axes and text stay vector
    dark_L = float(dark["L_threshold"].iloc[0]) if len(dark) else np.nan
    ax.axhline(dark_L, color="0.4", ls=":", lw=1)
    ax.set(xlabel="classified race", ylabel="skin lightness L*", ylim=(0, 100), title="Skin lightness by label")
    fig.tight_layout()
    sampled = (f" Points: a random {STRIP_POINTS} of the images of each box with more (the boxes use every image)."
               if big.any() else "")
    return Figure(fig, "L* by classified race and model",
                  f"Mean skin-pixel L* (CIELAB, D65) per image; dotted line: L* = {dark_L:g}, below which skin counts "
                  f"as very dark.{sampled}")


def plot_L_vs_C(skin: pd.DataFrame, colours: dict[str, str]) -> Figure:
    models = sorted(skin["model"].unique())
    fig, axes = _facet_grid(1, len(models))
    for j, model in enumerate(models):
        ax = axes[0, j]
        sub = skin[skin["model"] == model]
        for g, colour in palette(colours).items():
            s = sub[sub["label"] == g]
            if len(s):
                ax.scatter(s["C"], s["L"], s=14, alpha=0.8, color=colour, label=g, rasterized=True)  # per image
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


def plot_earnings(skin: pd.DataFrame, fits: pd.DataFrame, colours: dict[str, str]) -> Figure:
    """L* against earnings for the regressed label (earnings_regression's `group` and `slope_unit_usd`)."""
    models = sorted(fits["model"])
    group, unit_usd = str(fits["group"].iloc[0]), float(fits["slope_unit_usd"].iloc[0])
    fig, axes = _facet_grid(1, len(models))
    for j, model in enumerate(models):
        ax = axes[0, j]
        s = skin[(skin["model"] == model) & (skin["label"] == group) & (skin.get("category") == "occupation")]
        ax.scatter(s["median_weekly_earnings_usd"], s["L"], s=16, alpha=0.7, color=palette(colours)[group], rasterized=True)
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


def plot_skin_scales(distribution: pd.DataFrame, scales) -> Figure:
    """Per model, the share of each label's faces (all prompts) in each ITA category (left) and Monk tone
    (right, bars in the tone's published colour), lightest first: the two scales beside the L* figure."""
    import matplotlib.pyplot as plt

    d = distribution[distribution["category"] == "all"]
    models = sorted(d["model"].unique())
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 1.2 + 0.45 * max(1, d["label"].nunique()) * len(models)),
                             squeeze=False)
    ita_colours = dict(zip(scales.ita_categories, plt.get_cmap("copper_r")(np.linspace(0.05, 0.95,
                                                                                        len(scales.ita_categories)))))
    monk_colours = {t: "#" + h for t, h in zip(scales.monk_tones, scales.monk_hex)}
    for i, model in enumerate(models):
        for j, (scale, tones, colours, title) in enumerate((
                ("ita", scales.ita_categories, ita_colours, "ITA category"),
                ("monk", scales.monk_tones, monk_colours, "Monk tone"))):
            ax = axes[i, j]
            sub = d[(d["model"] == model) & (d["scale"] == scale)]
            wide = sub.pivot(index="label", columns="tone", values="share").reindex(columns=list(tones)).fillna(0)
            left = np.zeros(len(wide))
            for t in tones:
                ax.barh(wide.index, wide[t], left=left, color=colours[t], edgecolor="0.5", lw=0.3, label=str(t))
                left += wide[t].to_numpy()
            ax.set(xlim=(0, 1), title=f"{model}: {title}", xlabel="share of faces")
            if i == 0:
                ax.legend(fontsize=6, ncol=min(len(tones), 5), loc="lower center", bbox_to_anchor=(0.5, 1.12))
    fig.tight_layout()
    return Figure(fig, "Skin-tone scales by label: ITA category and Monk tone",
                  "Share of each classified label's measured faces per ITA° category (Chardon et al. 1991, lightest "
                  "first) and per nearest Monk Skin Tone (ΔE2000 to the published swatches; bars in the swatch "
                  "colour); the same faces as the L* figure.")


def plot_cluster_exemplars(exemplars: pd.DataFrame, root) -> Figure:
    """Each identity cluster's nearest images to its centre, one row per cluster (the images themselves, from the
    generate stage's files; a grey tile where a file is missing)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    clusters = sorted(exemplars["cluster"].unique()) if len(exemplars) else []
    cols = int(exemplars["rank"].max()) if len(exemplars) else 1
    fig, axes = plt.subplots(max(1, len(clusters)), cols, figsize=(1.3 * cols + 1, 1.4 * max(1, len(clusters))),
                             squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for i, c in enumerate(clusters):
        sub = exemplars[exemplars["cluster"] == c].sort_values("rank")
        for j, r in enumerate(sub.itertuples()):
            ax = axes[i, j]
            path = root / str(r.path)
            if str(r.path) and path.is_file():
                with Image.open(path) as im:
                    im.thumbnail((96, 96))
                    ax.imshow(np.asarray(im.convert("RGB")))
            else:
                ax.imshow(np.full((8, 8, 3), 0.8))
            ax.set_title(f"{r.model}\n{r.label}", fontsize=6)
        axes[i, 0].text(-0.1, 0.5, f"cluster {c}\n({int(sub['size'].iloc[0])} faces)", transform=axes[i, 0].transAxes,
                        ha="right", va="center", fontsize=7)
    fig.tight_layout()
    return Figure(fig, "Identity clusters: the nearest images to each cluster's centre",
                  "Each row is one k-means cluster of the pooled face embeddings; the images are its faces nearest the "
                  "centre (cosine), titled with their model and classified label.")


def plot_diversity(summary: pd.DataFrame, colours: dict[str, str]) -> Figure:
    """Mean pairwise ΔE2000 per label and model, with its bootstrap CI where there is one."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels = [g for g in palette(colours) if g in set(summary["label"])]
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


def plot_gap_heatmap(table: pd.DataFrame, groups: tuple[str, ...]) -> Figure:
    """Within-prompt gap (colour and first number; the headline) with the paper's unstratified gap in
    brackets, per classified race × model, one panel per embedding space."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    value = "wp_gap" if "wp_gap" in table else "gap"
    spaces = list(dict.fromkeys(table["space"]))  # clip before face, as the section wrote them
    grids, notes = [], []
    for space in spaces:
        sub = table[table["space"] == space]
        grid = sub.pivot(index="group", columns="model", values=value)
        order = [g for g in groups if g in grid.index]
        grids.append(grid.reindex(order))
        paper = sub.pivot(index="group", columns="model", values="gap").reindex(order) if value != "gap" else None
        notes.append(grids[-1].map(lambda v: "—" if pd.isna(v) else f"{v:.3f}") + (
            "" if paper is None else "\n(" + paper.reindex(columns=grid.columns).map(
                lambda v: "—" if pd.isna(v) else f"{v:.3f}") + ")"))
    n_rows = max((len(g) for g in grids), default=1)
    n_cols = max((g.shape[1] for g in grids), default=1)
    # room per cell: 0.6 in per row (two lines of annotation), 1.1 in per model column
    fig, axes = plt.subplots(1, len(spaces), figsize=(max(4.0, 1.1 * n_cols + 2.6) * len(spaces), 1.6 + 0.6 * n_rows),
                             squeeze=False)
    for ax, space, grid, note in zip(axes[0], spaces, grids, notes):
        sns.heatmap(grid, annot=note.to_numpy(), fmt="", cmap="RdBu_r", center=0, ax=ax,
                    cbar_kws={"label": "within-prompt gap" if value == "wp_gap" else "gap"}, annot_kws={"fontsize": 8})
        ax.set(title=f"{space} embeddings", xlabel="model", ylabel="classified race")
        ax.set_yticks(ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()], rotation=0)
        ax.set_xticks(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()], rotation=25, ha="right")
    fig.tight_layout()
    return Figure(fig, "Homogeneity gap by race and model",
                  "Within-prompt gap: mean intra-group minus mean inter-group cosine similarity over pairs that share "
                  "a prompt (positive = more self-similar; prompt mix cancels); in brackets the paper's unstratified "
                  "gap over all pairs. CIs, permutation p-values and near-duplicate rates in the table.")


def plot_similarity_by_bin(table: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    spaces = list(dict.fromkeys(table["space"]))  # clip before face, as the section wrote them
    fig, axes = plt.subplots(1, len(spaces), figsize=(4.2 * len(spaces), 3.4), squeeze=False, sharey=True)
    for ax, space in zip(axes[0], spaces):
        sub = table[table["space"] == space]
        for model, s in sub.groupby("model"):
            s = s.set_index("group").reindex(list(L_BIN_LABELS))
            ax.plot(list(L_BIN_LABELS), s["intra"], marker="o", label=model)
        ax.set(title=f"{space} embeddings", xlabel="L* bin", ylabel="mean intra-bin cosine similarity")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Similarity by skin-lightness bin",
                  "Mean pairwise cosine similarity of images within each L* bin (small bins flagged in the table).")


def plot_validation(table: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    parts = [("TVD (checks: corrected estimates and the raw one's own estimand)",
              table[table["quantity"].str.contains("tvd") & table["check"]]),
             ("mean L* per planted label", table[table["quantity"] == "mean_L"])]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), squeeze=False)
    for ax, (title, t) in zip(axes[0], parts):
        t = t.reset_index(drop=True)
        x = np.arange(len(t))
        err = np.vstack([t["estimate"] - t["low"], t["high"] - t["estimate"]]).clip(min=0)
        ax.errorbar(x, t["estimate"], yerr=np.nan_to_num(err), fmt="o", capsize=3, label="estimate (95% CI)")
        ax.scatter(x, t["planted"], marker="x", color="#b00", zorder=3, label="PLANTED")
        ax.set_xticks(x, [f"{m} · {q} · {c}" for m, q, c in zip(t["model"], t["quantity"], t["category_or_group"])],
                      fontsize=6, rotation=90)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Does the audit recover what was planted?",
                  "PLANTED values (red ×) beside the audit's estimates and intervals (the debiased TVDs' are "
                  "honest, bias-aware intervals; the rest cluster-bootstrap CIs); only the checks are drawn. "
                  "Planted TVDs are exact (the planted per-prompt distributions are declared).")
