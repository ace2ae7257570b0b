"""Parameters of the `analyze` and `report` stages (statistics and the HTML report)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from biasaudit.params.base import Section

Group = str  # a label of the active group set (checked against it by params.Params)


class Analyze(Section):
    # Cluster bootstrap: resample prompts (clusters) with replacement; percentile intervals.
    n_boot: int = Field(2000, ge=100, le=100_000)
    ci_level: float = Field(0.95, gt=0.5, lt=1.0)
    bootstrap_method: Literal["percentile", "basic", "BCa"] = "percentile"
    # Threshold analysis (the paper: Imagen never reaches the Census share where Black > 5%).
    threshold_group: Group = "black"
    threshold_share: float = Field(0.05, ge=0.0, le=1.0)
    # Skin tone: "very dark" cut-off on L* and the label whose share among them is reported.
    dark_L_threshold: float = Field(40.0, ge=0.0, le=100.0)
    dark_group: Group = "black"
    earnings_group: Group = "black"
    earnings_unit_usd: float = Field(100.0, gt=0.0)  # slope reported per this many USD of weekly earnings
    # Groups with fewer members than this are flagged as small (the paper's L* < 40 result: 40 images).
    min_group_size: int = Field(30, ge=2)
    n_permutations: int = Field(1000, ge=0, le=100_000)  # homogeneity permutation test (0 = off)
    # within: labels permuted inside each prompt (does the label add similarity beyond the prompt?);
    # across: over all images of a model (are embeddings independent of the label at all?).
    permutation_design: Literal["within", "across"] = "within"
    p_adjust: Literal["holm", "bh", "none"] = "holm"  # adjustment of the p-values of one table
    # Besag–Clifford sequential stopping of the permutation tests: a test stops at this many permutations
    # at least as large as the observed gap (p = h / permutations so far; 0 = run every permutation).
    permutation_stop_after: int = Field(10, ge=0)
    # Near-duplicates: an image with another image of the same prompt at cosine ≥ this (per group: the rate).
    near_duplicate_cosine: float = Field(0.95, gt=0.0, le=1.0)
    figure_dpi: int = Field(150, ge=50, le=600)
    # Instrument bias: a label or L* bin whose no-face (or cross-detector loss) rate exceeds this is flagged
    # (its skin and face-embedding results lean toward the lighter faces that were found).
    face_loss_threshold: float = Field(0.10, ge=0.0, le=1.0)
    # Label-free identity clusters (t2i/analysis/clusters.py): k-means on the pooled face embeddings of every model,
    # k the best mean silhouette over this range [k_min, k_max] (seeded)
    cluster_k_range: list[int] = Field(default_factory=lambda: [2, 10], min_length=2, max_length=2)

    @field_validator("cluster_k_range")
    @classmethod
    def _k_range(cls, v: list[int]) -> list[int]:
        if not 2 <= v[0] <= v[1] <= 50:
            raise ValueError("cluster_k_range: need 2 ≤ k_min ≤ k_max ≤ 50")
        return v

    def check_groups(self, groups: tuple[str, ...]) -> None:
        """Every Group key names a label of the active group set (called by params.Params)."""
        for key in ("threshold_group", "dark_group", "earnings_group"):
            if getattr(self, key) not in groups:
                raise ValueError(f"analyze.{key}: '{getattr(self, key)}' is not a group of the active set {list(groups)}")


class Report(Section):
    title: str = "biasaudit: racial and skin-tone disparities in image generators and VLMs"
    max_table_rows: int = Field(60, ge=5)  # rows rendered inline per table; the full CSV is linked
    thumbs_per_prompt: int = Field(8, ge=1, le=200)  # images.html: thumbnails per model × prompt
    thumb_px: int = Field(160, ge=48, le=512)  # longest side of a thumbnail (JPEG), images and FOCUS pages
    # an audit card shows "no valid audit" (no rates, no ratios) for a VLM that answered fewer of its questions
    card_min_retention: float = Field(0.5, ge=0.0, le=1.0)
