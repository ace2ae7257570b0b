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

# Method A: the five groups, in the canonical column order of every table; anything else is an abstention.
GROUPS: tuple[str, ...] = ("white", "black", "asian", "hispanic", "other")
UNKNOWN = "unknown"
LABEL_ORDER: tuple[str, ...] = (*GROUPS, UNKNOWN)

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
NOTEBOOKS_OUT = REPORTS / "notebooks"
AUDIT_DIR = REPORTS / "audit"                        # audit cards: <model>.html|csv, index.html, all_models.csv

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

# Method B
VLM = DATA / "vlm"
SOURCE_PHOTOS = VLM / "source_photos"                # default of sources.input_dir
SOURCES_DIR = VLM / "sources"
FOCUS_DIR = VLM / "focus"
EDIT_CHECKS = VLM / "edit_checks.parquet"
RESPONSES_DIR = VLM / "responses"
VLM_CACHE = VLM / "cache"
VLM_REPORTS = REPORTS / "vlm"
EDIT_CHECKS_REPORTS = VLM_REPORTS / "edit_checks"

# The check stage (validates params.yaml before DVC removes any output; fingerprints external inputs)
CHECK_DIR = DATA / "check"
CHECK_OK = CHECK_DIR / "params.ok"


def manifest_path(images_dir: str | Path, model: str) -> Path:
    """The image manifest generate@<model> writes."""
    return Path(images_dir) / model / "manifest.parquet"


def labels_path(model: str) -> Path:
    return LABELS_DIR / f"{model}.parquet"


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
