"""The analysis' inputs (each VLM's answers), the retained answers and their numeric values, and the
settings every section shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import registry

OK = "ok"


@dataclass(frozen=True)
class Boot:
    """The resampling and testing settings of the reflect_analysis section, shared by every section."""

    n_boot: int  # cluster bootstrap over source photos
    level: float
    method: str
    seed: int
    n_permutations: int  # sign-flip tests
    p_adjust: str  # holm | bh | none: adjustment over the rows of one table
    min_clusters: int  # fewer photos: cluster-robust tests labelled underpowered

    @classmethod
    def of(cls, cfg: Any) -> "Boot":
        a = cfg.reflect_analysis
        return cls(a.n_boot, a.confidence, a.bootstrap_method, a.seed, a.n_permutations, a.p_adjust, a.min_clusters)

    @property
    def alpha(self) -> float:
        return 1 - self.level

    @property
    def resampling(self) -> dict[str, Any]:
        """The keyword arguments of stats.resample.cluster_bootstrap."""
        return {"n_boot": self.n_boot, "level": self.level, "method": self.method, "seed": self.seed}


def planted_truth(backend: Any) -> bool:
    """Whether a VLM's answers come from declared effects (a backend with the `planted` trait), so its
    estimates can be set beside exact values."""
    return bool(registry.trait("vlm", str(backend), "planted", False))


@dataclass
class Answers:
    """One VLM's answers, and what the sections computed from them that other sections read (`shared`).

    `responses` holds only the answers the group analyses read (vlm.tasks.group_rows: real tasks about the
    group edits); the placebo tasks' answers are moved to `placebo`, the null-edit control's rows (arm
    null_edit | original) to `controls`, both read by the controls section alone."""

    vlm: str
    responses: pd.DataFrame
    planted: Any = None  # the declared effects (cfg.vlms[vlm].planted) of a VLM with planted truth
    _shared: dict[Any, Any] = field(default_factory=dict, repr=False)
    placebo: pd.DataFrame = field(default=None, repr=False)  # type: ignore[assignment]
    controls: pd.DataFrame = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        from biasaudit.vlm.groups import COUNTERFACTUAL, arm_of

        df = self.responses
        edits = arm_of(df) == COUNTERFACTUAL
        placebo = df["placebo"].fillna(False).astype(bool) if "placebo" in df else pd.Series(False, index=df.index)
        if self.placebo is None:
            self.placebo = df[edits & placebo]
        if self.controls is None:
            self.controls = df[~edits]
        self.responses = df[edits & ~placebo]

    @property
    def first(self) -> Any:
        return self.responses.iloc[0] if len(self.responses) else {}

    @property
    def backend(self) -> Any:
        return self.first.get("backend")

    @property
    def model_id(self) -> Any:
        return self.first.get("model_id")

    @property
    def stand_in(self) -> bool:
        if "stand_in" not in self.responses:
            return False
        return bool(self.responses["stand_in"].fillna(False).astype(bool).any())

    @property
    def tag(self) -> str:
        """What the section titles say about these answers."""
        if registry.trait("vlm", self.backend or "", "planted", False):
            return " [PLANTED: SIMULATED answers]"
        return " [STAND-IN]" if self.stand_in else ""

    def shared(self, name: str, cfg: Any, compute: Callable[[], Any]) -> Any:
        """`compute()` once per VLM and analysis settings: the first section that asks computes it."""
        key = (name, repr(cfg.reflect_analysis))
        if key not in self._shared:
            self._shared[key] = compute()
        return self._shared[key]


@dataclass
class Inputs:
    vlms: list[Answers]
    missing: list[str]  # VLMs with no responses yet


def load_inputs(cfg: Any, root: str | Path = ".") -> Inputs:
    """The responses of the VLMs named in reflect_analysis.vlms (all of cfg.vlms when empty)."""
    names = cfg.reflect_analysis.vlms or sorted(cfg.vlms)
    vlms, missing = [], []
    for v in names:
        path = Path(root) / C.responses_path(v)
        if not path.exists():
            missing.append(v)
            continue
        answers = Answers(v, pd.read_parquet(path))
        if planted_truth(answers.first.get("backend", "")) and v in cfg.vlms:
            answers.planted = cfg.vlms[v].planted
        vlms.append(answers)
    return Inputs(vlms, missing)


def retained(df: pd.DataFrame, kind: str, task: str | None = None) -> pd.DataFrame:
    """Rows of one kind (and task) that have a valid answer."""
    sel = (df["kind"] == kind) & (df["status"] == OK)
    if task is not None:
        sel &= df["task"] == task
    return df.loc[sel]


def two_afc_tasks(answers: Answers) -> dict[str, pd.DataFrame]:
    """The retained 2AFC answers of each task, tasks sorted."""
    two = retained(answers.responses, "2afc")
    return {task: two[two["task"] == task] for task in sorted(two["task"].unique())}


def answer_scales(cfg: Any) -> dict[str, dict[str, float] | None]:
    """The numeric value of each answer per single-image measure (`<kind>_<task>`), in declared order:
    each MCQ task's letter values, None for a salary task (reflect.task_specs, vlm.declared.answer_values)."""
    from biasaudit.vlm.declared import answer_values

    return answer_values(cfg.reflect)


def with_values(df: pd.DataFrame, mapping: dict[str, float] | None) -> pd.DataFrame:
    """Add a numeric `y`: the bracket value of the chosen letter (MCQ) or the salary (value_usd)."""
    out = df.copy()
    out["y"] = out["choice"].map(mapping).astype(float) if mapping is not None else out["value_usd"].astype(float)
    return out[np.isfinite(out["y"])]


def measures(answers: Answers, cfg: Any) -> dict[str, pd.DataFrame]:
    """Per declared single-image task with retained answers (`<kind>_<task>`: mcq_salary, mcq_education,
    salary_salary, …): the retained answers with their numeric value `y`."""
    return measure_frames(answers.responses, cfg)


def measure_frames(responses: pd.DataFrame, cfg: Any) -> dict[str, pd.DataFrame]:
    """`measures` of any response rows (the controls section's own rows), in declared order."""
    out = {}
    for label, values in answer_scales(cfg).items():
        kind, task = label.split("_", 1)
        sub = retained(responses, kind, task)
        if not sub.empty:
            out[label] = with_values(sub, values)
    return out


def degenerate_2afc(two_afc: pd.DataFrame) -> str:
    """Why this task's win rates are fixed by the design rather than measured ('' when they are not)."""
    choices = two_afc["choice"].dropna().unique()
    if len(two_afc) and len(choices) == 1:
        return (f"degenerate: every retained answer is '{choices[0]}' (win rates follow from the order of the "
                "images, 0.50 with both orders asked, not from the groups)")
    return ""


def degenerate_values(df: pd.DataFrame) -> str:
    values = df["y"].dropna().unique()
    if len(df) and len(values) == 1:
        return f"degenerate: every retained answer has the value {values[0]:g}, so no gap or test can be computed"
    return ""


def degenerate(answers: Answers, cfg: Any) -> dict[str, str]:
    """Why a task's answers measure nothing: `2afc_<task>` and `<kind>_<task>` → reason (only those)."""
    out = {f"2afc_{t}": degenerate_2afc(sub) for t, sub in two_afc_tasks(answers).items()}
    out |= {label: degenerate_values(sub) for label, sub in measures(answers, cfg).items()}
    return {k: why for k, why in out.items() if why}


def retention_table(responses: pd.DataFrame) -> pd.DataFrame:
    """Per kind × task: questions asked, retained (ok), refused, failed, and the most common reason."""
    rows = []
    for (kind, task), sub in responses.groupby(["kind", "task"], sort=True):
        bad = sub[sub["status"] != OK]
        reasons = bad["reason"] if "reason" in bad else pd.Series("", index=bad.index)
        top = reasons.fillna("").astype(str).str.slice(0, 80).value_counts()
        rows.append({"kind": kind, "task": task, "asked": len(sub), "retained": int((sub["status"] == OK).sum()),
                     "refused": int((sub["status"] == "refused").sum()), "failed": int((sub["status"] == "failed").sum()),
                     "retained_share": float((sub["status"] == OK).mean()),
                     "top_reason": f"{top.index[0]} ({int(top.iloc[0])})" if len(top) else ""})
    return pd.DataFrame(rows, columns=["kind", "task", "asked", "retained", "refused", "failed", "retained_share",
                                       "top_reason"])


def counts(responses: pd.DataFrame) -> dict[str, Any]:
    """Questions asked, counts per kind/status, and retained answers per kind."""
    return {"n_questions": int(len(responses)),
            "status_counts": {f"{k}/{s}": int(n) for (k, s), n in responses.groupby(["kind", "status"]).size().items()},
            "retained": {k: int(n) for k, n in responses[responses["status"] == OK].groupby("kind").size().items()}}


def ratio_intervals(wins: np.ndarray, n: np.ndarray, boot: dict[str, Any] | None) -> pd.DataFrame:
    """rate = Σ_u wins / Σ_u n per column of the (U, m) arrays, the photos with n > 0 (`n_photos`), and a
    cluster-bootstrap CI over photos (`boot`: Boot.resampling; None: no interval)."""
    m = wins.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(n.sum(0) > 0, wins.sum(0) / n.sum(0), np.nan)
    out = pd.DataFrame({"wins": wins.sum(0).astype(int), "n": n.sum(0).astype(int), "rate": rate,
                        "n_photos": (n > 0).sum(0).astype(int)})
    if boot is None:
        return out
    from biasaudit.stats.resample import cluster_bootstrap

    def stat(sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sums[..., m:] > 0, sums[..., :m] / sums[..., m:], np.nan)

    ivs = cluster_bootstrap(np.hstack([wins, n]), stat, **boot)
    return out.assign(low=[iv.low for iv in ivs], high=[iv.high for iv in ivs], reason=[iv.reason for iv in ivs])
