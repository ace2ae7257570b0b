"""Statistics: TVD and its corrections, resampling, homogeneity, regression."""
