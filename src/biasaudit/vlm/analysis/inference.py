"""The tests the sections share: the paired sign-flip test over source photos, the labels of p-values and
intervals that cannot hold their level (underpowered), and the adjustment of a table's p-values."""

from __future__ import annotations

import numpy as np
import pandas as pd


def sign_flip(diffs: np.ndarray, n_permutations: int, seed: int) -> tuple[float, float, str]:
    """Paired sign-flip permutation test over source photos (biasaudit.stats.resample.sign_flip_pvalue)."""
    from biasaudit.stats.resample import sign_flip_pvalue

    mean, p, reason = sign_flip_pvalue(diffs, n_permutations, seed)
    if reason.startswith("one unit"):
        reason = "one source photo: a sign flip of one difference cannot reject (p = 1)"
    elif reason == "no paired difference":
        reason = "no source photo with both groups"
    return mean, p, reason


def sign_flip_test(diffs: np.ndarray, n_permutations: int, seed: int) -> tuple[float, float]:
    """(mean, p) of `sign_flip` (defined for one photo too: p = 1)."""
    return sign_flip(diffs, n_permutations, seed)[:2]


def label(df: pd.DataFrame, bad: pd.Series, columns: list[str], why: pd.Series) -> pd.DataFrame:
    """`columns` blanked where `bad`, with `why` put before the row's reason."""
    df = df.copy()
    df.loc[bad, columns] = np.nan
    old = df["reason"].fillna("") if "reason" in df else pd.Series("", index=df.index)
    df["reason"] = np.where(bad, why + np.where(old.eq(""), "", "; " + old), old)
    return df


def underpowered_clusters(table: pd.DataFrame, min_clusters: int) -> pd.DataFrame:
    """OLS rows with fewer than `min_clusters` photos lose their p-values and CIs (the t(G − 1) and wild
    tests do not hold their level there, benchmarks/calibration.py)."""
    return underpowered_intervals(table, table["n_clusters"], min_clusters, ("p_t", "p_wild", "p", "ci_low", "ci_high"))


def underpowered_intervals(table: pd.DataFrame, n_photos: pd.Series | int, min_clusters: int,
                           columns: tuple[str, ...] = ("low", "high")) -> pd.DataFrame:
    """Rows resting on fewer than `min_clusters` source photos lose their interval `columns`: the cluster
    bootstrap and the cluster-robust CIs under-cover there (benchmarks/calibration.py at 6 photos)."""
    photos = pd.Series(np.broadcast_to(np.asarray(n_photos), len(table)), index=table.index)
    bad = (photos < min_clusters) & (photos > 0)
    return label(table, bad, list(columns), "underpowered: " + photos.astype(int).astype(str) +
                 f" source photos < min_clusters {min_clusters}; the interval would under-cover")


def underpowered_sign_flip(table: pd.DataFrame, p: str, alpha: float) -> pd.DataFrame:
    """Sign-flip rows whose smallest attainable p, 2^(1 − n photos), is not below alpha lose column `p`."""
    photos = table["n_photos"]
    bad = (2.0 ** (1 - photos.astype(float)) >= alpha) & (photos > 0)
    return label(table, bad, [p], "underpowered: with " + photos.astype(str) +
                 f" photos the sign-flip test cannot reach p < {alpha:g}")


def adjusted(table: pd.DataFrame, p: str, method: str) -> pd.DataFrame:
    """The table with `p_adjusted` (column `p` adjusted over its rows: holm | bh | none) and the method."""
    from biasaudit.stats.resample import p_adjust

    return table.assign(p_adjusted=p_adjust(table[p].to_numpy(float), method), p_adjust_method=method)
