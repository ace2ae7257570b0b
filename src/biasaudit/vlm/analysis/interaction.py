"""Section `interaction`: does the race effect differ between the task formulations (2AFC, MCQ, salary)?
A task × group interaction on a common standardised scale (definitions: the package docstring). Parameters:
`race_reference` (read through gaps.references), and the shared resampling and testing settings (inputs.Boot: n_boot, confidence,
n_permutations, min_clusters, p_adjust)."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from biasaudit.params.vlm import GENDERS, RACES
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.vlm.analysis.gaps import references
from biasaudit.vlm.analysis.inputs import Answers, Boot, measures, two_afc_tasks
from biasaudit.vlm.analysis.two_afc import order_pairs
from biasaudit.vlm.groups import CODE_TO_GROUP

COLUMNS = ["race", "kind", "task", "task_b", "estimate", "low", "high", "p", "p_adjusted", "n_photos", "reason"]


def win_shares(two_afc: pd.DataFrame) -> pd.DataFrame:
    """Per image (unit, group): its mean order-averaged outcome over the pairs retained in both orders (v)."""
    pairs, _ = order_pairs(two_afc)
    v = pd.concat([pd.DataFrame({"unit": pairs["unit"], "group": pairs["lo"], "v": pairs["s"]}),
                   pd.DataFrame({"unit": pairs["unit"], "group": pairs["hi"], "v": 1 - pairs["s"]})])
    return v.groupby(["unit", "group"], as_index=False)["v"].mean()


def image_values(answers: Answers, cfg: Any) -> dict[str, pd.DataFrame]:
    """Per task (2afc_<task>, mcq_<task>, salary_salary): one value v per image (unit, group): the 2AFC win
    share, the MCQ bracket value, the log salary (the mean when an image was asked more than once)."""
    out = {f"2afc_{t}": win_shares(sub) for t, sub in two_afc_tasks(answers).items()}
    for label, sub in measures(answers, cfg).items():
        y = np.log(sub["y"]) if label.startswith("salary") else sub["y"]
        out[label] = sub.assign(v=y).groupby(["unit", "group"], as_index=False)["v"].mean()
    return {k: v for k, v in out.items() if len(v)}


def within_photo_ss(values: pd.DataFrame, units: pd.Index) -> tuple[np.ndarray, np.ndarray]:
    """Per photo: Σ (v − photo mean)² and its degrees of freedom (images − 1; 0 for a photo without any)."""
    g = values.groupby("unit")["v"]
    ss = (values["v"] - g.transform("mean")).pow(2).groupby(values["unit"]).sum()
    df = (g.count() - 1).clip(lower=0)
    return ss.reindex(units, fill_value=0.0).to_numpy(float), df.reindex(units, fill_value=0).to_numpy(float)


def by_race_gender(values: pd.DataFrame) -> pd.DataFrame:
    """The image values as a table: a row per photo, a column per (race, gender)."""
    return values.assign(race=values["group"].map(lambda c: CODE_TO_GROUP[c][0]),
                         gender=values["group"].map(lambda c: CODE_TO_GROUP[c][1])).pivot_table(
        index="unit", columns=["race", "gender"], values="v", aggfunc="mean")


def race_contrasts(wide: pd.DataFrame, race: str, reference: str, units: pd.Index) -> np.ndarray:
    """Per photo: mean over genders (with both images valued) of v(race, gender) − v(reference, gender) of the
    `by_race_gender` table; NaN where no gender has both."""
    diffs = [wide[(race, g)] - wide[(reference, g)] for g in GENDERS
             if (race, g) in wide.columns and (reference, g) in wide.columns]
    if not diffs:
        return np.full(len(units), np.nan)
    return pd.concat(diffs, axis=1).mean(axis=1).reindex(units).to_numpy(float)


def standardised_effects(sums: np.ndarray, k: int) -> np.ndarray:
    """From column sums [Σ x_T (k), n photos, Σ SS_T (k), Σ df_T (k)]: θ_T = (Σ x_T / n) / √(Σ SS_T / Σ df_T),
    then θ_T − θ_T' for every pair of tasks (combinations order)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums[..., :k] / sums[..., k:k + 1]
        theta = mean / np.sqrt(sums[..., k + 1:2 * k + 1] / sums[..., 2 * k + 1:3 * k + 1])
    i, j = np.array(list(combinations(range(k), 2)), dtype=int).reshape(-1, 2).T
    return np.concatenate([theta, theta[..., i] - theta[..., j]], axis=-1)


def max_t(D: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """max over columns of |t| of the column means of sign-flipped rows of D (n, m); signs (B, n) of ±1."""
    n = D.shape[0]
    mean = signs @ D / n
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(((D ** 2).sum(0) - n * mean ** 2) / (n - 1) / n)
        t = np.abs(mean) / se
    return np.nanmax(np.where(np.isfinite(t), t, np.nan), axis=-1) if np.isfinite(t).any() else np.full(len(signs), np.nan)


def sign_flip_max_t(D: np.ndarray, n_permutations: int, seed: int) -> float:
    """Joint test of E D = 0 for per-photo difference vectors D (n, m), H0: each photo's vector symmetric about
    0: the studentised max |t| over the columns against its sign-flip distribution (exact enumeration when
    2^n ≤ n_permutations, else n_permutations random flips and the observed one)."""
    n = D.shape[0]
    if n < 2:
        return np.nan
    observed = max_t(D, np.ones((1, n)))[0]
    if not np.isfinite(observed):
        return np.nan
    if 2 ** n <= n_permutations:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(max_t(D, signs) >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_permutations, n))
    return float((1 + np.sum(max_t(D, signs) >= observed - 1e-12)) / (n_permutations + 1))


def race_rows(race: str, tasks: list[str], X: np.ndarray, SS: np.ndarray, DF: np.ndarray, boot: Boot) -> list[dict]:
    """Rows of one race: its standardised effect per task, every pairwise task difference (cluster-bootstrap
    intervals over photos), and the joint row (spread = max − min effect, sign-flip max-t p). X (U, k): the
    per-photo contrasts; photos with a contrast in every task are used."""
    from biasaudit.stats.resample import cluster_bootstrap

    k = len(tasks)
    complete = np.isfinite(X).all(axis=1)
    n = int(complete.sum())
    totals = np.column_stack([np.where(complete[:, None], X, 0.0), complete.astype(float), SS, DF])
    point = standardised_effects(totals.sum(0), k)
    few = n < boot.min_clusters
    reason = f"underpowered: {n} source photos < min_clusters {boot.min_clusters}" if few else ""
    ivs = [None] * len(point) if few or n < 2 else cluster_bootstrap(
        totals, lambda s: standardised_effects(s, k), **boot.resampling)
    pairs = list(combinations(range(k), 2))
    labels = [(tasks[t], "", "effect") for t in range(k)] + [(tasks[i], tasks[j], "difference") for i, j in pairs]
    rows = [{"race": race, "kind": kind, "task": a, "task_b": b, "estimate": float(point[m]),
             "low": np.nan if iv is None else iv.low, "high": np.nan if iv is None else iv.high, "p": np.nan,
             "n_photos": n, "reason": reason if iv is None else iv.reason}
            for m, ((a, b, kind), iv) in enumerate(zip(labels, ivs))]
    theta = point[:k]
    with np.errstate(invalid="ignore", divide="ignore"):  # a task with no spread (a constant answerer): NaN
        e = X[complete] / np.sqrt(SS.sum(0) / DF.sum(0))
    D = np.column_stack([e[:, i] - e[:, j] for i, j in pairs]) if pairs else np.zeros((n, 0))
    p = np.nan if few or k < 2 else sign_flip_max_t(D, boot.n_permutations, boot.seed)
    spread = float(np.nanmax(theta) - np.nanmin(theta)) if np.isfinite(theta).any() else np.nan
    rows.append({"race": race, "kind": "joint", "task": "all", "task_b": "", "estimate": spread, "low": np.nan, "high": np.nan, "p": p,
                 "n_photos": n, "reason": reason or "estimate: the spread (max − min) of the effects across tasks; "
                                                   "its test is p (no interval for a range)"})
    return rows


def interaction_table(values: dict[str, pd.DataFrame], reference: str, boot: Boot) -> pd.DataFrame:
    """Every race's rows (race_rows) for the tasks in `values` (image_values), joint p adjusted over races."""
    tasks = sorted(values)
    units = pd.Index(sorted(set().union(*(set(v["unit"]) for v in values.values()))))
    ss = [within_photo_ss(values[t], units) for t in tasks]
    SS, DF = np.column_stack([s for s, _ in ss]), np.column_stack([d for _, d in ss])
    wide = [by_race_gender(values[t]) for t in tasks]
    rows = []
    for race in (r for r in RACES if r != reference):
        X = np.column_stack([race_contrasts(w, race, reference, units) for w in wide])
        rows += race_rows(race, tasks, X, SS, DF, boot)
    table = pd.DataFrame(rows, columns=COLUMNS)
    from biasaudit.stats.resample import p_adjust

    joint = table["kind"] == "joint"
    table.loc[joint, "p_adjusted"] = p_adjust(table.loc[joint, "p"].to_numpy(float), boot.p_adjust)
    return table.assign(p_adjust_method=boot.p_adjust)


def compute(answers: Answers, cfg: Any) -> Result:
    vlm = answers.vlm
    res = Result(f"{vlm}_interaction", f"{vlm}: does the race effect differ between tasks?{answers.tag}")
    values = image_values(answers, cfg)
    if len(values) < 2:
        res.status, res.reason = NO_DATA, f"fewer than two tasks with retained answers ({', '.join(values) or 'none'})"
        return res
    race_reference = dict((d, ref) for d, _, ref in references(cfg))["race"]
    table = interaction_table(values, race_reference, Boot.of(cfg))
    res.tables[f"{vlm}_task_interaction"] = table.assign(vlm=vlm)
    joint = table[table["kind"] == "joint"]
    res.metrics = {"tasks": sorted(values), "joint_p": dict(zip(joint["race"], joint["p"])),
                   "spread": dict(zip(joint["race"], joint["estimate"]))}
    res.notes.append("Effect of a race vs the reference race within gender, per task and source photo, in units of "
                     "the task's pooled within-photo SD (2AFC: order-averaged win share; MCQ: bracket value; salary: "
                     "log salary); joint p: sign-flip max-|t| test over photos that the effects are equal across "
                     "tasks.")
    return res
