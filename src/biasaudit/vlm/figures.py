"""Method B's figures: win-rate heatmaps and bar charts (race win rates, Δg, salary gaps by occupation)."""

from __future__ import annotations

import re

import pandas as pd


def heatmap_figure(rate: pd.DataFrame, n: pd.DataFrame, title: str):
    """Win-rate heatmap: cells with no comparison left blank, each other cell annotated with its rate (dark
    text on light cells, white on dark ones). Drawn with matplotlib alone: seaborn's heatmap renders the whole
    figure once more to test whether tick labels overlap, which 10 short group codes never do."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = rate.to_numpy(float)
    data = np.ma.masked_where((n.to_numpy() == 0) | ~np.isfinite(values), values)
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    mesh = ax.pcolormesh(data, cmap="RdBu_r", vmin=0, vmax=1, linewidths=0.3, edgecolor="white")
    ax.set(xlim=(0, values.shape[1]), ylim=(0, values.shape[0]))
    ax.invert_yaxis()
    ax.spines[:].set_visible(False)
    fig.colorbar(mesh, ax=ax, label="win rate (row chosen over column)").outline.set_linewidth(0)
    ax.set_xticks(np.arange(values.shape[1]) + 0.5, rate.columns)
    ax.set_yticks(np.arange(values.shape[0]) + 0.5, rate.index, rotation="vertical", va="center")
    from seaborn.utils import relative_luminance

    light = np.reshape(relative_luminance(mesh.cmap(mesh.norm(values)).reshape(-1, 4)), values.shape) > 0.408
    for i, j in zip(*np.nonzero(~np.ma.getmaskarray(data))):
        ax.text(j + 0.5, i + 0.5, f"{values[i, j]:.2f}", color=".15" if light[i, j] else "w", ha="center",
                va="center", fontsize=7)
    ax.set_xlabel("column group")
    ax.set_ylabel("row group")
    ax.set_title(title, fontsize=10)
    return fig


def bar_figure(df: pd.DataFrame, x: str, y: str, hue: str | None, title: str, ylabel: str,
               ref_line: float | None = None):
    """Bars of `y` per category of `x` (in order of appearance), one colour per `hue` level, side by side where
    a category has more than one; the look of seaborn's barplot (colours of the cycle at saturation 0.75,
    legend titled by `hue`) with matplotlib alone, at a third of its cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Rectangle
    from seaborn.utils import desaturate  # seaborn's bar colours; its barplot machinery is what costs

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    values = pd.to_numeric(df[y], errors="coerce") if y in df else pd.Series(dtype=float)
    if df.empty or values.isna().all():
        ax.text(0.5, 0.5, "no data: no retained answers", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    else:
        data = df.assign(**{y: values}).dropna(subset=[x] + ([hue] if hue else []))
        cats = list(dict.fromkeys(data[x]))
        levels = list(dict.fromkeys(data[hue])) if hue else [None]
        dodge = hue is not None and len(data[[x, hue]].drop_duplicates()) > len(cats)
        width = 0.8 / len(levels) if dodge else 0.8
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        handles = []
        for k, level in enumerate(levels):
            color = desaturate(cycle[k % len(cycle)], 0.75)
            sub = data if level is None else data[data[hue] == level]
            heights = sub.groupby(x, sort=False)[y].mean()
            pos = np.array([cats.index(c) for c in heights.index], float)
            if dodge:
                pos += width * k + width / 2 - 0.4
            ax.bar(pos - width / 2, heights.to_numpy(), width, align="edge", color=color)
            handles.append(Rectangle((0, 0), 0, 0, facecolor=color, label=str(level)))
        if hue is not None:
            ax.legend(handles=handles, title=hue)
        ax.xaxis.grid(False)
        ax.set_xlim(-0.5, len(cats) - 0.5)
        ax.set_xlabel(x)
        # long group names ran together ("LatinoMiddleEasternWhite"): break CamelCase onto two lines
        ax.set_xticks(range(len(cats)), [re.sub(r"(?<=[a-z])(?=[A-Z])", "\n", str(c)) for c in cats], fontsize=9)
        if (values.dropna() == values.dropna().iloc[0]).all():
            ax.text(0.5, 0.9, f"every value is {values.dropna().iloc[0]:g}: no difference between groups",
                    ha="center", va="top", transform=ax.transAxes, fontsize=9,
                    bbox={"facecolor": "white", "edgecolor": "#999"})
    if ref_line is not None:
        ax.axhline(ref_line, color="k", lw=0.8, ls="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return fig
