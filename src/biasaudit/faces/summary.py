"""Re-export of the skin-tone group summaries (the analysis stage looks them up here)."""

from biasaudit.stats.skin_summary import circular_mean_deg, mean_pairwise_de2000, skin_summary

__all__ = ["skin_summary", "mean_pairwise_de2000", "circular_mean_deg"]
