"""Figures of the analysis (matplotlib), kept apart from the numbers: a section computes its tables, and
the figure functions here draw them. Importing this module loads no model and no stage code."""

from __future__ import annotations

import pandas as pd


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
