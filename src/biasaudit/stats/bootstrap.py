"""Compatibility names for the resampling engine (biasaudit.stats.resample holds the code)."""

from biasaudit.stats.resample import Interval, Statistic, cluster_bootstrap, ratio

__all__ = ["Interval", "Statistic", "cluster_bootstrap", "ratio"]
