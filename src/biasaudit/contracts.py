"""Contracts between stages, stated once: where each stage writes, the columns of the tables other
stages read, the label sets and the L* bins. Producers, consumers and test fixtures import from here.

Paths are relative to the repository root (DVC runs every stage there). The few locations that a
user may move are parameters (`generate.prompts_file`, `generate.images_dir`, `classify.cache_path`,
`reliability.sheets_dir`, `sources.input_dir`, `baseline.portraits_dir`); their defaults are the
constants below and code reads them from the validated config. dvc.yaml names the same paths
(tests/test_pipeline_wiring.py checks the two agree).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# ------------------------------------------------------------------ label sets and group names

# Method A: the U.S. set's five groups (data/reference/groupsets/us/groupset.yaml, kept equal by a test), for its
# Census/BLS table builders and tests; every stage reads the active set's labels (Params.groups). A label outside
# the active set is an abstention.
GROUPS: tuple[str, ...] = ("white", "black", "asian", "hispanic", "other")
UNKNOWN = "unknown"

# Method B: the target groups of the face-only edits (file names {Race}_{gender}.jpg).
RACES: tuple[str, ...] = ("Asian", "Black", "Latino", "MiddleEastern", "White")
GENDERS: tuple[str, ...] = ("man", "woman")

# Label written into every output produced by a random-weight stand-in model.
STAND_IN = "stand-in"

# ------------------------------------------------------------------ L* bins (faces → analysis)

# The paper's skin-lightness bins: L* < 40, [40, 55), [55, 70), ≥ 70 (left-closed).
L_BIN_EDGES: tuple[float, ...] = (40.0, 55.0, 70.0)
L_BIN_LABELS: tuple[str, ...] = ("<40", "[40,55)", "[55,70)", "≥70")


def l_bin(L: np.ndarray | float) -> np.ndarray:
    """The L* bin label of each value (NaN → ''): the faces stage writes these, the analysis groups by them."""
    L = np.atleast_1d(np.asarray(L, dtype=np.float64))
    idx = np.searchsorted(np.asarray(L_BIN_EDGES), L, side="right")
    out = np.asarray(L_BIN_LABELS, dtype=object)[np.minimum(idx, len(L_BIN_LABELS) - 1)]
    out[np.isnan(L)] = ""
    return out


# ------------------------------------------------------------------ table columns

# faces/<model>.parquet: the colour columns (NaN / None where no skin was measured)
COLOUR_COLUMNS: tuple[str, ...] = ("mean_r", "mean_g", "mean_b", "L", "a", "b", "C", "h", "ita", "L_bin")
# labels/<model>.parquet: what the analysis reads
LABEL_COLUMNS: tuple[str, ...] = ("image_id", "model", "prompt_id", "label")
# status values shared by the per-item stages
OK = "ok"
NOT_MEASURABLE = "not_measurable"

# ------------------------------------------------------------------ paths

DATA = Path("data")
REPORTS = Path("reports")
HEADLINE_METRICS = Path("metrics") / "headline.json"  # tracked in git: the baseline of `dvc metrics diff`
REFERENCE_DIR = DATA / "reference"
OCCUPATION_PHRASES = REFERENCE_DIR / "occupation_phrases.csv"
GROUPSETS_DIR = REFERENCE_DIR / "groupsets"          # <set>/groupset.yaml + its instance tables (biasaudit.groupsets)
PORTRAITS_DIR = REFERENCE_DIR / "portraits"          # default of baseline.portraits_dir
SKIN_SCALES_DIR = REFERENCE_DIR / "skin_scales"      # ITA categories and Monk tones (biasaudit.faces.skin_scales)
# when each stage last ran, for how long, at which commit: the volatile part of a run, outside every
# tracked output (an executed notebook hashes the same in every run of the same code)
RUNS_DIR = REPORTS / "runs"
AUDIT_DIR = REPORTS / "audit"                        # audit cards: <model>.html|csv, index.html, all_models.csv
PUBLISHED_DIR = REFERENCE_DIR / "published"          # the numbers both papers report (method_a.csv, method_b.csv)
REPLICATION_CSV = REPORTS / "replication.csv"        # each published number beside this run's (report/replication.py)
REPLICATION_PAGE = "replication.html"                # its page under reports/pages/

# Method A
T2I = DATA / "t2i"
BENCHMARKS_DIR = T2I / "benchmarks"
PROMPTS_CSV = T2I / "prompts.csv"                    # default of generate.prompts_file
IMAGES_DIR = T2I / "images"                          # default of generate.images_dir: <images_dir>/<model>/
LABELS_DIR = T2I / "labels"
FACES_DIR = T2I / "faces"
EMBEDDINGS_DIR = T2I / "embeddings"
BASELINE_DIR = T2I / "baseline"
CLASSIFY_CACHE = T2I / "cache" / "classify.sqlite"   # default of classify.cache_path (never a DVC output)
CLASSIFY_LOGS = T2I / "cache" / "classify"
ANNOTATIONS_DIR = T2I / "annotations"                # default of reliability.sheets_dir
WORK_DIR = T2I / ".work"
T2I_REPORTS = REPORTS / "t2i"
RELIABILITY_DIR = T2I_REPORTS / "reliability"
OVERLAYS_DIR = T2I_REPORTS / "overlays"
INSTRUMENTS_DIR = T2I_REPORTS / "instruments"
INSTRUMENTS_FIGURE = INSTRUMENTS_DIR / "instruments.png"  # the instruments stage's L*-sweep figure

# Method B
VLM = DATA / "vlm"
SOURCE_PHOTOS = VLM / "source_photos"                # default of sources.input_dir
SOURCES_DIR = VLM / "sources"
FOCUS_DIR = VLM / "focus"
FOCUS_MANIFEST = FOCUS_DIR / "manifest.parquet"      # one row per face-only edit (vlm/focus.py)
EDIT_CHECKS = VLM / "edit_checks.parquet"
RESPONSES_DIR = VLM / "responses"
VLM_CACHE = VLM / "cache"
VLM_REPORTS = REPORTS / "vlm"
EDIT_CHECKS_REPORTS = VLM_REPORTS / "edit_checks"

# The check stage (validates params.yaml before DVC removes any output; fingerprints external inputs)
CHECK_DIR = DATA / "check"
CHECK_OK = CHECK_DIR / "params.ok"
# where the notebook runner keeps a stage's previous outputs while it runs (biasaudit/pipeline/keep_outputs.py)
PREV_OUTS_DIR = Path(".prev-outs")
# the order `dvc repro` runs the stages in (the "k/N" of each stage line); DVC's own scratch folder, not an output
STAGE_PLAN = Path(".dvc") / "tmp" / "biasaudit-stage-plan.json"
# each profile's outputs and dvc.lock entries while another profile is current (biasaudit/pipeline/profile_stash.py)
PROFILE_STASH_DIR = Path(".dvc") / "tmp" / "profile-stash"


def manifest_path(images_dir: str | Path, model: str) -> Path:
    """The image manifest generate@<model> writes."""
    return Path(images_dir) / model / "manifest.parquet"


def labels_path(model: str, labels_dir: str | Path = LABELS_DIR) -> Path:
    """The labels classify@<model> writes."""
    return Path(labels_dir) / f"{model}.parquet"


RATING_MEASURES = ("realism", "identity")  # validate_edits' human rating sheets (vlm/realism.py)


def rating_folder(sheets_dir: str | Path, measure: str) -> Path:
    """Where a rating measure's sheet, key, blinded images and raters' copies live: realism in `sheets_dir`,
    identity in its `identity/` subfolder (its own images: a realism id never shows beside an original)."""
    return Path(sheets_dir) / ("" if measure == "realism" else measure)


def rater_sheets(sheets_dir: str | Path, raters: list[str]) -> list[str]:
    """Each rater's filled copy of a sheet (reliability's annotation sheet, validate_edits' realism and identity sheets)."""
    return [(Path(sheets_dir) / f"{rater}.csv").as_posix() for rater in raters]


def faces_path(model: str) -> Path:
    return FACES_DIR / f"{model}.parquet"


def embeddings_dir(model: str) -> Path:
    return EMBEDDINGS_DIR / model


def overlays_dir(model: str) -> Path:
    return OVERLAYS_DIR / model


def responses_path(vlm: str) -> Path:
    return RESPONSES_DIR / f"{vlm}.parquet"


def vlm_cache_path(vlm: str) -> Path:
    """The answer cache of one VLM of `vlms:` (reflect and validate_edits share it)."""
    return VLM_CACHE / f"{vlm}.sqlite"


def inputs_fingerprint_path(stage: str) -> Path:
    """Fingerprint of a stage's external input folders, written by the check stage (a DVC dependency)."""
    return CHECK_DIR / f"{stage}.inputs.json"


# ------------------------------------------------------------------ analysis tables (writer ↔ report)

class ContractError(ValueError):
    """A table written or read without a column its contract declares."""


class Table:
    """One analysis table: its name (`<out>/tables/<name>.csv`; a `{vlm}` / `{task}` placeholder for the
    per-VLM tables), the columns every reader may rely on, and optional ones (read only when present).
    `OutputWriter.add` checks every table it writes against this; the report reads only these columns
    (and those starting with one of `prefixes`: per-group columns such as n_<group>, whose groups the
    active group set names)."""

    def __init__(self, name: str, columns: tuple[str, ...], optional: tuple[str, ...] = (), method: str = "t2i",
                 prefixes: tuple[str, ...] = ()):
        self.name, self.columns, self.optional, self.method = name, columns, optional, method
        self.prefixes = prefixes

    def keeps(self, column: str) -> bool:
        """Whether a reader may rely on `column` (declared, optional or with a declared prefix)."""
        return column in self.columns or column in self.optional or column.startswith(self.prefixes or ("\0",))

    def __repr__(self) -> str:
        return f"Table({self.name!r})"

    def parts(self, name: str) -> dict[str, str] | None:
        """The placeholders' values if a written table name is this table ({} without placeholders), else None."""
        import re

        pattern = re.escape(self.name).replace(r"\{vlm\}", r"(?P<vlm>.+?)").replace(r"\{task\}", r"(?P<task>.+)")
        m = re.fullmatch(pattern, name)
        return None if m is None else m.groupdict()

    def matches(self, name: str) -> bool:
        return self.parts(name) is not None

    def of(self, vlm: str = "", task: str = "") -> str:
        """The concrete table name for one VLM (and task)."""
        return self.name.replace("{vlm}", vlm).replace("{task}", task)

    def missing(self, columns: "list[str] | tuple[str, ...]") -> list[str]:
        have = set(map(str, columns))
        return [c for c in self.columns if c not in have]


_CI = ("low", "high")
# Method A (reports/t2i/tables/, written by the t2i/analysis sections)
TVD_SUMMARY = Table("tvd_summary", ("model", "category", "n_prompts", "mean_tvd", "mean_tvd_low", "mean_tvd_high"),
                    ("null_floor", "tvd_corrected", "tvd_corrected_low", "tvd_corrected_high"))
TVD_PER_PROMPT = Table("tvd_per_prompt", ("model", "prompt_id", "n"),
                       ("category", "tvd", "instance", "selected_for", "n_unknown", "null_floor", "tvd_bias_corrected"),
                       prefixes=("n_", "share_", "bench_"))  # one column per group of the active set
TVD_PAIRED = Table("tvd_paired", ("model_a", "model_b", "category", "diff", *_CI, "p_value", "p_adjusted"))
TVD_CORRECTED_SUMMARY = Table("tvd_corrected_summary", (
    "model", "category", "mean_tvd_raw", "tvd_debiased", "tvd_debiased_low", "tvd_debiased_high", "identifiable"),
    ("condition_number", "reason", "tvd_point", "tvd_point_source", "tvd_debiased_width", "tvd_mse_weighted",
     "tvd_point_weight", "tvd_rmse_raw", "tvd_rmse_corrected", "tvd_lower_bound", "tvd_above_floor_p",
     "tvd_classifier_corrected",
     "tvd_classifier_corrected_low", "tvd_classifier_corrected_high", "n_prompts"))
SKIN_SUMMARY_BY_LABEL = Table("skin_summary_by_label", ("model", "label", "n", "L_mean", "L_mean_lo", "L_mean_hi"),
                              ("diversity_de2000", "diversity_pairs"))
# skin-tone scales beside L* (faces/skin_scales.py): ITA category and Monk tone, per model × label × prompt category
SKIN_SCALES = Table("skin_scales", ("model", "label", "category", "scale", "tone", "n", "share"))
SKIN_SCALES_BY_LABEL = Table("skin_scales_by_label", ("model", "label", "n", "L_mean", "ita_mean", "ita_category_mode",
                                                      "monk_tone_median", "monk_de2000_median", "monk_de2000_p90"),
                             ("monk_de2000_max",))
# apparent gender (t2i/analysis/gender.py): against BLS Table 11's share of women, parity where none
GENDER_SUMMARY = Table("gender_summary", ("model", "category", "benchmark", "n_prompts", "mean_tvd", "mean_tvd_low",
                                          "mean_tvd_high", "deviation_group", "mean_deviation", "tvd_corrected",
                                          "tvd_corrected_low", "tvd_corrected_high"),
                       ("mean_deviation_low", "mean_deviation_high", "mean_deviation_corrected",
                        "mean_deviation_corrected_low", "mean_deviation_corrected_high", "M_source", "reason",
                        "n_images", "n_unknown"))
GENDER_PER_PROMPT = Table("gender_per_prompt", ("model", "category", "prompt_id", "benchmark", "n", "tvd"),
                          ("instance", "n_unknown"), prefixes=("n_", "share_", "bench_", "deviation_"))
GENDER_BY_RACE = Table("gender_by_race", ("model", "category", "reference", "n_images", "tvd_from_parity", *_CI),
                       prefixes=("share_",))
# label-free identity clusters (t2i/analysis/clusters.py)
CLUSTER_K = Table("cluster_k", ("k", "silhouette"), ("inertia", "chosen", "sample"))
CLUSTER_TVD = Table("cluster_tvd", ("model", "n_prompts", "k", "tvd_vs_others", "tvd_vs_others_low",
                                    "tvd_vs_others_high", "tvd_vs_pooled", "tvd_vs_pooled_low", "tvd_vs_pooled_high"),
                    ("n_faces", "reason"))
CLUSTER_EXCESS = Table("cluster_excess", ("model", "cluster", "share", "share_others", "excess", *_CI,
                                          "over_produced"))
CLUSTER_SHARES = Table("cluster_shares", ("model", "prompt_id", "cluster", "n", "share"))
CLUSTER_AMI = Table("cluster_ami", ("model", "n_faces", "ami"), ("reason",))
CLUSTER_EXEMPLARS = Table("cluster_exemplars", ("cluster", "rank", "image_id", "model", "prompt_id"),
                          ("size", "label", "cosine_distance", "path"))
SKIN_DARK_SHARE = Table("skin_dark_share", ("model", "L_threshold", "group", "n_measured", "n_dark", "share",
                                            "share_low", "share_high"))
HOMOGENEITY_BY_RACE = Table("homogeneity_by_race", ("model", "space", "group", "wp_gap", "wp_gap_lo", "wp_gap_hi",
                                                    "gap", "gap_lo", "gap_hi"),
                            ("p_value", "p_adjusted", "p_global", "near_dup_rate", "near_dup_cosine", "n_prompts",
                             "few_prompts", "flagged", "p_localise", "p_perm"))
# few_prompts: a group with pairs in fewer than this many prompts, where a bootstrap over so few clusters
# under-covers even with the small-cluster expansion: a rare group at 10 prompts, which mostly has pairs in
# fewer than 5, covers 0.59–0.60 (benchmarks/results/calibration.csv; in 14 of 50 prompts it covers 0.946)
MIN_PROMPTS_CI = 5
HOMOGENEITY_VS_BASELINE = Table("homogeneity_vs_baseline", ("model", "space", "group", "gap_minus_baseline"))
VALIDATION = Table("validation", ("model", "category_or_group", "quantity", "planted", "estimate", *_CI, "covered"),
                   ("width", "informative", "check", "note"))
FACE_LOSS = Table("face_loss", ("model", "by", "group", "n_images", "no_face_rate", *_CI, "threshold", "flagged"))
CROSS_DETECTOR = Table("cross_detector", ("model", "by", "group", "n_images", "share_main_only", "share_cross_only"))
CALIBRATION = Table("calibration", ("method", "kind", "setting", "scale", "nominal", "observed", "mc_se", "flag"),
                    ("replications", "mean_width"))
# a calibration row is `ok` when its observed rate lies in its band (benchmarks/calibration.py)
COVERAGE_BAND, REJECTION_BAND = (0.93, 0.97), (0.03, 0.07)
INSTRUMENTS_SUMMARY = Table("instruments_summary", ("method", "mode", "target_L", "n", "detection_rate",
                                                    "mean_abs_L_error"))
# the reliability stage's files (reports/t2i/reliability/<name>.csv)
MEAN_KAPPA = Table("mean_kappa", ("kind", "mean_cohen_kappa"), ("raters_source",))
FLEISS_KAPPA = Table("fleiss_kappa", ("group", "raters", "fleiss_kappa", "ci_low", "ci_high"), ("raters_source", "n"))
PAIRWISE_KAPPA = Table("pairwise_kappa", ("rater_a", "rater_b", "kind", "n", "cohen_kappa", "ci_low", "ci_high"))
# the tables the replication table (report/replication.py) reads beside the headline ones
DEVIATION_BY_RACE = Table("deviation_by_race", ("model", "category", "race", "mean_deviation", "mean_deviation_low",
                                                "mean_deviation_high"))
THRESHOLD_SUMMARY = Table("threshold_summary", ("model", "category", "group", "threshold", "n_prompts_above",
                                                "n_reaching", "share_reaching"))
SKIN_EARNINGS_OLS = Table("skin_earnings_ols", ("model", "group", "slope", "ci_low", "ci_high", "p_value", "n",
                                                "n_clusters"))
HOMOGENEITY_BY_L_BIN = Table("homogeneity_by_L_bin", ("model", "space", "group", "n", "intra", "gap"),
                             ("gap_lo", "gap_hi", "wp_gap", "wp_gap_lo", "wp_gap_hi", "intra_lo", "intra_hi",
                              "intra_minus_next", "intra_minus_next_lo", "intra_minus_next_hi"))
# the prompt as the group: each prompt's images against the model's other prompts (t2i/analysis/homogeneity.py)
HOMOGENEITY_BY_PROMPT = Table("homogeneity_by_prompt", ("model", "space", "group", "n", "intra", "inter", "gap"))
# every embedded face of a model as one group: the mean pairwise cosine with a prompt-cluster interval
HOMOGENEITY_OVERALL = Table("homogeneity_overall", ("model", "space", "n", "intra"), ("intra_lo", "intra_hi"))
# L* ~ the occupation's share of women: the seed's subset (subset "seed", one label) and the label-adjusted
# extension (t2i/analysis/skin.py women_share_regression)
SKIN_WOMEN_SHARE_OLS = Table("skin_women_share_ols", ("model", "subset", "group", "faces", "slope", "ci_low", "ci_high",
                                                      "p_value", "n_clusters"))
# every measured face of a model, whatever its label: mean L* and ΔE2000 diversity with intervals
SKIN_SUMMARY_BY_MODEL = Table("skin_summary_by_model", ("model", "n", "L_mean", "diversity_de2000"),
                              ("L_mean_lo", "L_mean_hi", "diversity_de2000_lo", "diversity_de2000_hi"))


def disagreements(groups: tuple[str, ...]) -> Table:
    """reports/t2i/reliability/disagreements.csv: per label (column `index`), the share of its rater-pair
    disagreements against each other label of the active set (one column per label)."""
    return Table("disagreements", ("index", "n_disagreements"), tuple(groups))


def confusion(groups: tuple[str, ...]) -> Table:
    """reports/t2i/reliability/confusion.csv: counts of (human label `human`, classifier label: one column per
    label of the active set), each human's labels stacked."""
    return Table("confusion", ("human",), tuple(groups))
# Method B (reports/vlm/tables/, written by the sections of vlm/analysis/ and vlm/recovery.py), one per VLM
RACE_WINRATE = Table("{vlm}_race_winrate_{task}", ("gender", "race", "n", "rate", *_CI), ("degenerate",), method="vlm")
DELTA_G = Table("{vlm}_delta_g", ("dimension", "level", "measure", "delta_pct", *_CI, "p_value", "p_adjusted"), method="vlm")
OLS = Table("{vlm}_ols", ("term", "coef", "ci_low", "ci_high", "p", "p_adjusted", "measure", "n_clusters"),
            ("reason", "reference"), method="vlm")
SIGN_FLIP = Table("{vlm}_sign_flip", ("dimension", "level", "mean_diff", "p", "p_adjusted", "measure"),
                  ("reason", "reference"), method="vlm")
RETENTION = Table("{vlm}_retention", ("kind", "task", "asked", "retained", "top_reason"), method="vlm")
# the confirmatory family and the caveats every group finding carries (vlm/analysis/caveats.py)
_CAVEATS = ("refusal_gap_p", "bounds_low", "bounds_high", "floor_bound", "exceeds_floor", "placebo_effect_null")
PRIMARY_ENDPOINTS = Table("{vlm}_primary_endpoints", ("endpoint", "estimate", *_CI, "p", "p_holm", "reject",
                                                      "refusal_gap", "robust_to_refusals", "caveats"),
                          ("n_photos", "reason", *_CAVEATS), method="vlm")
CAVEATS = Table("{vlm}_caveats", ("measure", "group", "refusal_gap", "robust_to_refusals", "caveats"), _CAVEATS,
                method="vlm")
TASK_INTERACTION = Table("{vlm}_task_interaction", ("race", "kind", "task", "task_b", "estimate", "low", "high", "p",
                                                  "p_adjusted", "n_photos"), ("reason",), method="vlm")
VLM_VALIDATION = Table("{vlm}_validation", ("vlm", "task", "group", "quantity", "planted", "estimate", *_CI, "width",
                                            "plausible_range", "covered", "informative", "check"),
                       ("note", "excludes_null", "would_have_answered"), method="vlm")

ANALYSIS_TABLES: tuple[Table, ...] = (
    TVD_SUMMARY, TVD_PER_PROMPT, TVD_PAIRED, TVD_CORRECTED_SUMMARY, SKIN_SUMMARY_BY_LABEL, SKIN_DARK_SHARE, HOMOGENEITY_BY_RACE,
    SKIN_SCALES, SKIN_SCALES_BY_LABEL, GENDER_SUMMARY, GENDER_PER_PROMPT, GENDER_BY_RACE,
    CLUSTER_K, CLUSTER_TVD, CLUSTER_EXCESS, CLUSTER_SHARES, CLUSTER_AMI, CLUSTER_EXEMPLARS,
    HOMOGENEITY_VS_BASELINE, VALIDATION, FACE_LOSS, CROSS_DETECTOR, CALIBRATION, INSTRUMENTS_SUMMARY, MEAN_KAPPA,
    FLEISS_KAPPA, PAIRWISE_KAPPA, DEVIATION_BY_RACE, THRESHOLD_SUMMARY, SKIN_EARNINGS_OLS, HOMOGENEITY_BY_L_BIN,
    SKIN_WOMEN_SHARE_OLS, SKIN_SUMMARY_BY_MODEL, HOMOGENEITY_BY_PROMPT, HOMOGENEITY_OVERALL, RACE_WINRATE, DELTA_G, OLS,
    SIGN_FLIP, RETENTION, TASK_INTERACTION, VLM_VALIDATION, PRIMARY_ENDPOINTS, CAVEATS)


def contract_of(name: str, method: str = "t2i") -> Table | None:
    """The declared table a table name of `method` ("t2i" or "vlm", the output folder) is, or None (an
    undeclared table is read by no other code)."""
    return next((t for t in ANALYSIS_TABLES if t.method == method and t.matches(name)), None)


def check_table(name: str, columns: "list[str] | tuple[str, ...]", rows: int = 1, method: str = "t2i") -> None:
    """Raise ContractError when a declared table lacks a declared column (a table with no rows and no
    columns, a section's empty result, passes)."""
    table = contract_of(name, method)
    if table is None or (rows == 0 and len(columns) == 0):
        return
    missing = table.missing(columns)
    if missing:
        raise ContractError(f"table {name} lacks column(s) {', '.join(missing)} that contracts.{_const(table)} declares")


def _const(table: Table) -> str:
    return next((k for k, v in globals().items() if v is table), table.name)
