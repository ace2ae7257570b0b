"""The referee run's PLANTED world: the papers' published numbers, planted at the papers' design, so that the
replication table can be checked against a known truth (`make referee`, docs/referee.md).

Every planted quantity is read from a row of data/reference/published/ (`load_published`): each row's
`statistic` names a PLANTER that turns the row's target (value, relation, model, category, group, subset)
into a constraint or a setting of the planted world. A row added to the published CSVs with a statistic
that has a planter is planted by adding data; a row whose statistic has none is listed by `unplanted`
with the reason, and the replication table's referee check names it.

Method A (no pixels: rendering 45,000 images adds nothing a row checks): for each of the three planted
"generators" (named as the paper's) and each prompt of the prompts stage, the classifier's label counts
are planted as round(N · q_p) with q_p = softmax(log b_p + θ[model, category]), b_p the prompt's benchmark
shares; θ is solved (`solve_representation`) so that the mean per-prompt TVD, the mean deviations, the
label counts and the per-prompt TVD bounds of the rows hold. Each face's L* is planted per model × label
at exact quantiles of a normal whose mean is the row's (L_mean), so the sample mean is the target.
The tables are written as the generate, classify and faces stages write them (same columns), every row
labelled PLANTED (`backend` referee-planted, `stand_in` true). Nothing here is a model.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.report.replication import subset_of

PLANTED = "PLANTED"
BACKEND = "referee-planted"
PROFILE = "referee"
DIRECTION_MARGIN = 0.05   # a claimed sign is planted this far beyond its bound (share units)
TVD_BOUND_MARGIN = 0.04   # a claimed per-prompt TVD bound is planted this far below it
DEFAULT_L = {"white": (66.0, 5.0), "black": (40.0, 8.0), "asian": (62.0, 5.0), "hispanic": (56.0, 5.0),
             "other": (52.0, 5.0)}  # L* (mean, sd) of a label no row names (our choice, docs/referee.md)
L_RANGE = (15.0, 85.0)


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


# ------------------------------------------------------------------------------ the world

@dataclass
class World:
    """What the planters set: the models, the representation constraints, L* per model × label."""

    models: list[str]
    groups: tuple[str, ...]
    images_per_prompt: int
    constraints: list[dict[str, Any]] = field(default_factory=list)  # representation rows (see solve_representation)
    L: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)  # (model, label) → (mean, sd)
    # (model, label, category) → L* per analyze.earnings_unit_usd of the prompt's median weekly earnings
    earnings_slope: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # embeddings: (model, space, 'race'|'L_bin', group) → target mean intra-group cosine ('intra') or gap ('gap')
    similarity: dict[tuple[str, str, str, str], tuple[str, float]] = field(default_factory=dict)
    bin_counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, L bin) → faces planted in it
    planted: dict[str, str] = field(default_factory=dict)    # row id → what was planted
    unplanted: dict[str, str] = field(default_factory=dict)  # row id → why not


def _models_of(row: Mapping[str, Any], world: World) -> list[str]:
    m = str(row["run_model"])
    return list(world.models) if m == "*" else [m]


def _constraint(kind: str) -> Callable[[World, Mapping[str, Any]], str]:
    def plant(world: World, row: Mapping[str, Any]) -> str:
        for m in _models_of(row, world):
            world.constraints.append({"kind": kind, "model": m, "row": dict(row)})
        return f"representation constraint {kind} ({row['relation']} {row['value']})"
    return plant


def plant_L_mean(world: World, row: Mapping[str, Any]) -> str:
    for m in _models_of(row, world):
        sd = world.L.get((m, row["group"]), DEFAULT_L.get(str(row["group"]), (50.0, 5.0)))[1]
        world.L[(m, str(row["group"]))] = (_num(row["value"]), sd)
    return f"L* of {row['group']} faces: exact normal quantiles, mean {row['value']}"


def plant_dark_share(world: World, row: Mapping[str, Any]) -> str:
    """'>' (most faces below the threshold are `group`): every other label's L* mean at least 4 sd above the
    threshold. '<': every other label's L* mean 1 sd below it, so the others' dark faces outnumber the group's."""
    below = _num(subset_of(row["subset"]).get("L_below"))
    for m in _models_of(row, world):
        for g in world.groups:
            if g == row["group"]:
                continue
            mean, sd = world.L.get((m, g), DEFAULT_L.get(g, (60.0, 5.0)))
            world.L[(m, g)] = (max(mean, below + 4 * sd), sd) if row["relation"] == ">" else (below - sd, sd)
    return (f"other labels' L* at least 4 sd above {below:g}" if row["relation"] == ">"
            else f"other labels' L* 1 sd below {below:g}")


def design_setting(what: str) -> Callable[[World, Mapping[str, Any]], str]:
    def plant(world: World, row: Mapping[str, Any]) -> str:
        return f"design: {what}"
    return plant


def plant_gap(world: World, row: Mapping[str, Any]) -> str:
    space = subset_of(row["subset"]).get("space", "")
    for m in _models_of(row, world):
        world.similarity[(m, space, "race", str(row["group"]))] = ("gap", _num(row["value"]))
    return f"{space} embeddings: a shared direction per label, weights solved for this gap"


def plant_bin_similarity(world: World, row: Mapping[str, Any]) -> str:
    space = subset_of(row["subset"]).get("space", "")
    for m in _models_of(row, world):
        world.similarity[(m, space, "L_bin", str(row["group"]))] = ("intra", _num(row["value"]))
    return f"{space} embeddings: a shared direction per L* bin, weights solved for this mean similarity"


def plant_bin_difference(world: World, row: Mapping[str, Any]) -> str:
    """The difference of two bins' similarities: the first bin planted at the second's plus the difference
    (planted after the bins' own rows, with which it agrees when the published numbers do)."""
    a, _, b = str(row["group"]).partition(" minus ")
    space = subset_of(row["subset"]).get("space", "")
    for m in _models_of(row, world):
        base = world.similarity.get((m, space, "L_bin", b), ("intra", 0.2))[1]
        world.similarity[(m, space, "L_bin", a)] = ("intra", base + _num(row["value"]))
    return f"{space} embeddings: bin {a} planted {row['value']} above bin {b}"


def plant_bin_count(world: World, row: Mapping[str, Any]) -> str:
    for m in _models_of(row, world):
        world.bin_counts[(m, str(row["group"]))] = int(round(_num(row["value"])))
    return f"exactly {row['value']} faces planted in L* bin {row['group']}"


STRONG_SLOPE = 2.0  # L* per earnings unit planted where a row claims a significant slope (p below its bound)


def plant_earnings(world: World, row: Mapping[str, Any]) -> str:
    """p above the bound (no significant slope): L* independent of earnings; below it: a strong slope."""
    slope = 0.0 if row["relation"] == ">" else STRONG_SLOPE
    for m in _models_of(row, world):
        world.earnings_slope[(m, str(row["group"]), str(row["category"]))] = slope
    return "L* independent of earnings (no slope planted)" if slope == 0 else f"a slope of {slope:g} L* per unit"


PLANTERS: dict[str, Callable[[World, Mapping[str, Any]], str]] = {
    "mean_tvd": _constraint("mean_tvd"), "mean_deviation": _constraint("mean_deviation"),
    "n_classified": _constraint("n_classified"), "prompt_tvd_max": _constraint("prompt_tvd_max"),
    "share_reaching": _constraint("share_reaching"),
    "L_mean": plant_L_mean, "dark_share": plant_dark_share, "earnings_slope_p": plant_earnings,
    "homogeneity_gap": plant_gap, "mean_similarity": plant_bin_similarity,
    "similarity_difference": plant_bin_difference, "n_in_bin": plant_bin_count,
    "n_prompts": design_setting("prompts.top_k (profiles/referee.yaml)"),
    "n_prompts_per_category": design_setting("prompts.top_k (profiles/referee.yaml)"),
    "images_per_prompt": design_setting("generate.images_per_prompt"),
    "n_models": design_setting("models: (profiles/referee.yaml)"),
    "n_categories": design_setting("prompts.categories"),
    "threshold_share": design_setting("analyze.threshold_share"),
    "n_labels": design_setting("the group set's labels"), "det_threshold": design_setting("faces.det_threshold"),
    "focus_images": design_setting("the planted FOCUS manifest: sources.photos_per_occupation × occupations × 10 groups"),
    "focus_occupations": design_setting("sources.occupations"), "focus_groups": design_setting("the ten groups"),
    "focus_races": design_setting("the five races"), "focus_genders": design_setting("the two genders"),
    "n_vlms": design_setting("vlms: (profiles/referee.yaml)"), "n_task_kinds": design_setting("reflect.tasks"),
    "two_afc_scenarios": design_setting("reflect.task_specs (the 2AFC tasks)"),
    "mcq_options": design_setting("the MCQ tasks' letter values (reflect.task_specs)"),
    "share_negative_delta_g": lambda world, row: (
        "the planted VLMs' declared MCQ salary shifts (params/vlm.py PlantedMCQ.shift): every non-White race's "
        "below White's"),
}


# statistics no planted model can set: the row reads reference data or a constant of the method
UNPLANTABLE: dict[str, str] = {
    "benchmark_share": "reads the reference data (data/reference/bls), not a model: the run shows the table's value",
    "parsing_classes": "a constant of the parsing network (faces/bisenet.py N_CLASSES), not a run output",
    "two_afc_images": "fixed by the task design (biasaudit.vlm.tasks), not a run output",
}
CANNOT_PLANT = "cannot be planted"


def plant_world(published: pd.DataFrame, models: list[str], groups: tuple[str, ...], images_per_prompt: int) -> World:
    """The planted world of the published rows: each row through its statistic's planter (in id order, a row's
    own value after the rows it refines)."""
    world = World(list(models), tuple(groups), int(images_per_prompt))
    rows = published.to_dict("records")
    # a row's own value after the rows it refines: bins before their difference, dark share before the L* means
    order = {"mean_similarity": 1, "similarity_difference": 2, "L_mean": 3}
    rows.sort(key=lambda r: (order.get(str(r["statistic"]), 0), r["id"]))
    for row in rows:
        planter = PLANTERS.get(str(row["statistic"]))
        if str(row["statistic"]) in UNPLANTABLE:
            world.unplanted[str(row["id"])] = f"{CANNOT_PLANT}: {UNPLANTABLE[str(row['statistic'])]}"
            continue
        if planter is None:
            world.unplanted[str(row["id"])] = f"no planter for the statistic {row['statistic']} (biasaudit.referee.PLANTERS)"
            continue
        if str(row["run_model"]) not in ("*", *models):
            world.unplanted[str(row["id"])] = f"the run has no model {row['run_model']}"
            continue
        world.planted[str(row["id"])] = planter(world, row)
    return world


# ------------------------------------------------------------------------------ representation

def _softmax_shares(bench: np.ndarray, theta: np.ndarray) -> np.ndarray:
    z = np.log(np.clip(bench, 1e-6, None)) + theta
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _threshold(published: pd.DataFrame, group: str) -> float:
    rows = published[(published["statistic"] == "threshold_share") & (published["group"] == group)]
    return _num(rows["value"].iloc[0]) if len(rows) else math.nan


@dataclass
class Representation:
    prompts: pd.DataFrame     # prompt_id, category, instance, benchmark columns
    theta: dict[tuple[str, ...], np.ndarray]  # (model, category, selected_for) → log weights of the groups
    shares: dict[str, np.ndarray]             # model → planted shares (prompt × group), continuous
    counts: dict[str, np.ndarray]             # model → planted label counts (prompt × group), integers
    residual: float
    x: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the solution (a warm start for a nearby world)


def largest_remainder(q: np.ndarray, n: int) -> np.ndarray:
    """Integer counts per row summing to n, closest to n·q (largest remainder)."""
    raw = q * n
    base = np.floor(raw).astype(int)
    short = n - base.sum(axis=1)
    order = np.argsort(-(raw - base), axis=1, kind="stable")
    for i, k in enumerate(short):
        base[i, order[i, :k]] += 1
    return base


def exact_total(counts: np.ndarray, shares: np.ndarray, g: int, total: int, n: int) -> None:
    """Move single images into or out of group g (from or to each prompt's largest other group), in the
    prompts whose rounding lost or gained the most, until group g counts `total` images (in place)."""
    gap = total - int(counts[:, g].sum())
    lost = shares[:, g] * n - counts[:, g]  # > 0 where rounding took images away from g
    for i in np.argsort(-lost if gap > 0 else lost, kind="stable")[:abs(gap)]:
        other = counts[i].copy()
        other[g] = -1
        j = int(np.argmax(other))
        step = 1 if gap > 0 else -1
        if counts[i, g] + step < 0:
            continue
        counts[i, g] += step
        counts[i, j] -= step


def solve_representation(world: World, prompts: pd.DataFrame, published: pd.DataFrame,
                         start: Representation | None = None) -> Representation:
    """θ[model, category, selected_for] (log weights of the groups, the first group's 0) solving the
    representation constraints in least squares, with hinges for the claimed bounds and a small ridge (the
    least distortion that meets the rows). One θ per cell of prompts selected for one group, so that a
    category can be distorted while the prompts a row names stay near their benchmark. Solved by L-BFGS on
    torch's exact gradient (the one place torch serves here: 180 parameters, no finite differences)."""
    import torch

    groups, models = world.groups, world.models
    cells = list(dict.fromkeys(zip(prompts["category"], prompts["selected_for"])))
    cell_idx = np.array([cells.index(c) for c in zip(prompts["category"], prompts["selected_for"])])
    bench = prompts[list(groups)].to_numpy(float)
    bench = bench / bench.sum(axis=1, keepdims=True)
    n_free = len(groups) - 1
    N = world.images_per_prompt
    size = len(cells) * n_free

    def rows_of(cat: str) -> np.ndarray:
        return np.ones(len(prompts), bool) if cat in ("all", "") else (prompts["category"] == cat).to_numpy()

    terms = []  # (model index, kind, selection, group index, target, relation)
    for c in world.constraints:
        row = c["row"]
        mi, t, rel = models.index(c["model"]), _num(row["value"]), str(row["relation"])
        g = groups.index(str(row["group"])) if str(row["group"]) in groups else -1
        sel = rows_of(str(row["category"]))
        if c["kind"] == "prompt_tvd_max":
            inst = subset_of(row["subset"]).get("instance", "").lower()
            sel = sel & (prompts["instance"].astype(str).str.lower() == inst).to_numpy()
        elif c["kind"] == "share_reaching":
            sel = bench[:, g] > _threshold(published, str(row["group"]))
        terms.append((mi, c["kind"], sel, g, t, rel))

    tb = torch.tensor(bench, dtype=torch.float64)
    logb = torch.log(tb.clamp_min(1e-6))
    cix = torch.tensor(cell_idx)
    tsel = [(mi, kind, torch.tensor(sel), g, t, rel) for mi, kind, sel, g, t, rel in terms]

    def shares_t(xm: Any) -> Any:
        th = torch.cat([torch.zeros(len(cells), 1, dtype=xm.dtype), xm.reshape(len(cells), n_free)], 1)
        return torch.softmax(logb + th[cix], dim=1)

    def hinge(v: Any, bound: float, rel: str) -> Any:
        return torch.relu(v - bound) if rel == "<" else torch.relu(bound - v)

    def loss(xm: Any, model: int) -> Any:
        p = shares_t(xm)
        out = [0.02 * xm]
        for mi, kind, sel, g, t, rel in tsel:
            if mi != model:
                continue
            if kind == "mean_tvd":
                out.append(((0.5 * (p[sel] - tb[sel]).abs().sum(1).mean() - t) / 0.003).reshape(1))
            elif kind == "mean_deviation":
                v = (p[sel, g] - tb[sel, g]).mean()
                r = (v - t) if rel == "=" else hinge(v, t - DIRECTION_MARGIN if rel == "<" else t + DIRECTION_MARGIN, rel)
                out.append((r / 0.003).reshape(1))
            elif kind == "n_classified":
                out.append(((N * p[:, g].sum() - t) / 3.0).reshape(1))
            elif kind == "prompt_tvd_max":
                v = 0.5 * (p[sel] - tb[sel]).abs().sum(1)
                out.append(hinge(v, t - TVD_BOUND_MARGIN if rel == "<" else t + TVD_BOUND_MARGIN, rel) / 0.003)
            elif kind == "share_reaching":
                # 0: every prompt above the threshold planted at most 60% of its benchmark share; 1: at least 140%
                out.append(torch.relu(p[sel, g] - 0.6 * tb[sel, g]) / 0.003 if t == 0 else
                           torch.relu(1.4 * tb[sel, g] - p[sel, g]) / 0.003)
        return torch.cat(out)

    # each model alone (no constraint joins two): a moved target of one model never moves another's world
    x0 = start.x if start is not None and start.x.shape == (len(models) * size,) else np.zeros(len(models) * size)
    solved, residual = [], 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 60 parameters a model: threads only add overhead
    try:
        for mi in range(len(models)):
            xm = torch.tensor(x0[mi * size:(mi + 1) * size], dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([xm], lr=1.0, max_iter=500, tolerance_grad=1e-8, tolerance_change=1e-10,
                                    history_size=50, line_search_fn="strong_wolfe")

            def closure(xm: Any = xm, opt: Any = opt, mi: int = mi) -> Any:
                opt.zero_grad()
                value = (loss(xm, mi) ** 2).sum()
                value.backward()
                return value

            for _ in range(2):
                opt.step(closure)
            solved.append(xm.detach())
            residual += float((loss(solved[-1], mi) ** 2).sum())
    finally:
        torch.set_num_threads(threads)
    xs = torch.cat(solved)

    def shares(xv: Any, mi: int) -> np.ndarray:
        return shares_t(torch.as_tensor(xv)[mi * size:(mi + 1) * size]).numpy()

    planted = {m: shares(xs, i) for i, m in enumerate(models)}
    counts = {m: largest_remainder(s, N) for m, s in planted.items()}
    for mi, kind, _sel, g, t, _rel in terms:  # a planted count is exact: rounding per prompt moved it
        if kind == "n_classified":
            exact_total(counts[models[mi]], planted[models[mi]], g, int(round(t)), N)
    theta = {(m, *cell): np.r_[0.0, xs.numpy()[i * size:(i + 1) * size].reshape(len(cells), n_free)[j]]
             for i, m in enumerate(models) for j, cell in enumerate(cells)}
    return Representation(prompts, theta, planted, counts, residual, xs.numpy().copy())


# ------------------------------------------------------------------------------ the tables

def _normal_quantiles(n: int, mean: float, sd: float) -> np.ndarray:
    from scipy.stats import norm

    if n == 0:
        return np.zeros(0)
    x = norm.ppf((np.arange(n) + 0.5) / n)
    x = x - x.mean()
    return np.clip(mean + sd * x, *L_RANGE)


EMBED_DIM = 64        # planted embedding width: the shared directions plus room for each face's own part
DEFAULT_SIMILARITY = 0.05  # the weight of a label's shared direction no row names (our choice)
SPACES = ("clip", "face")


def plant_bin_count_L(L: np.ndarray, labels: np.ndarray, world: World, m: str) -> np.ndarray:
    """Re-plant the L* quantiles of the darkest label so that exactly the target number of faces falls in the
    first L* bin (n_in_bin rows; the other labels' faces below it count as they are)."""
    edge = C.L_BIN_EDGES[0]
    k = world.bin_counts.get((m, C.L_BIN_LABELS[0]))
    if k is None:
        return L
    from scipy.stats import norm

    means = {g: world.L.get((m, g), DEFAULT_L.get(g, (55.0, 5.0)))[0] for g in world.groups}
    dark = min((g for g in world.groups if (labels == g).any()), key=lambda g: means[g])
    sel = labels == dark
    need = k - int((L[~sel] < edge).sum())
    n, mean = int(sel.sum()), means[dark]
    if not 0 < need < n / 2 or mean <= edge:
        return L
    x = norm.ppf((np.arange(n) + 0.5) / n)
    x -= x.mean()
    sd = (edge - mean) / ((x[need - 1] + x[need]) / 2)
    order = np.argsort(L[sel], kind="stable")  # keep each face's rank
    vals = np.empty(n)
    vals[order] = mean + sd * x
    out = L.copy()
    out[sel] = vals
    return out


def embedding_weights(labels: np.ndarray, bins: np.ndarray, world: World, m: str, space: str,
                      offsets: Mapping[tuple[str, str], float] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """The weights of each label's and each L* bin's shared direction, solved (least squares, linear in the
    weights) so that the planted gaps and bin similarities hold exactly in this model's faces:
    gap_g = a_g + Σ_b c_b (P_gb − Q_gb), intra_b = c_b + Σ_g a_g R_gb (pair shares of the planted faces)."""
    groups = [g for g in world.groups if (labels == g).any()]
    bin_names = [b for b in C.L_BIN_LABELS if (bins == b).any()]
    N = len(labels)
    n_gb = np.array([[np.sum((labels == g) & (bins == b)) for b in bin_names] for g in groups], float)
    n_g, n_b = n_gb.sum(1), n_gb.sum(0)
    P = n_gb * (n_gb - 1) / np.maximum(n_g * (n_g - 1), 1)[:, None]
    Q = n_gb * (n_b[None, :] - n_gb) / np.maximum(n_g * (N - n_g), 1)[:, None]
    Rb = n_gb * (n_gb - 1) / np.maximum(n_b * (n_b - 1), 1)[None, :]
    targets = {(by, grp): (kind, t + (offsets or {}).get((by, grp), 0.0))
               for (mm, sp, by, grp), (kind, t) in world.similarity.items() if mm == m and sp == space}
    free_a = [g for g in groups if ("race", g) in targets]
    free_c = [b for b in bin_names if ("L_bin", b) in targets]
    a = {g: DEFAULT_SIMILARITY for g in groups}
    c = {b: 0.0 for b in bin_names}
    if free_a or free_c:
        unknowns = [("a", g) for g in free_a] + [("c", b) for b in free_c]
        A, y = [], []
        for (by, grp), (_, t) in targets.items():
            row = np.zeros(len(unknowns))
            fixed = 0.0
            if by == "race" and grp in groups:
                gi = groups.index(grp)
                row[unknowns.index(("a", grp))] = 1.0
                for bj, b in enumerate(bin_names):
                    coef = P[gi, bj] - Q[gi, bj]
                    if ("c", b) in unknowns:
                        row[unknowns.index(("c", b))] += coef
                    else:
                        fixed += coef * c[b]
            elif by == "L_bin" and grp in bin_names:
                bj = bin_names.index(grp)
                row[unknowns.index(("c", grp))] = 1.0
                for gi, g in enumerate(groups):
                    if ("a", g) in unknowns:
                        row[unknowns.index(("a", g))] += Rb[gi, bj]
                    else:
                        fixed += Rb[gi, bj] * a[g]
            else:
                continue
            A.append(row)
            y.append(t - fixed)
        sol = np.linalg.lstsq(np.array(A), np.array(y), rcond=None)[0]
        for (kind, name), v in zip(unknowns, sol):
            (a if kind == "a" else c)[name] = float(np.clip(v, 0.0, 0.95))
    return a, c


def realised_similarity(X: np.ndarray, labels: np.ndarray, bins: np.ndarray, by: str, group: str) -> float:
    """The gap of a label ('race') or the mean intra-bin cosine ('L_bin') of unit rows X, from group sums."""
    sel = (labels if by == "race" else bins) == group
    n, N = int(sel.sum()), len(X)
    S_g, S = X[sel].sum(0, dtype=np.float64), X.sum(0, dtype=np.float64)
    intra = (S_g @ S_g - n) / (n * (n - 1))
    return float(intra - S_g @ (S - S_g) / (n * (N - n))) if by == "race" else float(intra)


def planted_embeddings(labels: np.ndarray, bins: np.ndarray, world: World, m: str, space: str,
                       rng: np.random.Generator, rounds: int = 4) -> np.ndarray:
    """Unit vectors √a_label·e_label + √c_bin·f_bin + √(1 − a − c)·z (e, f orthonormal shared directions, z each
    face's own direction orthogonal to them): the mean cosine of a pair is the sum of the weights it shares, up
    to the z parts' chance overlap, which a few rounds of re-solving against the realised values remove."""
    z = rng.normal(size=(len(labels), EMBED_DIM))
    targets = {(by, grp): t for (mm, sp, by, grp), (_, t) in world.similarity.items() if mm == m and sp == space}
    offsets: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        X = _embed(labels, bins, *embedding_weights(labels, bins, world, m, space, offsets), z)
        for (by, grp), t in targets.items():
            if ((labels if by == "race" else bins) == grp).sum() > 1:
                offsets[(by, grp)] = offsets.get((by, grp), 0.0) + t - realised_similarity(X, labels, bins, by, grp)
    return X.astype(np.float32)


def _embed(labels: np.ndarray, bins: np.ndarray, a: Mapping[str, float], c: Mapping[str, float],
           noise: np.ndarray) -> np.ndarray:
    names = [*a, *c]
    basis = np.eye(EMBED_DIM)[:len(names)]
    z = noise.copy()
    z[:, :len(names)] = 0.0
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    wa = np.array([a.get(x, 0.0) for x in labels])
    wc = np.array([c.get(x, 0.0) for x in bins])
    scale = np.sqrt(np.clip(1.0 - wa - wc, 0.0, 1.0))
    out = z * scale[:, None]
    for i, name in enumerate(names):
        w = np.sqrt(wa) * (labels == name) if name in a else np.sqrt(wc) * (bins == name)
        out += w[:, None] * basis[i]
    return out


def planted_tables(world: World, rep: Representation, seed: int, earnings_unit: float = 100.0
                   ) -> dict[str, dict[str, pd.DataFrame]]:
    """Per model: the generate manifest, the classifier's labels and the faces table (L*, C*, hue, L bin)."""
    from biasaudit.faces.colour import ita_degrees
    from biasaudit.pipeline.provenance import derive_seed

    out: dict[str, dict[str, pd.DataFrame]] = {}
    prompts = rep.prompts
    for m in world.models:
        rng = np.random.default_rng(derive_seed(seed, "referee", m))
        counts = rep.counts[m]
        per_image = np.repeat(np.arange(len(prompts)), counts.sum(axis=1))
        labels = np.concatenate([rng.permutation(np.repeat(np.asarray(world.groups, dtype=object), c)) for c in counts])
        index = np.concatenate([np.arange(c.sum()) for c in counts])
        pids = prompts["prompt_id"].to_numpy(dtype=object)[per_image]
        extra = np.asarray([f'{{"planted_shares": {list(map(float, q))}}}' for q in rep.shares[m]], dtype=object)
        df = pd.DataFrame({"image_id": [f"{m}-{p}-{i:03d}" for p, i in zip(pids, index)], "prompt_id": pids,
                           "prompt": prompts["prompt"].to_numpy(dtype=object)[per_image], "index": index,
                           "label": labels, "extra": extra[per_image]})
        df["L"] = np.nan
        for g in world.groups:
            sel = (df["label"] == g).to_numpy()
            mean, sd = world.L.get((m, g), DEFAULT_L.get(g, (55.0, 5.0)))
            vals = _normal_quantiles(int(sel.sum()), mean, sd)
            df.loc[sel, "L"] = rng.permutation(vals)
        df["L"] = plant_bin_count_L(df["L"].to_numpy(float), df["label"].to_numpy(object), world, m)
        for (mm, g, cat), slope in world.earnings_slope.items():
            if mm != m or slope == 0 or "median_weekly_earnings_usd" not in prompts:
                continue
            earn = df["prompt_id"].map(prompts.set_index("prompt_id")["median_weekly_earnings_usd"]).astype(float)
            sel = ((df["label"] == g) & df["prompt_id"].map(prompts.set_index("prompt_id")["category"]).eq(cat)
                   & earn.notna()).to_numpy()
            shift = slope * (earn[sel] - earn[sel].mean()) / earnings_unit
            df.loc[sel, "L"] = np.clip(df.loc[sel, "L"] + shift, *L_RANGE)
        hue = 55.0 + rng.normal(0.0, 3.0, len(df))
        chroma = 18.0 + rng.normal(0.0, 2.0, len(df))
        a, b = chroma * np.cos(np.radians(hue)), chroma * np.sin(np.radians(hue))
        common = {"model": m, "stand_in": True}
        manifest = pd.DataFrame({
            "image_id": df["image_id"], **common, "backend": BACKEND,
            "model_id": f"{PLANTED} referee world (data/reference/published), not a model",
            "model_revision": "referee v1", "prompt_id": df["prompt_id"], "prompt": df["prompt"],
            "template_version": "v1", "seed": 0, "seed_used": False, "index": df["index"], "width": 0, "height": 0,
            "sha256": "", "path": "", "status": C.OK, "reason": "", "retries": 0, "created_at": "", "libraries": "",
            "settings": "", "extra": df["extra"],
            "config_hash": "", "model_version": "", "planted_label": df["label"], "planted_L": df["L"],
            "planted_hue": hue})
        labels = pd.DataFrame({
            "image_id": df["image_id"], "model": m, "prompt_id": df["prompt_id"], "label": df["label"],
            "status": C.OK, "reason": "", "raw_answer": df["label"], "backend": BACKEND,
            "classifier_model_id": f"{PLANTED} classifier labels (referee world)", "classifier_revision": "referee v1",
            "instruction_version": "v1", "from_cache": False, "stand_in": True, "option_probs": "",
            "tokens_in": 0, "tokens_out": 0, "model_version": ""})
        faces = pd.DataFrame({
            "image_id": df["image_id"], "model": m, "prompt_id": df["prompt_id"], "n_faces": 1, "det_score": 0.99,
            "bbox": "", "image_scale": 1.0, "skin_pixels": 1000, "mean_r": np.nan, "mean_g": np.nan,
            "mean_b": np.nan, "L": df["L"].astype(float), "a": a, "b": b, "C": chroma, "h": hue,
            "ita": ita_degrees(np.column_stack([df["L"].to_numpy(float), a, b])), "L_bin": C.l_bin(df["L"].to_numpy(float)),
            "status": C.OK, "reason": "", "face_backend": BACKEND, "face_model_id": f"{PLANTED} L* (referee world)",
            "face_revision": "referee v1", "skin_backend": BACKEND, "skin_model_id": PLANTED,
            "skin_revision": "", "stand_in": True, "cross_detector": "none", "cross_n_faces": np.nan,
            "cross_det_score": np.nan, "cross_L": np.nan})
        bins = faces["L_bin"].to_numpy(object)
        emb = {sp: planted_embeddings(df["label"].to_numpy(object), bins, world, m, sp, rng) for sp in SPACES}
        index = pd.DataFrame({"image_id": df["image_id"], "clip_row": np.arange(len(df)), "face_row": np.arange(len(df))})
        out[m] = {"manifest": manifest, "labels": labels, "faces": faces, "index": index, **emb}
    return out


def write_tables(tables: Mapping[str, Mapping[str, pd.DataFrame]], root: Path, images_dir: Path) -> list[Path]:
    from biasaudit.pipeline.io import atomic_write_table

    written = []
    for m, t in tables.items():
        written.append(atomic_write_table(t["manifest"], Path(root) / images_dir / m / "manifest.parquet"))
        written.append(atomic_write_table(t["labels"], Path(root) / C.labels_path(m)))
        written.append(atomic_write_table(t["faces"], Path(root) / C.faces_path(m)))
        folder = Path(root) / C.embeddings_dir(m)
        folder.mkdir(parents=True, exist_ok=True)
        for space in SPACES:
            np.save(folder / f"{space}.npy", t[space])
            written.append(folder / f"{space}.npy")
        written.append(atomic_write_table(t["index"], folder / "index.parquet"))
    return written


def build(root: Path, cfg: Any, published: pd.DataFrame) -> tuple[World, Representation,
                                                                   dict[str, dict[str, pd.DataFrame]]]:
    prompts = pd.read_csv(Path(root) / cfg.generate.prompts_file, dtype={"prompt_id": str})

    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt)
    rep = solve_representation(world, prompts, published)
    return world, rep, planted_tables(world, rep, cfg.seed, cfg.analyze.earnings_unit_usd)


# ------------------------------------------------------------------------------ Method B

def focus_units(cfg: Any) -> pd.DataFrame:
    """The source photos of the referee design: sources.photos_per_occupation of each of sources.occupations."""
    return pd.DataFrame([{"unit": f"{occ}/{occ}-{k:02d}", "occupation": occ, "base_id": f"{occ}-{k:02d}"}
                         for occ in cfg.sources.occupations for k in range(cfg.sources.photos_per_occupation)])


def planted_focus(cfg: Any) -> pd.DataFrame:
    """The FOCUS manifest of the design: one edit per source photo × group (every edit ok: the published 480
    images are the constructed set), and the null-edit control's two images per photo when it is on."""
    from biasaudit.vlm.groups import COUNTERFACTUAL, GROUPS, NULL_EDIT, ORIGINAL, group_code

    rows = []
    for u in focus_units(cfg).itertuples():
        for race, gender in GROUPS:
            rows.append({"edit_id": f"{u.unit}/{race}_{gender}", "occupation": u.occupation, "base_id": u.base_id,
                         "race": race, "gender": gender, "group": group_code(race, gender), "arm": COUNTERFACTUAL})
        if cfg.counterfactuals.null_edit:
            rows += [{"edit_id": f"{u.unit}/{arm}", "occupation": u.occupation, "base_id": u.base_id, "race": None,
                      "gender": None, "group": arm, "arm": arm} for arm in (NULL_EDIT, ORIGINAL)]
    df = pd.DataFrame(rows)
    return df.assign(path="", status=C.OK, reason="", backend=BACKEND, model_id=f"{PLANTED} FOCUS edits (referee world)",
                     stand_in=True)


def planted_responses(cfg: Any, vlm: str) -> pd.DataFrame:
    """One planted VLM's REFLECT answers for the referee design, drawn by vlm.planted.simulate_responses (the
    same draws as the planted backend) from the VLM's declared effects (vlms.<vlm>.planted)."""
    from biasaudit.pipeline.provenance import derive_seed
    from biasaudit.vlm.declared import of_kind
    from biasaudit.vlm.planted import simulate_responses

    spec, r = cfg.vlms[vlm], cfg.reflect
    rng = np.random.default_rng(derive_seed(cfg.seed, "referee", vlm))
    units = focus_units(cfg)
    df = simulate_responses(spec.planted, units, rng, two_afc_tasks=tuple(of_kind(r, "2afc")),
                            mcq_tasks=tuple(of_kind(r, "mcq")), salary=bool(of_kind(r, "salary")),
                            both_orders=r.both_orders, placebo_two_afc_tasks=tuple(of_kind(r, "2afc", placebo=True)),
                            placebo_mcq_tasks=tuple(of_kind(r, "mcq", placebo=True)), controls=cfg.counterfactuals.null_edit)
    base = df["unit"].str.split("/").str[1]
    return df.assign(base_id=base, vlm=vlm, backend=spec.backend, model_id=spec.model_id, revision="referee v1",
                     stand_in=True, reason="", prompt_version=r.prompt_version,
                     item_id=[f"{vlm}-{i}" for i in range(len(df))])


def write_method_b(cfg: Any, root: Path) -> list[Path]:
    from biasaudit.pipeline.io import atomic_write_table

    written = [atomic_write_table(planted_focus(cfg), Path(root) / C.FOCUS_MANIFEST)]
    for vlm in cfg.vlms:
        written.append(atomic_write_table(planted_responses(cfg, vlm), Path(root) / C.responses_path(vlm)))
    return written


def planted_notes(world: World) -> dict[str, str]:
    """Row id → what the referee world planted for it, or why it planted nothing (the table's notes)."""
    return {**{k: f"{PLANTED}: {v}" for k, v in world.planted.items()},
            **{k: v if v.startswith(CANNOT_PLANT) else f"not planted: {v}" for k, v in world.unplanted.items()}}


def verify(cfg: Any, published: pd.DataFrame, reports: Path = C.REPORTS) -> int:
    """Build the replication table of the referee run (reports/replication.csv and its page) and print every
    row that is not recovered; 0 when each row is covered or a named chance miss."""
    from biasaudit.report.replication import CHANCE_MISS, build_replication
    from biasaudit.vlm.declared import answer_values

    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt)
    table = build_replication(
        Path(reports), C.PUBLISHED_DIR, cfg.profile, cfg.stand_ins(), groups=cfg.groups,
        design={"faces.detector": cfg.faces.detector, "faces.det_threshold": cfg.faces.det_threshold,
                "faces.skin_method": cfg.faces.skin_method},
        options={label: v for label, v in answer_values(cfg.reflect, placebo=False).items() if v is not None},
        level=cfg.analyze.ci_level, title=cfg.report.title, planted=planted_notes(world))
    keep = Path(reports) / "referee"  # kept after `make referee` switches back (the profile stash takes reports/)
    keep.mkdir(parents=True, exist_ok=True)
    for src in (Path(reports) / C.REPLICATION_CSV.relative_to(C.REPORTS), Path(reports) / "pages" / C.REPLICATION_PAGE):
        if src.exists():
            (keep / src.name).write_bytes(src.read_bytes())
    cov = table["covered"].astype(str).str.lower()
    chance = table["note"].astype(str).str.contains(CHANCE_MISS)
    unplantable = table["note"].astype(str).str.contains(CANNOT_PLANT)
    bad = table[(cov != "true") & ~chance & ~unplantable]
    print(f"referee run: {len(table)} rows; {int((cov == 'true').sum())} recovered, {int(chance.sum())} named chance "
          f"miss(es), {int((unplantable & (cov != 'true')).sum())} that cannot be planted (each says why), {len(bad)} "
          f"not recovered ({keep}/replication.csv, {keep}/replication.html)")
    for r in bad.itertuples():
        print(f"  {r.id} {r.statistic} {r.model} {r.category} {r.group}: published {r.relation} {r.published}, "
              f"run {r.this_run} [{r.low}, {r.high}] — {str(r.note)[len(''):300]}")
    return 1 if len(bad) else 0


def main(argv: list[str] | None = None) -> int:
    from biasaudit.config import load_params
    from biasaudit.report.replication import load_published

    parser = argparse.ArgumentParser(prog="python -m biasaudit.referee", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write", help="write the planted Method A tables of the referee profile")
    sub.add_parser("verify", help="build the replication table of this run and check every row (exit 1 if one fails)")
    args = parser.parse_args(argv)
    cfg = load_params()
    if cfg.profile != PROFILE:
        print(f"params.yaml is in profile '{cfg.profile}', not '{PROFILE}': run `biasaudit profile {PROFILE}` first",
              file=sys.stderr)
        return 2
    published = load_published(Path(C.PUBLISHED_DIR))
    if args.command == "verify":
        return verify(cfg, published)
    if args.command == "write":
        world, rep, tables = build(Path("."), cfg, published)
        for path in [*write_tables(tables, Path("."), Path(cfg.generate.images_dir)), *write_method_b(cfg, Path("."))]:
            print(f"{PLANTED}: wrote {path}")
        print(f"planted {len(world.planted)} rows; not planted: {len(world.unplanted)} "
              f"({', '.join(sorted(world.unplanted))}); solver residual {rep.residual:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
