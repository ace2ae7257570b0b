"""The analysis' inputs (the upstream stage outputs) and the resampling settings every section shares."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.resample import (
    Interval,
    Replicates,
    cluster_bootstrap,
    replicates,
    sums_statistic,
)

PLOTS = {"shares": ["model", "category", "prompt_id", "race", "benchmark_share", "model_share"],
         "tvd": ["model", "category", "mean_tvd", "mean_tvd_low", "mean_tvd_high", "pooled_tvd", "null_floor",
                 "tvd_bias_corrected", "tvd_bias_corrected_low", "tvd_bias_corrected_high"],
         "skin_L_C": ["model", "image_id", "label", "L", "C"]}


@dataclass(frozen=True)
class Boot:
    """Bootstrap settings shared by every interval of one run."""

    n_boot: int
    level: float
    method: str
    seed: int
    p_adjust: str  # holm | bh | none: adjustment of the p-values of one table
    permutation_design: str  # homogeneity permutation test: within | across prompts

    @classmethod
    def of(cls, cfg: Any) -> "Boot":
        """The settings of the `analyze` section (and the run's seed) of the validated config."""
        a = cfg.analyze
        return cls(a.n_boot, a.ci_level, a.bootstrap_method, cfg.seed, a.p_adjust, a.permutation_design)

    def run(self, totals: np.ndarray, statistic, *key: Any) -> list[Interval]:
        return cluster_bootstrap(totals, statistic, n_boot=self.n_boot, level=self.level,
                                 seed=derive_seed(self.seed, *key), method=self.method)

    def replicates(self, totals: np.ndarray, statistic, *key: Any) -> Replicates:
        totals = np.asarray(totals, dtype=float)
        return replicates(sums_statistic(totals, statistic), len(totals), n_boot=self.n_boot,
                          seed=derive_seed(self.seed, *key), method=self.method)


@dataclass
class Inputs:
    prompts: pd.DataFrame
    manifests: pd.DataFrame
    labels: pd.DataFrame
    faces: pd.DataFrame
    root: Path
    notes: dict[str, str] = field(default_factory=dict)  # input → why it is empty or partial
    groups: tuple[str, ...] = field(kw_only=True)  # the active group set's labels (Params.groups), table order
    colours: dict[str, str] = field(kw_only=True, default_factory=dict)  # label → '#rrggbb' (Params.group_colours)

    @property
    def models(self) -> list[str]:
        seen = [*self.manifests.get("model", []), *self.labels.get("model", []), *self.faces.get("model", [])]
        return list(dict.fromkeys(map(str, seen)))


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read_parquets(paths: list[Path], what: str, notes: dict[str, str]) -> pd.DataFrame:
    frames, bad = [], []
    for path in sorted(paths):
        try:
            frames.append(pd.read_parquet(path))
        except Exception as exc:
            bad.append(f"{path.name}: {type(exc).__name__}")
    if bad:
        notes[what] = "unreadable: " + "; ".join(bad)
    elif not paths:
        notes[what] = f"no {what} files yet ({(C.T2I / what).as_posix()}/)"
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_inputs(root: str | Path = ".", prompts_file: str | Path = C.PROMPTS_CSV,
                images_dir: str | Path = C.IMAGES_DIR, *, groups: tuple[str, ...],
                colours: dict[str, str] | None = None) -> Inputs:
    """Read the upstream stage outputs under `root` (missing ones become empty frames + a note);
    `prompts_file` and `images_dir` are generate.prompts_file and generate.images_dir, `groups` the
    active group set's labels (cfg.groups) and `colours` theirs (cfg.group_colours; grey where not given)."""
    root = Path(root)
    notes: dict[str, str] = {}
    prompts_path = root / prompts_file
    prompts = pd.read_csv(prompts_path) if prompts_path.exists() else pd.DataFrame()
    if prompts.empty:
        notes["prompts"] = f"{prompts_path.as_posix()} missing or empty"
    manifests = _read_parquets(list((root / images_dir).glob("*/manifest.parquet")), "images", notes)
    labels = _read_parquets(list((root / C.LABELS_DIR).glob("*.parquet")), "labels", notes)
    faces = _read_parquets(list((root / C.FACES_DIR).glob("*.parquet")), "faces", notes)
    return Inputs(prompts, manifests, labels, faces, root, notes, groups=tuple(groups),
                  colours={g: (colours or {}).get(g, "#7f7f7f") for g in groups})


SPACES = ("clip", "face")


def load_embeddings(root: Path, model: str, space: str) -> tuple[pd.DataFrame, np.ndarray] | None:
    """(index rows with a vector in `space`, the matching float32 rows) or None when absent."""
    base = root / C.embeddings_dir(model)
    index_path, matrix_path = base / "index.parquet", base / f"{space}.npy"
    if not (index_path.exists() and matrix_path.exists()):
        return None
    index = pd.read_parquet(index_path)
    matrix = np.load(matrix_path, mmap_mode="r")
    rows = index[index[f"{space}_row"] >= 0]
    return rows.reset_index(drop=True), np.asarray(matrix[rows[f"{space}_row"].to_numpy()])


def _embedding_meta(inputs: Inputs, index: pd.DataFrame, model: str) -> pd.DataFrame:
    meta = index[["image_id"]].assign(model=model)
    lab = inputs.labels[["image_id", "prompt_id", "label"]] if not inputs.labels.empty else pd.DataFrame(
        columns=["image_id", "prompt_id", "label"])
    meta = meta.merge(lab.drop_duplicates("image_id"), on="image_id", how="left")
    if meta["prompt_id"].isna().any() and not inputs.manifests.empty:
        pid = inputs.manifests.drop_duplicates("image_id").set_index("image_id")["prompt_id"]
        meta["prompt_id"] = meta["prompt_id"].fillna(meta["image_id"].map(pid))
    meta["race"] = meta["label"].where(meta["label"].isin(inputs.groups))  # abstentions are no group
    if not inputs.faces.empty and "L_bin" in inputs.faces:
        meta = meta.merge(inputs.faces[["image_id", "L_bin"]].drop_duplicates("image_id"), on="image_id", how="left")
    else:
        meta["L_bin"] = None
    return meta


def stage_counts(inputs: Inputs) -> pd.DataFrame:
    """Per stage and model: rows, and counts by status (ok / refused / failed / …), abstentions, stand-in."""
    rows = []
    for stage, frame in (("generate", inputs.manifests), ("classify", inputs.labels), ("faces", inputs.faces)):
        if frame.empty:
            rows.append({"stage": stage, "model": "", "rows": 0, "note": inputs.notes.get(
                {"generate": "images", "classify": "labels"}.get(stage, stage), "")})
            continue
        for model, sub in frame.groupby("model", sort=True):
            row = {"stage": stage, "model": model, "rows": len(sub)}
            if "status" in sub:
                row.update({f"status_{k}": int(v) for k, v in sub["status"].value_counts().items()})
            if stage == "classify":
                row["abstentions"] = int((~sub["label"].isin(inputs.groups)).sum())
            if stage == "faces" and "n_faces" in sub:
                row["no_face"] = int((sub["n_faces"].fillna(0) == 0).sum())
            if "stand_in" in sub:
                row["stand_in"] = bool(sub["stand_in"].astype(bool).any())
            rows.append(row)
    out = pd.DataFrame(rows)
    status_cols = sorted(c for c in out.columns if c.startswith("status_"))
    out[status_cols] = out[status_cols].fillna(0).astype(int)
    return out


def model_provenance(manifests: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ("model", "backend", "model_id", "model_revision", "stand_in") if c in manifests]
    if manifests.empty or "model" not in cols:
        return pd.DataFrame(columns=["model", "backend", "model_id", "model_revision", "stand_in"])
    return manifests[cols].astype(str).drop_duplicates().sort_values("model", ignore_index=True)
