"""Method B's figures: win-rate heatmaps and bar charts (race win rates, Δg, salary gaps by occupation)."""

from __future__ import annotations

import re

import pandas as pd


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
