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
import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.report.replication import CANNOT_PLANT, subset_of

PLANTED = "PLANTED"
BACKEND = "referee-planted"
PROFILE = "referee"
# A claimed sign of a mean deviation is planted beyond its bound by the margin (claim_margin) at which the reader's
# interval at the design's level (the referee profile's analyze.ci_level) lies beyond the bound with probability
# CLAIM_POWER. A fixed margin of 0.05 left A50 (Flux's White over the benchmark) inside its ± 0.058 interval.
CLAIM_LEVEL, CLAIM_POWER = 0.95, 0.95
# A row reading one label's faces within a category (A23's earnings slope, A63's share-of-women slope) keeps the
# label's mean share over the category's prompts at least this share of the benchmark's: the paper fitted those
# slopes, so it had those faces (planting_misses checks it). Without it the solve met A47 (Flux's Black under the
# benchmark) by planting 8 Black faces in Flux's 50 occupations, and A63 read 0.14 [−0.83, 1.10] against a planted 3.
SUPPORT_SHARE = 0.25
PROMPT_MARGIN = 0.2       # a claimed sign of one prompt's share − benchmark (100 images: Wilson ± 0.09 at 0.25)
# … and at most PROMPT_BAND further: the solve met A46/A47 (SD's and Flux's Black under the benchmark) by emptying
# "Charles" of Black faces (−0.55 on the tests' compact prompts), whose own θ no band holds
PROMPT_BAND = 0.05
EXTREME_GAP = 0.15        # a model claimed the extreme of the models: every other this far from it (share or TVD),
NEAR_BENCHMARK = 0.9      # … (the smallest deviation) the others' share in every prompt within 10% of the benchmark's
WOMEN_SLOPE = 3.0         # L* per 10 points of women planted where a row claims a positive slope (A63)
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
    # the raters' agreement (reliability stage): ('kappa', kind) / ('fleiss', group, raters) /
    # ('disagree', group, against) / ('split', group, against) → target (see planted_ratings)
    agreement: dict[tuple[str, ...], float] = field(default_factory=dict)
    L_rows: set[tuple[str, str]] = field(default_factory=set)  # (model, label) whose L* mean a row sets
    common: dict[tuple[str, str], float] = field(default_factory=dict)  # (model, space) → weight shared by every face
    bin_rows: set[tuple[str, str, str]] = field(default_factory=set)  # (model, space, L bin) a mean_similarity row sets
    # (model, label, category) → L* per 10 points of women, orthogonal to the prompt's earnings (women_share_slope)
    women_slope: dict[tuple[str, str, str], float] = field(default_factory=dict)
    instances: set[str] | None = None  # the run's prompt instances (lower case), where known (prompt_deviation)
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
        world.L_rows.add((m, str(row["group"])))
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
        world.bin_rows.add((m, space, str(row["group"])))
    return f"{space} embeddings: a shared direction per L* bin, weights solved for this mean similarity"


def plant_bin_difference(world: World, row: Mapping[str, Any]) -> str:
    """The difference of two bins' similarities (planted after the bins' own rows): implied where both bins have
    a row (the published numbers agree: 0.405 − 0.183 = 0.222), else the bin without a row planted from the other
    (the first at the second's plus the difference, or the second at the first's minus it)."""
    a, _, b = str(row["group"]).partition(" minus ")
    space = subset_of(row["subset"]).get("space", "")
    d = _num(row["value"])
    for m in _models_of(row, world):
        own = {x for x in (a, b) if (m, space, x) in world.bin_rows}
        if own == {a, b}:
            continue
        if a in own:
            world.similarity[(m, space, "L_bin", b)] = ("intra", world.similarity[(m, space, "L_bin", a)][1] - d)
        else:
            base = world.similarity.get((m, space, "L_bin", b), ("intra", 0.2))[1]
            world.similarity[(m, space, "L_bin", a)] = ("intra", base + d)
    if all((m, space, x) in world.bin_rows for m in _models_of(row, world) for x in (a, b)):
        return IMPLIED + f"the {space} similarities planted for bins {a} and {b} (their own rows)"
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
        world.constraints.append({"kind": "support", "model": m, "row": dict(row)})
    return "L* independent of earnings (no slope planted)" if slope == 0 else f"a slope of {slope:g} L* per unit"


SPLIT_TARGET = 0.8  # a claimed majority of one side of a human–classifier split (> 0.5) is planted at this share


def plant_kappa(world: World, row: Mapping[str, Any]) -> str:
    kind = subset_of(row["subset"]).get("kind", "")
    world.agreement[("kappa", kind)] = _num(row["value"])
    return f"planted raters: mean Cohen's κ {kind} {row['value']} (biasaudit.referee.planted_ratings)"


def plant_fleiss(world: World, row: Mapping[str, Any]) -> str:
    raters = subset_of(row["subset"]).get("raters", "all")
    world.agreement[("fleiss", str(row["group"]), raters)] = _num(row["value"])
    return f"planted raters: Fleiss' κ of {row['group']} vs the rest ({raters}) {row['value']}"


def plant_disagreement(world: World, row: Mapping[str, Any]) -> str:
    against = subset_of(row["subset"]).get("against", "")
    world.agreement[("disagree", str(row["group"]), against)] = _num(row["value"])
    return f"planted raters: {row['value']} of the disagreements on {row['group']} against {against}"


def plant_split(world: World, row: Mapping[str, Any]) -> str:
    """Of the human–classifier splits between `group` and `against`, the share where the human says `group`:
    planted at SPLIT_TARGET (or 1 − it for the opposite claim)."""
    against = subset_of(row["subset"]).get("against", "")
    share = SPLIT_TARGET if row["relation"] == ">" else 1.0 - SPLIT_TARGET
    world.agreement[("split", str(row["group"]), against)] = share
    return f"planted raters: {share:g} of the human {row['group']} / classifier {against} splits the human's {row['group']}"


GAP_EXTREME_MARGIN = 0.03  # a label claimed the most self-similar: its gap this far above every other label's
COMMON_SIMILARITY = 0.02   # a model claimed the most diverse: every other model's faces share a direction this heavy
L_EXTREME_SHIFT = 3.0      # a model claimed the lightest: the L* of its labels no L_mean row sets, raised by this


def plant_group_extreme(world: World, row: Mapping[str, Any]) -> str:
    """The row's label has the largest homogeneity gap of its model: planted GAP_EXTREME_MARGIN above every
    other label's planted gap (the default where no row names it), or kept where its own row already is."""
    sub = subset_of(row["subset"])
    space, g = sub.get("space", "face"), str(row["group"])
    for m in _models_of(row, world):
        others = [t for (mm, sp, by, grp), (_, t) in world.similarity.items()
                  if mm == m and sp == space and by == "race" and grp != g]
        own = world.similarity.get((m, space, "race", g))
        if row["relation"] == ">":
            target = max([DEFAULT_SIMILARITY, *others]) + GAP_EXTREME_MARGIN
            if own is None or own[1] < target:
                world.similarity[(m, space, "race", g)] = ("gap", target)
        else:  # the opposite claim (a moved target): below some other label's
            world.similarity[(m, space, "race", g)] = ("gap", max(0.0, max([DEFAULT_SIMILARITY, *others])
                                                                  - GAP_EXTREME_MARGIN))
    return (f"{space} embeddings: the {g} gap {GAP_EXTREME_MARGIN:g} "
            f"{'above every' if row['relation'] == '>' else 'below the largest'} other label's")


def plant_model_extreme(world: World, row: Mapping[str, Any]) -> str:
    """The row's model is the extreme of the models on a measure. face_similarity (the smallest): every other
    model's faces share one more direction of weight COMMON_SIMILARITY (its gaps unchanged, its bins' similarities
    re-solved); L_mean (the largest): the model's labels that no L_mean row sets lightened by L_EXTREME_SHIFT.
    The skin-tone diversity claims follow from the planted L* (SD's Black L* sd and mean far from its other labels;
    Imagen's labels the closest) and are read, not planted. A mean deviation or mean TVD: an `extreme` constraint
    of the representation solve (solve_representation: the claimed model's value, then the others' bounds)."""
    sub = subset_of(row["subset"])
    measure, m, claim = sub.get("measure", ""), str(row["run_model"]), row["relation"] == ">"
    if measure == "face_similarity" and sub.get("extreme") == "min":
        space = sub.get("space", "face")
        for other in world.models:  # the opposite claim (a moved target): the model's own faces share it
            if (other != m) == claim:
                world.common[(other, space)] = COMMON_SIMILARITY
        return (f"{space} embeddings: {'every other' if claim else 'this'} model's faces share a direction of "
                f"weight {COMMON_SIMILARITY:g}")
    if measure == "L_mean" and sub.get("extreme") == "max":
        shift = L_EXTREME_SHIFT if claim else -L_EXTREME_SHIFT
        for g in world.groups:
            if (m, g) not in world.L_rows:
                mean, sd = world.L.get((m, g), DEFAULT_L.get(g, (55.0, 5.0)))
                world.L[(m, g)] = (mean + shift, sd)
        return f"L* of the labels no L_mean row sets moved by {shift:+g}"
    if measure == "diversity_de2000":
        return IMPLIED + "the planted L* (biasaudit.referee.DEFAULT_L and the L_mean rows)"
    if measure in ("mean_deviation", "mean_tvd"):
        world.constraints.append({"kind": "extreme", "model": m, "row": dict(row)})
        side = "below" if sub.get("extreme") == "min" else "above"
        return (f"{measure} of {row['category']} {row['group'] or ''}: every other model planted {EXTREME_GAP:g} "
                f"{side if claim else 'beyond'} this model's (two solves: the claimed model's value, then the others' "
                "bounds from it)").replace("  ", " ")
    raise NotPlanted(f"model_extreme of {measure} has no planter")


def plant_prompt_deviation(world: World, row: Mapping[str, Any]) -> str:
    """One prompt's share of a label against its benchmark: the prompt gets its own θ (solve_representation),
    its share planted PROMPT_MARGIN beyond the benchmark on the claimed side."""
    inst = subset_of(row["subset"]).get("instance", "")
    if world.instances is not None and inst.lower() not in world.instances:
        raise NotPlanted(f"{CANNOT_PLANT}: the prompt {inst!r} is not among this run's prompts (the prompts stage's "
                         "selection rule at the referee profile's settings does not select it), so no share of it is "
                         "generated; the row reads not computed")
    for m in _models_of(row, world):
        world.constraints.append({"kind": "prompt_share", "model": m, "row": dict(row)})
    return (f"the prompt {inst!r} on its own θ: its {row['group']} share {PROMPT_MARGIN:g} "
            f"{'below' if row['relation'] == '<' else 'above'} the benchmark")


def plant_women_slope(world: World, row: Mapping[str, Any]) -> str:
    """L* of the label's faces in the category moved by WOMEN_SLOPE per 10 points of the prompt's share of women,
    taken orthogonal (over those faces) to the prompt's earnings, so the earnings slope of the same faces (A23)
    is the one planted without it; the opposite claim: −WOMEN_SLOPE."""
    slope = WOMEN_SLOPE if row["relation"] == ">" else -WOMEN_SLOPE
    for m in _models_of(row, world):
        world.women_slope[(m, str(row["group"]), str(row["category"]))] = slope
        world.constraints.append({"kind": "support", "model": m, "row": dict(row)})
    return (f"L* of {row['group']} {row['category']} faces: {slope:+g} per 10 points of women, orthogonal to the "
            "prompt's earnings")


IMPLIED = "implied by "


class NotPlanted(Exception):
    """A planter's row it cannot plant (the reason is its message)."""


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
    "focus_null_edits": design_setting("counterfactuals.null_edit off (profiles/referee.yaml): the paper has no control arm"),
    "focus_originals": design_setting("counterfactuals.null_edit off (profiles/referee.yaml): the paper has no control arm"),
    "focus_occupations": design_setting("sources.occupations"), "focus_groups": design_setting("the ten groups"),
    "focus_races": design_setting("the five races"), "focus_genders": design_setting("the two genders"),
    "n_vlms": design_setting("vlms: (profiles/referee.yaml)"), "n_task_kinds": design_setting("reflect.tasks"),
    "two_afc_scenarios": design_setting("reflect.task_specs (the 2AFC tasks)"),
    "mcq_options": design_setting("the MCQ tasks' letter values (reflect.task_specs)"),
    "cohen_kappa": plant_kappa, "fleiss_kappa": plant_fleiss, "disagreement_share": plant_disagreement,
    "classifier_hispanic_for_white": plant_split,
    "group_extreme": plant_group_extreme, "model_extreme": plant_model_extreme,
    "prompt_deviation": plant_prompt_deviation, "women_share_slope": plant_women_slope,
    "vlms_with_disparity": lambda world, row: IMPLIED + (
        "the planted VLMs' declared group effects (params/vlm.py PlantedTwoAFC.strengths, PlantedMCQ.shift, "
        "PlantedSalary.effect)"),
    "vlms_with_task_variation": lambda world, row: IMPLIED + (
        "the planted VLMs' declared effects, which differ by task (PlantedTwoAFC.strengths per task, "
        "PlantedMCQ.shift per task)"),
    "closest_not_most_diverse": lambda world, row: IMPLIED + (
        "the planted TVDs (A07–A09: SD's the largest) and skin tones (SD's the most diverse)"),
    "reliability_sample": design_setting("reliability.sample_size images rated by the planted raters"),
    "n_raters": design_setting("reliability.raters (two planted raters)"),
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


def plant_world(published: pd.DataFrame, models: list[str], groups: tuple[str, ...], images_per_prompt: int,
                instances: Any = None) -> World:
    """The planted world of the published rows: each row through its statistic's planter (in id order, a row's
    own value after the rows it refines). `instances`: the run's prompt instances, where known (a row naming a
    prompt the run does not have cannot be planted)."""
    world = World(list(models), tuple(groups), int(images_per_prompt),
                  instances=None if instances is None else {str(x).lower() for x in instances})
    rows = published.to_dict("records")
    # a row's own value after the rows it refines: bins before their difference, dark share before the L* means
    order = {"mean_similarity": 1, "similarity_difference": 2, "group_extreme": 2, "L_mean": 3, "model_extreme": 4}
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
        try:
            world.planted[str(row["id"])] = planter(world, row)
        except NotPlanted as exc:
            world.unplanted[str(row["id"])] = str(exc)
    return world


# ------------------------------------------------------------------------------ representation

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
    # (solve, model index, the model's terms) → (its solution, its residual): kept by a solve started from here
    solved: dict[tuple[Any, ...], tuple[np.ndarray, float]] = field(default_factory=dict)


PLANTING_TOLERANCE = 0.01  # a planted mean TVD or deviation this far from its target is the world's miss
PLANTING_FILE = "planting_misses.json"  # beside the kept replication table (KEPT_DIR)
PLANTING_CHECKED = ("mean_tvd", "mean_deviation")  # the rows planting_misses can check from the planted counts
KEPT_DIR = C.REPORTS / "referee"  # what `make referee` keeps after switching back (the profile stash takes reports/)


def planting_misses(world: World, rep: Representation) -> dict[str, str]:
    """Row id → how the planted world itself misses the row (the representation solve cannot meet every row
    together): the mean TVD or mean deviation of the planted label counts against the benchmark more than
    PLANTING_TOLERANCE from a published value, or a claimed sign of a mean deviation less than its power's margin
    (claim_margin, less half PLANTING_TOLERANCE for the counts' rounding) beyond its bound, or a claimed TVD bound
    less than PLANTING_TOLERANCE beyond, or a slope of one label's faces (A23, A63) on fewer of them than
    SUPPORT_SHARE keeps. Such a row's miss is the world's, not chance (report.replication's referee_check never
    names it a chance miss)."""
    from biasaudit.report.replication import PLANTING_MISSED

    groups = list(world.groups)
    bench = rep.prompts[groups].to_numpy(float)
    bench = bench / bench.sum(axis=1, keepdims=True)
    out = {}
    for c in world.constraints:
        if c["kind"] not in (*PLANTING_CHECKED, "support"):
            continue
        row, p = c["row"], rep.counts[c["model"]] / world.images_per_prompt
        cat = str(row["category"])
        sel = np.ones(len(bench), bool) if cat in ("all", "") else (rep.prompts["category"] == cat).to_numpy()
        if c["kind"] == "support":  # the faces a slope of one label's faces is fitted on
            g = groups.index(str(row["group"]))
            v, need = float(p[sel, g].mean()), SUPPORT_SHARE * float(bench[sel, g].mean())
            if v < need - PLANTING_TOLERANCE / 2:
                out[str(row["id"])] = (f"{PLANTING_MISSED}: the planted {row['group']} share over the {cat} prompts "
                                       f"is {v:.4f}, below {SUPPORT_SHARE:g} of the benchmark's ({need:.4f}): too "
                                       "few faces for the row's slope")
            continue
        t, rel, beyond = _num(row["value"]), str(row["relation"]), PLANTING_TOLERANCE
        if c["kind"] == "mean_tvd":
            v = float(0.5 * np.abs(p[sel] - bench[sel]).sum(1).mean())
        else:
            g = groups.index(str(row["group"]))
            v = float((p[sel, g] - bench[sel, g]).mean())
            if rel != "=":  # the claim's power: its margin, less the rounding of the counts
                beyond = float(claim_margin(p[sel, g], bench[sel, g], world.images_per_prompt)) - PLANTING_TOLERANCE / 2
        missed = (abs(v - t) > PLANTING_TOLERANCE if rel == "=" else
                  v > t - beyond if rel == "<" else v < t + beyond)
        if missed:
            out[str(row["id"])] = (f"{PLANTING_MISSED}: the planted labels' {c['kind']} is {v:.4f}, the row says "
                                   f"{rel} {t:g}" + ("" if rel == "=" else f" by at least {beyond:.4f} (its power)")
                                   + f" (the representation solve's residual {rep.residual:.3g})")
    return out


def claim_margin(p: Any, b: Any, n_images: int) -> Any:
    """How far beyond its bound a claimed sign of a mean deviation over prompts is planted, so that the reader's
    interval lies beyond the bound with probability CLAIM_POWER: z·se_read + z_power·se_draw. The reader resamples
    the prompts, so its interval's half-width is z·se_read, z its percentile quantile at CLAIM_LEVEL (expanded for
    the number of prompts, stats.resample.expanded_alpha) and se_read the standard error of the mean of the
    per-prompt deviations p − b, their spread across the prompts plus each prompt's binomial draw of `n_images`
    labels; the estimate itself, the prompts being the design's, moves only with the draws (se_draw), z_power the
    normal quantile of CLAIM_POWER. At least PLANTING_TOLERANCE. numpy arrays or torch tensors (the solve's hinge)."""
    from biasaudit.stats.resample import expanded_alpha

    d = p - b
    n = d.shape[0]
    draw = (p * (1 - p)).mean() / n_images
    se_read, se_draw = ((((d - d.mean()) ** 2).mean() + draw) / n) ** 0.5, (draw / n) ** 0.5
    margin = NormalDist().inv_cdf(1 - expanded_alpha(CLAIM_LEVEL, n)) * se_read \
        + NormalDist().inv_cdf(CLAIM_POWER) * se_draw
    return (margin - PLANTING_TOLERANCE).clip(min=0) + PLANTING_TOLERANCE


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


SOLVE_STARTS = 4  # the solve from the benchmark (θ = 0) and from SOLVE_STARTS − 1 seeded random θ ~ N(0, 1)


def solve_representation(world: World, prompts: pd.DataFrame, published: pd.DataFrame,
                         start: Representation | None = None) -> Representation:
    """The least-residual of the solves (_solve) from the benchmark and from seeded random starts, or the one
    solve from `start`: from θ = 0 alone the referee world's solve saturated a softmax (SD's Hispanic surnames
    at a planted share of 1.0, where no gradient leads back), leaving A10 and A55 unplanted (residual 3,741; the
    random starts of seeds 0–2: 30, 7, 354)."""
    if start is not None:
        return _solve(world, prompts, published, start)
    solves = [_solve(world, prompts, published, None, seed) for seed in [None, *range(SOLVE_STARTS - 1)]]
    return min(solves, key=lambda r: r.residual)


def _solve(world: World, prompts: pd.DataFrame, published: pd.DataFrame, start: Representation | None = None,
           init_seed: int | None = None) -> Representation:
    """θ[model, category, selected_for] (log weights of the groups, the first group's 0) solving the
    representation constraints in least squares, with hinges for the claimed bounds and a small ridge (the
    least distortion that meets the rows). One θ per cell of prompts selected for one group, so that a
    category can be distorted while the prompts a row names stay near their benchmark; a prompt a
    row names (prompt_share, prompt_tvd_max) has a cell of its own. Solved by L-BFGS on torch's exact gradient (the one place
    torch serves here: a few hundred parameters, no finite differences).

    Each model is solved alone, so a claim that joins models (`extreme`: the claimed model is the largest or
    smallest of the models on a mean deviation or mean TVD) is planted in two solves: the first plants the
    claimed model EXTREME_GAP beyond the other models' own direction bounds on the same measure (where they
    have one); the second keeps the claimed model at least as extreme as it came out and bounds every other
    model EXTREME_GAP on the other side of that value (for the opposite claim, a moved target: beyond it). The
    smallest mean deviation (a model under-represents a label the most) bounds the others per prompt instead: each
    prompt's share within 1 − NEAR_BENCHMARK of its benchmark share either side, so that their per-prompt deviations, and with
    them their intervals, stay narrow (the reader's margin interval is built from the marginal ones).

    `start`: a solution to start from; a model whose terms (in either solve) are those it had in `start`'s solve
    keeps `start`'s solution of them (the same problem: a world with one model's row moved re-solves that model)."""
    import torch

    groups, models = world.groups, world.models
    named = {subset_of(c["row"]["subset"]).get("instance", "").lower() for c in world.constraints
             if c["kind"] in ("prompt_share", "prompt_tvd_max")}
    inst = prompts["instance"].astype(str).str.lower()
    keys = [(c, s_, i if i in named else "") for c, s_, i in zip(prompts["category"], prompts["selected_for"], inst)]
    cells = list(dict.fromkeys(keys))
    cell_idx = np.array([cells.index(k) for k in keys])
    bench = prompts[list(groups)].to_numpy(float)
    bench = bench / bench.sum(axis=1, keepdims=True)
    n_free = len(groups) - 1
    N = world.images_per_prompt
    size = len(cells) * n_free

    def rows_of(cat: str) -> np.ndarray:
        return np.ones(len(prompts), bool) if cat in ("all", "") else (prompts["category"] == cat).to_numpy()

    def group_of(row: Mapping[str, Any]) -> int:
        return groups.index(str(row["group"])) if str(row["group"]) in groups else -1

    terms = []  # (model index, kind, selection, group index, target, relation)
    extremes = []  # (claimed model index, measure, selection, group index, extreme, claim)
    for c in world.constraints:
        row = c["row"]
        mi, t, rel, g = models.index(c["model"]), _num(row["value"]), str(row["relation"]), group_of(row)
        sel = rows_of(str(row["category"]))
        if c["kind"] == "extreme":
            sub = subset_of(row["subset"])
            extremes.append((mi, sub.get("measure", ""), sel, g, sub.get("extreme", "max"), rel == ">"))
            continue
        if c["kind"] in ("prompt_tvd_max", "prompt_share"):
            sel = sel & (inst == subset_of(row["subset"]).get("instance", "").lower()).to_numpy()
        elif c["kind"] == "share_reaching":
            sel = bench[:, g] > _threshold(published, str(row["group"]))
        elif c["kind"] == "mean_deviation" and rel != "=":  # a claimed sign, planted with power (claim_margin)
            terms.append((mi, "power:mean_deviation", sel, g, t, rel))
            continue
        elif c["kind"] == "support":
            terms.append((mi, "support", sel, g, SUPPORT_SHARE, ">"))
            continue
        terms.append((mi, c["kind"], sel, g, t, rel))

    tb = torch.tensor(bench, dtype=torch.float64)
    logb = torch.log(tb.clamp_min(1e-6))
    cix = torch.tensor(cell_idx)

    def shares_t(xm: Any) -> Any:
        th = torch.cat([torch.zeros(len(cells), 1, dtype=xm.dtype), xm.reshape(len(cells), n_free)], 1)
        return torch.softmax(logb + th[cix], dim=1)

    def measure(p: Any, kind: str, sel: Any, g: int) -> Any:
        return (p[sel, g] - tb[sel, g]).mean() if kind == "mean_deviation" else \
            0.5 * (p[sel] - tb[sel]).abs().sum(1).mean()

    def hinge(v: Any, bound: float, rel: str) -> Any:
        return torch.relu(v - bound) if rel == "<" else torch.relu(bound - v)

    def loss(xm: Any, model: int, tsel: list) -> Any:
        p = shares_t(xm)
        out = [0.02 * xm]
        for mi, kind, sel, g, t, rel in tsel:
            if mi != model:
                continue
            if kind == "mean_tvd":
                out.append(((measure(p, kind, sel, g) - t) / 0.003).reshape(1))
            elif kind == "mean_deviation":  # a published value
                out.append(((measure(p, kind, sel, g) - t) / 0.003).reshape(1))
            elif kind.startswith("bound:"):  # an exact bound (a claim's margin already in it)
                out.append((hinge(measure(p, kind[6:], sel, g), t, rel) / 0.003).reshape(1))
            elif kind.startswith("power:"):  # a claimed sign, claim_margin beyond its bound
                beyond = claim_margin(p[sel, g], tb[sel, g], N)
                v = measure(p, kind[6:], sel, g)
                out.append((hinge(v, t - beyond if rel == "<" else t + beyond, rel) / 0.003).reshape(1))
            elif kind == "support":  # the label's faces over the category: at least t of the benchmark's
                out.append((torch.relu(t * tb[sel, g].mean() - p[sel, g].mean()) / 0.003).reshape(1))
            elif kind == "n_classified":
                out.append(((N * p[:, g].sum() - t) / 3.0).reshape(1))
            elif kind == "prompt_tvd_max":
                v = 0.5 * (p[sel] - tb[sel]).abs().sum(1)
                out.append(hinge(v, t - TVD_BOUND_MARGIN if rel == "<" else t + TVD_BOUND_MARGIN, rel) / 0.003)
            elif kind == "prompt_share":
                v = p[sel, g] - tb[sel, g]
                out.append(hinge(v, t - PROMPT_MARGIN if rel == "<" else t + PROMPT_MARGIN, rel) / 0.003)
                # and no further than PROMPT_BAND beyond that: a named prompt is no sink for a category's deviation
                far = PROMPT_MARGIN + PROMPT_BAND
                out.append(hinge(v, t - far if rel == "<" else t + far, ">" if rel == "<" else "<") / 0.003)
            elif kind == "prompt_band":  # every prompt's share within (1 − t) of its benchmark share, either side
                out.append(torch.relu((p[sel, g] - tb[sel, g]).abs() - (1 - t) * tb[sel, g]) / 0.003)
            elif kind == "share_reaching":
                # 0: every prompt above the threshold planted at most 60% of its benchmark share; 1: at least 140%
                out.append(torch.relu(p[sel, g] - 0.6 * tb[sel, g]) / 0.003 if t == 0 else
                           torch.relu(1.4 * tb[sel, g] - p[sel, g]) / 0.003)
        return torch.cat(out)

    done = start.solved if start is not None else {}
    memo: dict[tuple[Any, ...], tuple[np.ndarray, float]] = {}

    def solve(terms: list, x0: np.ndarray) -> tuple[Any, float]:
        tsel = [(mi, kind, torch.tensor(sel), g, t, rel) for mi, kind, sel, g, t, rel in terms]
        solved, residual = [], 0.0
        for mi in range(len(models)):
            key = (mi, size, tuple((kind, np.asarray(sel).tobytes(), g, float(t), rel)
                                   for mj, kind, sel, g, t, rel in terms if mj == mi))
            # the start's own problem for this model (a moved row of another model), or an earlier stage's: its
            # solution
            if key in done or key in memo:
                memo[key] = done.get(key) or memo[key]
                solved.append(torch.as_tensor(memo[key][0]))
                residual += memo[key][1]
                continue
            xm = torch.tensor(x0[mi * size:(mi + 1) * size], dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([xm], lr=1.0, max_iter=500, tolerance_grad=1e-8, tolerance_change=1e-10,
                                    history_size=50, line_search_fn="strong_wolfe")

            def closure(xm: Any = xm, opt: Any = opt, mi: int = mi) -> Any:
                opt.zero_grad()
                value = (loss(xm, mi, tsel) ** 2).sum()
                value.backward()
                return value

            for _ in range(2):
                opt.step(closure)
            solved.append(xm.detach())
            memo[key] = (solved[-1].numpy().copy(), float((loss(solved[-1], mi, tsel) ** 2).sum()))
            residual += memo[key][1]
        return torch.cat(solved), residual

    def value(xs: Any, mi: int, kind: str, sel: np.ndarray, g: int) -> float:
        with torch.no_grad():
            return float(measure(shares_t(xs[mi * size:(mi + 1) * size]), kind, torch.tensor(sel), g))

    x0 = (start.x if start is not None and start.x.shape == (len(models) * size,) else np.zeros(len(models) * size)
          if init_seed is None else np.random.default_rng(init_seed).normal(0.0, 1.0, len(models) * size))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 60 parameters a model: threads only add overhead
    try:
        xs, residual = solve(terms, x0)  # each model on its own rows
        # first solve: the claimed extreme EXTREME_GAP beyond the values the other models' own claimed signs on
        # its measure came out at (their planting margin depends on their planted spread: claim_margin)
        first = list(terms)
        for mi, kind, sel, g, ext, claim in extremes:
            own = [value(xs, mj, kind, sel, g) for mj, k, s_, gg, _t, rel in terms
                   if claim and mj != mi and k == f"power:{kind}" and gg == g and (s_ == sel).all()
                   and rel == (">" if ext == "max" else "<")]
            if own:
                bound = max(own) + EXTREME_GAP if ext == "max" else min(own) - EXTREME_GAP
                first.append((mi, f"bound:{kind}", sel, g, bound, ">" if ext == "max" else "<"))
        if len(first) > len(terms):
            xs, residual = solve(first, xs.numpy())
        if extremes:  # second solve: the others bounded from the claimed model's value
            second = list(first)
            for mi, kind, sel, g, ext, claim in extremes:
                v = value(xs, mi, kind, sel, g)
                up = (ext == "max") == claim  # the claimed model above the others
                second.append((mi, f"bound:{kind}", sel, g, v, ">" if up else "<"))
                for mj in range(len(models)):
                    if mj == mi:
                        continue
                    if kind == "mean_deviation" and ext == "min" and claim:  # the others near the benchmark in
                        own = [s_ for mk, k, s_, gg, _t, _r in terms if mk == mj and k == "prompt_share" and gg == g]
                        keep = sel & ~np.any(own, axis=0) if own else sel  # every prompt no row of its own sets
                        second.append((mj, "prompt_band", keep, g, NEAR_BENCHMARK, "="))
                    else:
                        second.append((mj, f"bound:{kind}", sel, g, v - EXTREME_GAP if up else v + EXTREME_GAP,
                                       "<" if up else ">"))
            xs, residual = solve(second, xs.numpy())
    finally:
        torch.set_num_threads(threads)

    def shares(xv: Any, mi: int) -> np.ndarray:
        return shares_t(torch.as_tensor(xv)[mi * size:(mi + 1) * size]).numpy()

    planted = {m: shares(xs, i) for i, m in enumerate(models)}
    counts = {m: largest_remainder(s, N) for m, s in planted.items()}
    for mi, kind, _sel, g, t, _rel in terms:  # a planted count is exact: rounding per prompt moved it
        if kind == "n_classified":
            exact_total(counts[models[mi]], planted[models[mi]], g, int(round(t)), N)
    theta = {(m, *cell): np.r_[0.0, xs.numpy()[i * size:(i + 1) * size].reshape(len(cells), n_free)[j]]
             for i, m in enumerate(models) for j, cell in enumerate(cells)}
    return Representation(prompts, theta, planted, counts, residual, xs.numpy().copy(), memo)


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
                fixed += world.common.get((m, space), 0.0)
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
        X = _embed(labels, bins, *embedding_weights(labels, bins, world, m, space, offsets), z,
                   world.common.get((m, space), 0.0))
        for (by, grp), t in targets.items():
            if ((labels if by == "race" else bins) == grp).sum() > 1:
                offsets[(by, grp)] = offsets.get((by, grp), 0.0) + t - realised_similarity(X, labels, bins, by, grp)
    return X.astype(np.float32)


def _embed(labels: np.ndarray, bins: np.ndarray, a: Mapping[str, float], c: Mapping[str, float],
           noise: np.ndarray, common: float = 0.0) -> np.ndarray:
    names = [*a, *c]
    basis = np.eye(EMBED_DIM)[:len(names) + 1]  # the last: the direction every face shares (weight `common`)
    z = noise.copy()
    z[:, :len(names) + 1] = 0.0
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    wa = np.array([a.get(x, 0.0) for x in labels])
    wc = np.array([c.get(x, 0.0) for x in bins])
    scale = np.sqrt(np.clip(1.0 - wa - wc - common, 0.0, 1.0))
    out = z * scale[:, None] + np.sqrt(common) * basis[len(names)]
    for i, name in enumerate(names):
        w = np.sqrt(wa) * (labels == name) if name in a else np.sqrt(wc) * (bins == name)
        out += w[:, None] * basis[i]
    return out


def planted_tables(world: World, rep: Representation, seed: int, earnings_unit: float = 100.0
                   ) -> dict[str, dict[str, pd.DataFrame]]:
    """Per model: the generate manifest, the classifier's labels and the faces table (L*, C*, hue, L bin)."""
    from biasaudit.faces.colour import ita_degrees
    from biasaudit.pipeline.provenance import derive_seed
    from biasaudit.t2i.analysis.skin import WOMEN_UNIT

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
        by_prompt = prompts.set_index("prompt_id")
        category = df["prompt_id"].map(by_prompt["category"])
        earn = df["prompt_id"].map(by_prompt["median_weekly_earnings_usd"]).astype(float) \
            if "median_weekly_earnings_usd" in prompts else None
        for (mm, g, cat), slope in world.earnings_slope.items():
            if mm != m or slope == 0 or earn is None:
                continue
            sel = ((df["label"] == g) & category.eq(cat) & earn.notna()).to_numpy()
            shift = slope * (earn[sel] - earn[sel].mean()) / earnings_unit
            df.loc[sel, "L"] = np.clip(df.loc[sel, "L"] + shift, *L_RANGE)
        for (mm, g, cat), slope in world.women_slope.items():
            if mm != m or earn is None or "pct_women" not in prompts:
                continue
            w = df["prompt_id"].map(by_prompt["pct_women"]).astype(float) / WOMEN_UNIT
            sel = ((df["label"] == g) & category.eq(cat) & w.notna() & earn.notna()).to_numpy()
            if sel.sum() < 3:
                continue
            wc, ec = w[sel] - w[sel].mean(), earn[sel] - earn[sel].mean()
            resid = wc - ec * float(wc @ ec) / float(ec @ ec)  # the share of women, orthogonal to earnings
            df.loc[sel, "L"] = df.loc[sel, "L"] + slope * resid.to_numpy()
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

    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt,
                        prompts["instance"])
    rep = solve_representation(world, prompts, published)
    return world, rep, planted_tables(world, rep, cfg.seed, cfg.analyze.earnings_unit_usd)


# ------------------------------------------------------------------------------ the raters

def _kappas(m: np.ndarray) -> np.ndarray:
    """Cohen's κ of a stack of confusion matrices (… × k × k)."""
    n = m.sum(axis=(-2, -1))
    po = np.trace(m, axis1=-2, axis2=-1) / n
    pe = (m.sum(-1) * m.sum(-2)).sum(-1) / n ** 2
    with np.errstate(all="ignore"):
        return (po - pe) / (1 - pe)


class _Agreement:
    """The agreement statistics the raters' rows name, of two raters and the classifier, as functions of the
    counts of label triples (rater 1, rater 2, classifier), by their definitions (reliability.agreement computes
    the same from the labels: Cohen's κ per pair, Fleiss' κ one-vs-rest, the disagreement breakdown over every
    pair, the human–classifier confusion). Every statistic is a function of features linear in the counts
    (the three pairs' confusion matrices, each Fleiss row's histogram of hits), so a batch of moves is one
    matrix sum."""

    def __init__(self, k: int, keys: list[tuple[str, ...]], groups: tuple[str, ...]):
        self.k, self.keys, self.groups = k, keys, groups
        self.triples = [(a, b, c) for a in range(k) for b in range(k) for c in range(k)]
        self.fl = [key for key in keys if key[0] == "fleiss"]
        width = 3 * k * k + 4 * len(self.fl)
        self.P = np.zeros((len(self.triples), width))
        for t, (a, b, c) in enumerate(self.triples):
            for m, (x, y) in enumerate(((a, b), (a, c), (b, c))):
                self.P[t, m * k * k + x * k + y] = 1.0
            for f, key in enumerate(self.fl):
                g = groups.index(key[1])
                hits = (a == g) + (b == g) + (0 if key[2] == "humans" else (c == g))
                self.P[t, 3 * k * k + 4 * f + hits] = 1.0

    def values(self, F: np.ndarray) -> dict[tuple[str, ...], np.ndarray]:
        k = self.k
        c12, c1c, c2c = (F[..., m * k * k:(m + 1) * k * k].reshape(*F.shape[:-1], k, k) for m in range(3))
        out: dict[tuple[str, ...], np.ndarray] = {}
        with np.errstate(all="ignore"):
            for key in self.keys:
                if key == ("kappa", "human-human"):
                    out[key] = _kappas(c12)
                elif key == ("kappa", "human-classifier"):
                    out[key] = (_kappas(c1c) + _kappas(c2c)) / 2
                elif key[0] == "fleiss":
                    f = self.fl.index(key)
                    m = 2 if key[2] == "humans" else 3
                    hist = F[..., 3 * k * k + 4 * f:3 * k * k + 4 * f + m + 1]
                    h = np.arange(m + 1)
                    n = hist.sum(-1)
                    p_bar = (hist * (h * (h - 1) + (m - h) * (m - h - 1))).sum(-1) / (n * m * (m - 1))
                    p = (hist * h).sum(-1) / (n * m)
                    pe = p * p + (1 - p) * (1 - p)
                    out[key] = (p_bar - pe) / (1 - pe)
                elif key[0] == "disagree":
                    g, h = self.groups.index(key[1]), self.groups.index(key[2])
                    row = sum(x[..., g, :] + x[..., :, g] for x in (c12, c1c, c2c))
                    out[key] = row[..., h] / (row.sum(-1) - row[..., g])
                elif key[0] == "split":
                    g, h = self.groups.index(key[1]), self.groups.index(key[2])
                    a, b = c1c[..., g, h] + c2c[..., g, h], c1c[..., h, g] + c2c[..., h, g]
                    out[key] = a / (a + b)
        return out


# within each row's published rounding (A36's mean κ, no interval: ± 0.0005; A40–A41's shares: ± 0.005); a claimed
# majority of one side of a split: within 0.05 of SPLIT_TARGET
RATER_TOLERANCE = {"kappa": 4.5e-4, "fleiss": 4.5e-4, "disagree": 4.5e-3, "split": 0.05}
RATER_STARTS = 8  # the exact starts of the named label's rows (_named_counts) tried before the best is kept


def _named_counts(state: _Agreement, targets: Mapping[tuple[str, ...], float], n: np.ndarray,
                  keep: int = 400) -> list[tuple[float, np.ndarray]]:
    """Counts of label triples (rater 1, rater 2, classifier) that set the rows about one named label g by an
    exact integer search, as (loss, counts), best first (the rest at full agreement); [] where the rows are not
    of the form it assumes: every row but Cohen's κ names g (Fleiss' κ of g over all three raters, at most one;
    shares of g's disagreements against labels X; at most one human–classifier split between g and a label W),
    and every image whose labels hold g holds at most one other label. `n`: the images per classifier label.

    Then, with m the images that hold g once or twice (each adds h(3 − h) = 2 pairs g–X), d_X of them with the
    other label X, s the labels g in all and N the images: disagree(g, X) = d_X / m; Fleiss' κ of g
    = 1 − m / (3N p (1 − p)) with p = s / 3N. Of the d_X images, e_X are classified g (one rater says X: u, both:
    v) and f_X = d_X − e_X are classified X (one rater says g: w, both: z), so s = 3 n_g + Σ (f − e − v + z),
    and, for given E = Σ e over a set of labels with D images, that set's part of s − 3 n_g takes every integer
    in [D − 3E, 2D − 3E]. The split counts a = e_W + v_W rater-W/classifier-g pairs against b = f_W + z_W
    rater-g/classifier-W pairs (its part of s − 3 n_g is b − a). m, the d_X, s, W's (e, a, b) and E are
    enumerated; the loss of a choice is Σ (error / RATER_TOLERANCE)² over the rows, each within its tolerance.
    Of each choice's assignments (E, and t images moved from u to v and from w to z at once: fewer human–human
    disagreements, the same s) every one is returned: Cohen's κ is set afterwards, by triples without g."""
    k, groups = state.k, state.groups
    rows = [key for key in targets if key[0] != "kappa"]
    if not rows or any(key[0] not in ("fleiss", "disagree", "split") for key in rows):
        return []
    held = set.intersection(*({key[1], key[2]} if key[0] == "split" else {key[1]} for key in rows))
    fleiss = [key for key in rows if key[0] == "fleiss"]
    splits = [key for key in rows if key[0] == "split"]
    if len(held) != 1 or len(fleiss) > 1 or len(splits) > 1 or any(key[2] != "all" for key in fleiss):
        return []
    name = held.pop()
    g, N = groups.index(name), int(n.sum())
    ng = int(n[g])
    share = {groups.index(key[2]): targets[key] for key in rows if key[0] == "disagree"}
    W = groups.index(splits[0][1] if splits[0][2] == name else splits[0][2]) if splits else None
    a_side = bool(splits) and splits[0][2] == name  # the split's share counts the rater-W/classifier-g pairs
    named = sorted(share)
    free = [x for x in range(k) if x not in (g, W, *named)]  # labels no row names: they take what is left
    tol = RATER_TOLERANCE
    s_all = np.arange(3 * N + 1)
    p = s_all / (3 * N)
    # p (1 − p) ≤ 1/4 bounds m by the lowest κ the row allows
    m_max = min(N, int((1 - targets[fleiss[0]] + tol["fleiss"]) * 3 * N / 4) + 1) if fleiss else N
    found: list[tuple[Any, ...]] = []  # (loss, m, d, images of the free labels, s, e_W, a, b, E from, E to)
    for m in range(1, m_max + 1):
        options = [[d for d in range(math.ceil((share[x] - tol["disagree"]) * m),
                                     math.floor((share[x] + tol["disagree"]) * m) + 1)
                    if abs(d / m - share[x]) < tol["disagree"]] for x in named]
        if fleiss:
            with np.errstate(all="ignore"):
                kap = 1 - m / (3 * N * p * (1 - p))
            S = s_all[np.abs(kap - targets[fleiss[0]]) < tol["fleiss"]]
            if not len(S):
                continue
        for ds in itertools.product(*options):
            d = dict(zip(named, ds))
            left = m - sum(ds)
            if left < 0 or (left and not free and (W is None or W in d)):
                continue
            base = sum(((d[x] / m - share[x]) / tol["disagree"]) ** 2 for x in named)
            for dW in ([d[W]] if W in d else range(left + 1) if W is not None else [0]):
                r_free = left - (0 if W is None or W in d else dW)
                if r_free and not free:
                    continue
                D = m - dW
                E_lo = (sum(max(0, d[x] - int(n[x])) for x in named if x != W)
                        + max(0, r_free - int(sum(n[x] for x in free))))
                if W is None:
                    e, a, b, loss = np.zeros(1, int), np.zeros(1, int), np.zeros(1, int), np.zeros(1)
                else:
                    e, a, b = (np.concatenate(x) for x in zip(*(
                        (np.full((e_ + 1) * (dW - e_ + 1), e_), *(x.ravel() for x in np.meshgrid(
                            np.arange(e_, 2 * e_ + 1), np.arange(dW - e_, 2 * (dW - e_) + 1), indexing="ij")))
                        for e_ in range(max(0, dW - int(n[W])), dW + 1))))
                    with np.errstate(all="ignore"):
                        sp = (a if a_side else b) / (a + b)
                    err = sp - targets[splits[0]]
                    ok = np.abs(err) < tol["split"]
                    e, a, b, loss = e[ok], a[ok], b[ok], (err[ok] / tol["split"]) ** 2
                E_hi = np.minimum(D, ng - e)
                cW = b - a
                if fleiss:
                    delta = S[None, :] - 3 * ng - cW[:, None]
                    lo = np.maximum(E_lo, -((delta - D) // 3))
                    hi = np.minimum(E_hi[:, None], (2 * D - delta) // 3)
                    kl = ((kap[S] - targets[fleiss[0]]) / tol["fleiss"]) ** 2
                    total = base + loss[:, None] + kl[None, :]
                    total[lo > hi] = np.inf
                    for flat in np.argsort(total, axis=None)[:keep]:
                        i, j = np.unravel_index(flat, total.shape)
                        if np.isfinite(total[i, j]):
                            found.append((float(total[i, j]), m, d | ({W: dW} if W is not None else {}), r_free,
                                          int(S[j]), int(e[i]), int(a[i]), int(b[i]), int(lo[i, j]), int(hi[i, j])))
                else:
                    ok = np.flatnonzero(E_lo <= E_hi)
                    for i in ok[np.argsort(loss[ok])][:keep]:
                        s = 3 * ng + int(cW[i]) + D - 2 * E_lo
                        found.append((float(base + loss[i]), m, d | ({W: dW} if W is not None else {}), r_free,
                                      s, int(e[i]), int(a[i]), int(b[i]), E_lo, E_lo))
        if len(found) > 50 * keep:
            found = sorted(found, key=lambda f: f[0])[:keep]
    out = []
    for loss, _m, d, r_free, s, eW, a, b, lo, hi in sorted(found, key=lambda f: f[0])[:keep]:
        d = dict(d)
        if free:  # the labels no row names: the remaining images by their classifier counts
            weights = np.array([n[x] for x in free], float) + 1e-9
            d |= dict(zip(free, largest_remainder(weights[None] / weights.sum(), r_free)[0].tolist()))
        rest = [x for x in d if x != W]
        D = sum(d[x] for x in rest)
        for E in range(lo, hi + 1):
            delta = s - 3 * ng - (b - a if W is not None else 0)
            x_ = delta - (D - 2 * E)  # = Σ z − Σ v of the rest
            v0, z0 = max(0, -x_), max(0, x_)
            top = min(E - v0, D - E - z0)
            for t in sorted({0, top // 2, top}):
                plan = {}
                if W is not None:
                    fW = d[W] - eW
                    plan[W] = (eW, a - eW, fW, b - fW)
                e_ = {x: max(0, d[x] - int(n[x])) for x in rest}
                extra = E - sum(e_.values())
                for x in rest:
                    step = min(extra, d[x] - e_[x])
                    e_[x], extra = e_[x] + step, extra - step
                V, Z = v0 + t, z0 + t
                for x in rest:
                    v = min(V, e_[x])
                    z = min(Z, d[x] - e_[x])
                    V, Z = V - v, Z - z
                    plan[x] = (e_[x], v, d[x] - e_[x], z)
                counts = _plan_counts(state, plan, g, n)
                if counts is not None and not V and not Z and not extra:
                    out.append((loss, counts))
    return out


def _plan_counts(state: _Agreement, plan: Mapping[int, tuple[int, int, int, int]], g: int,
                 n: np.ndarray) -> np.ndarray | None:
    """The counts of triples of `plan` (X → (e, v, f, z), see _named_counts), the rest at full agreement; the
    images where one rater differs alternate between the raters. None where a label has too few images."""
    index = {t: i for i, t in enumerate(state.triples)}
    counts = np.zeros(len(state.triples))
    for c, nc in enumerate(n):
        counts[index[(c, c, c)]] += nc
    turn = 0
    for x, (e, v, f, z) in plan.items():
        for src, one, both, ones, boths in (((g, g, g), ((x, g, g), (g, x, g)), (x, x, g), e - v, v),
                                            ((x, x, x), ((g, x, x), (x, g, x)), (g, g, x), f - z, z)):
            counts[index[src]] -= ones + boths
            counts[index[both]] += boths
            for i in range(ones):
                counts[index[one[(turn + i) % 2]]] += 1
            turn += ones
    return counts if (counts >= 0).all() else None


def planted_ratings(world: World, classifier: np.ndarray, groups: tuple[str, ...], seed: int,
                    steps: int = 400) -> tuple[pd.DataFrame, dict[tuple[str, ...], float]]:
    """Two planted raters' labels of the rated images, given the planted classifier's labels of them, as counts of
    label triples (rater 1, rater 2, classifier). The rows about one named label (Fleiss' κ, disagreement shares,
    a split) start exact (_named_counts: an integer search; up to RATER_STARTS of its assignments are tried, those
    whose Cohen's κ is not yet below its row first); where the rows are not of its form the counts start at full
    agreement. Then each step of a descent moves one image (or two) between full
    agreement and a triple that disagrees, choosing the move that brings the agreement statistics closest to
    world.agreement (least squares in units of RATER_TOLERANCE; three seeded random moves out of a local minimum):
    first the named label's rows with the triples that hold it, then Cohen's κ with the triples that do not (which
    leave the first rows as they are), until each holds within RATER_TOLERANCE; where no start got there, the
    best goes on over every move for every row (the best counts after `steps`); the triples are then dealt to the images of their classifier label (seeded). Returns the
    raters' labels and the realised values."""
    k = len(groups)
    c = np.array([groups.index(x) for x in classifier])
    rng = np.random.default_rng(seed)
    targets = dict(world.agreement)
    state = _Agreement(k, list(targets), groups)
    index = {t: i for i, t in enumerate(state.triples)}
    counts = np.zeros(len(state.triples))
    for g, n in zip(*np.unique(c, return_counts=True)):
        counts[index[(g, g, g)]] = n
    special = [(a, b, cc) for (a, b, cc) in state.triples if len({a, b, cc}) > 1]
    # moves to and from full agreement, and the raters' labels of one image swapped (the same pairs, so the rows
    # about a named label keep their values; each rater's marginals move: the fine steps of Cohen's κ)
    swaps = [(a, b, cc) for (a, b, cc) in special if a != b]
    src = np.array([index[(cc, cc, cc)] for _, _, cc in special] + [index[t] for t in special]
                   + [index[t] for t in swaps])
    dst = np.array([index[t] for t in special] + [index[(cc, cc, cc)] for _, _, cc in special]
                   + [index[(b, a, cc)] for a, b, cc in swaps])
    swap = np.arange(len(src)) >= 2 * len(special)
    single = state.P[dst] - state.P[src]
    tol = np.array([RATER_TOLERANCE[key[0]] for key in targets])
    goal = np.array(list(targets.values()))

    def losses(F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        vals = np.stack([state.values(F)[key] for key in targets], axis=-1)
        err = np.clip(np.nan_to_num((vals - goal) / tol, nan=1e6), -1e6, 1e6)
        return (err ** 2).sum(-1), vals

    def feasible(moves: np.ndarray) -> np.ndarray:
        """Moves (one or more per row) whose images exist: each source triple holds as many as leave it."""
        s = src[moves]
        uses = (s[:, :, None] == s[:, None, :]).sum(-1)
        return (counts[s] >= uses).all(-1)

    def descend(moves: np.ndarray, keys: np.ndarray, steps: int) -> None:
        """Steepest descent of the loss of the targets `keys` over the single and paired `moves`."""
        nonlocal counts
        pair = np.array([(i, j) for n, i in enumerate(moves) for j in moves[n:]])

        def part(F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            vals = np.stack([state.values(F)[key] for key in targets], axis=-1)
            err = np.clip(np.nan_to_num((vals - goal) / tol, nan=1e6), -1e6, 1e6)[..., keys]
            return (err ** 2).sum(-1), vals

        F = counts @ state.P
        current, vals = part(F)
        best_counts, best_loss = counts.copy(), current
        for _ in range(steps):
            if current < best_loss:
                best_counts, best_loss = counts.copy(), current
            if (np.abs(vals - goal) < tol)[keys].all():
                break
            trial, _ = part(F + single[moves])
            trial[~feasible(moves[:, None])] = np.inf
            chosen = [int(moves[np.argmin(trial)])]
            if trial.min() >= current:  # no single move improves: the best pair of moves
                trial, _ = part(F + single[pair[:, 0]] + single[pair[:, 1]])
                trial[~feasible(pair)] = np.inf
                ok = moves[feasible(moves[:, None])]
                if trial.min() < current:
                    chosen = list(pair[int(np.argmin(trial))])
                elif len(ok):  # a local minimum: a few seeded random moves out of it
                    chosen = list(rng.choice(ok, 3))
                else:
                    break
            for m in chosen:  # each move while its source still holds an image (seeded random moves may repeat)
                if counts[src[m]] < 1:
                    continue
                counts[src[m]] -= 1
                counts[dst[m]] += 1
            F = counts @ state.P
            current, vals = part(F)
        if current > best_loss:
            counts = best_counts

    # first the rows about named labels (Fleiss, disagreements, splits) with the triples that hold a named label,
    # then Cohen's κ with the triples that hold none (which leave the first rows' values as they are)
    named = {groups.index(key[i]) for key in targets if key[0] != "kappa" for i in (1, 2)
             if i < len(key) and key[i] in groups}
    touches = np.array([bool(named & set(state.triples[src[m]]) | named & set(state.triples[dst[m]]))
                        for m in range(len(src))])
    is_kappa = np.array([key[0] == "kappa" for key in targets])
    starts = [counts]
    exact = _named_counts(state, targets, np.bincount(c, minlength=k))
    if exact:
        # Cohen's κ is set afterwards by adding disagreements without g, which lowers it: first the starts
        # whose κ is still at or above its row's
        kappa = [key for key in targets if key[0] == "kappa"]
        F0 = np.stack([x for _, x in exact]) @ state.P
        short = np.sum([np.maximum(0, targets[key] - state.values(F0)[key]) for key in kappa], axis=0)
        order = sorted(range(len(exact)), key=lambda i: (short[i], exact[i][0]))
        starts = [exact[i][1] for i in order]
    best: tuple[float, np.ndarray] | None = None
    for start in starts[:RATER_STARTS]:
        counts = start.copy()
        if (~is_kappa).any():
            descend(np.flatnonzero(touches), np.flatnonzero(~is_kappa), steps)
        descend(np.flatnonzero(~touches | swap), np.flatnonzero(is_kappa), steps)
        loss, vals = losses(counts @ state.P)
        if best is None or loss < best[0]:
            best = (float(loss), counts)
        if (np.abs(vals - goal) < tol).all():
            break
    counts = best[1]
    if not (np.abs(losses(counts @ state.P)[1] - goal) < tol).all():  # the best start, every move for every row
        descend(np.arange(len(src)), np.arange(len(targets)), steps)
    _, vals = losses(counts @ state.P)
    r = np.zeros((2, len(c)), int)
    for cc in range(k):
        items = rng.permutation(np.flatnonzero(c == cc))
        labels = [state.triples[t][:2] for t in range(len(state.triples)) if state.triples[t][2] == cc
                  for _ in range(int(counts[t]))]
        r[:, items] = np.array(labels, dtype=int).T.reshape(2, -1)
    names = np.asarray(groups, dtype=object)
    return (pd.DataFrame({"r1": names[r[0]], "r2": names[r[1]]}),
            {key: float(v) for key, v in zip(targets, vals)})


def write_reliability(cfg: Any, world: World, root: Path) -> list[Path]:
    """The reliability stage's tables of the planted raters: the stage's own sample of the planted classifier's
    labels (reliability.annotation_sheet), two PLANTED raters (planted_ratings), and the stage's own agreement
    statistics and writer (reliability.agreement, reliability.write_outputs), labelled PLANTED."""
    from biasaudit.t2i import reliability as rel

    if not world.agreement:
        return []
    params = cfg.reliability
    labels, _ = rel.load_inputs(list(cfg.models), cfg.generate.images_dir, cfg.generate.prompts_file, cfg.groups,
                                root)
    sheet = rel.annotation_sheet(labels, params.sample_size, params.sample_seed)
    clf = labels.set_index("image_id").loc[sheet["image_id"], "label"].rename(rel.CLASSIFIER)
    raters, realised = planted_ratings(world, clf.to_numpy(str), tuple(cfg.groups), cfg.seed)
    if len(params.raters) != 2:
        raise ValueError(f"the referee world plants two raters; reliability.raters names {len(params.raters)}")
    ratings = pd.DataFrame({params.raters[0]: raters["r1"].to_numpy(), params.raters[1]: raters["r2"].to_numpy()},
                           index=clf.index).join(clf)
    tables = rel.agreement(ratings, list(params.raters), cfg.groups, params.n_boot, params.ci_level, cfg.seed)
    correction = rel.correction_diagnostics(ratings, list(params.raters), params.correction_method, cfg.groups,
                                            reference=params.confusion_reference)
    note = (f"{PLANTED} raters {list(params.raters)} (referee world, data/reference/published): labels searched so "
            f"that the published agreement holds ({', '.join(f'{k}: {v:.4f}' for k, v in realised.items())}); "
            "no human judged these images")
    provenance = {"source": "planted", "note": note}
    return rel.write_outputs(Path(root) / C.RELIABILITY_DIR, tables, ratings, correction, provenance, labels,
                             f"{PLANTED} raters (referee world): no humans", {"backend": BACKEND})


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
    from biasaudit.vlm.planted import simulate_responses

    spec, r = cfg.vlms[vlm], cfg.reflect
    rng = np.random.default_rng(derive_seed(cfg.seed, "referee", vlm))
    units = focus_units(cfg)
    df = simulate_responses(spec.planted, units, rng, r, controls=cfg.counterfactuals.null_edit)
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
    from biasaudit.report.replication import CHANCE_MISS, NOT_RECOVERED, RECOVERED, build_replication
    from biasaudit.vlm.declared import answer_values

    prompts = Path(cfg.generate.prompts_file)
    world = plant_world(published, list(cfg.models), tuple(cfg.groups), cfg.generate.images_per_prompt,
                        pd.read_csv(prompts)["instance"] if prompts.exists() else None)
    keep = Path(reports) / KEPT_DIR.relative_to(C.REPORTS)
    notes = planted_notes(world)
    missed = keep / PLANTING_FILE  # written by `write`, from its representation solve
    for rid, why in (json.loads(missed.read_text()) if missed.exists() else {}).items():
        notes[rid] = f"{why}; {notes.get(rid, '')}"
    table = build_replication(
        Path(reports), C.PUBLISHED_DIR, cfg.profile, cfg.stand_ins(), groups=cfg.groups,
        design={"faces.detector": cfg.faces.detector, "faces.det_threshold": cfg.faces.det_threshold,
                "faces.skin_method": cfg.faces.skin_method},
        options={label: v for label, v in answer_values(cfg.reflect, placebo=False).items() if v is not None},
        level=cfg.analyze.ci_level, title=cfg.report.title, planted=notes)
    keep.mkdir(parents=True, exist_ok=True)
    for src in (Path(reports) / C.REPLICATION_CSV.relative_to(C.REPORTS), Path(reports) / "pages" / C.REPLICATION_PAGE):
        if src.exists():
            (keep / src.name).write_bytes(src.read_bytes())
    verdicts = pd.Series(table.attrs["verdicts"]).reindex(table["id"].astype(str)).to_numpy()  # referee_check's
    bad = table[verdicts == NOT_RECOVERED]
    count = {v: int((verdicts == v).sum()) for v in (RECOVERED, CHANCE_MISS, CANNOT_PLANT)}
    print(f"referee run: {len(table)} rows; {count[RECOVERED]} recovered, {count[CHANCE_MISS]} named chance "
          f"miss(es), {count[CANNOT_PLANT]} that cannot be planted (each says why), {len(bad)} "
          f"not recovered ({keep}/replication.csv, {keep}/replication.html)")
    for r in bad.itertuples():
        print(f"  {r.id} {r.statistic} {r.model} {r.category} {r.group}: published {r.relation} {r.published}, "
              f"run {r.this_run} [{r.low}, {r.high}] — {str(r.note)[:300]}")
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
        written = [*write_tables(tables, Path("."), Path(cfg.generate.images_dir)), *write_method_b(cfg, Path("."))]
        for path in [*written, *write_reliability(cfg, world, Path("."))]:
            print(f"{PLANTED}: wrote {path}")
        missed = planting_misses(world, rep)
        KEPT_DIR.mkdir(parents=True, exist_ok=True)
        (KEPT_DIR / PLANTING_FILE).write_text(json.dumps(missed, indent=1, sort_keys=True))
        for rid, why in sorted(missed.items()):
            print(f"{rid}: {why}")
        print(f"planted {len(world.planted)} rows; not planted: {len(world.unplanted)} "
              f"({', '.join(sorted(world.unplanted))}); solver residual {rep.residual:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
