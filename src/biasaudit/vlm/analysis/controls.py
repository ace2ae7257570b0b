"""Section `controls` (the `<vlm>_controls` section): the two answer controls, apart from the group tables.

- Artefact floor (the null edit, `counterfactuals.null_edit`): per 2AFC task, the share of null-edit vs
  original comparisons (both orders) in which the null edit is chosen, with its cluster-bootstrap CI over
  source photos and a sign-flip test of the per-photo share − 0.5; per single-image measure, Δ (%) of the
  null edit vs the original within source photo (the definition of Δg within photo, with the null edit as
  the level and the original as the reference). Beside each Δg of the group table: whether its interval
  lies beyond the floor, i.e. beyond the largest artefact the floor's interval allows (|Δ| bound =
  max(|low|, |high|) of the floor of the same measure), and whether its estimate exceeds the floor's.
- Placebo tasks (`reflect.task_specs` entries with `placebo: true`): the group analyses run unchanged
  on their answers (Bradley–Terry strengths, Δg within photo); a task's verdict "placebo effect null" is
  'yes' when no group test is significant after adjustment, 'no' otherwise, 'untested' without p-values.

For a VLM with planted truth every row also has its planted value (vlm.planted: the declared edit artefact,
the placebo tasks' group effects) and whether the interval covers it. Parameters: the references, the
placebo tasks' letter values (their declared `values`) and the shared resampling and testing settings (inputs.Boot).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.vlm.analysis import gaps, two_afc
from biasaudit.vlm.analysis.inference import sign_flip
from biasaudit.vlm.analysis.inputs import Answers, Boot, answer_scales, measure_frames, ratio_intervals, retained
from biasaudit.vlm.groups import NULL_EDIT, ORIGINAL

FLOOR_COLUMNS = ["kind", "measure", "quantity", "estimate", "low", "high", "null", "p_value", "n", "n_photos", "reason"]
PLACEBO_COLUMNS = ["task", "test", "effect", "estimate", "low", "high", "p_value", "p_adjusted", "reason"]


# ------------------------------------------------------------------------------------ artefact floor

def edit_chosen(two: pd.DataFrame) -> np.ndarray:
    """Per retained null-edit vs original comparison: 1.0 where the null edit was chosen."""
    first_is_edit = two["group_a"].to_numpy() == NULL_EDIT
    return np.where(first_is_edit, two["choice"].to_numpy() == "A", two["choice"].to_numpy() == "B").astype(float)


def share_choosing_edit(two: pd.DataFrame, boot: Boot) -> dict[str, Any]:
    """Share of comparisons choosing the null edit, its CI over photos, and the sign-flip p of the
    per-photo share − 0.5 (H0: the edit is chosen as often as the original)."""
    units = pd.factorize(two["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    wins = np.bincount(units, edit_chosen(two), U)
    n = np.bincount(units, minlength=U).astype(float)
    r = ratio_intervals(wins[:, None], n[:, None], boot.resampling).iloc[0]
    _, p, why = sign_flip(wins / n - 0.5, boot.n_permutations, boot.seed) if U else (np.nan, np.nan, "no photo")
    return {"estimate": r["rate"], "low": r["low"], "high": r["high"], "null": 0.5, "p_value": p, "n": int(n.sum()),
            "n_photos": U, "reason": "; ".join(x for x in (r["reason"], why) if x)}


def null_edit_delta(df: pd.DataFrame, boot: Boot) -> dict[str, Any]:
    """Δ (%) null edit vs original within source photo: gaps.delta_g_within with the arm as the level
    (one matched cell per photo: race = arm, one gender)."""
    row = gaps.delta_g_within(df.assign(race=df["arm"], gender=""), "race", NULL_EDIT, ORIGINAL, boot)
    return {"estimate": row["delta_pct"], "low": row["low"], "high": row["high"], "null": 0.0,
            "p_value": row["p_value"], "n": len(df), "n_photos": row["n_photos"], "reason": row["reason"]}


def artifact_floor(controls: pd.DataFrame, cfg: Any) -> pd.DataFrame:
    """One row per 2AFC task (share choosing the null edit) and per single-image measure (Δ %)."""
    boot = Boot.of(cfg)
    rows = []
    two = retained(controls, "2afc")
    for task, sub in two.groupby("task", sort=True):
        rows.append({"kind": "2afc", "measure": task, "quantity": "share choosing the null edit"}
                    | share_choosing_edit(sub, boot))
    for measure, sub in measure_frames(controls, cfg).items():
        rows.append({"kind": measure.split("_", 1)[0], "measure": measure,
                     "quantity": "Δ% null edit vs original (within photo)"} | null_edit_delta(sub, boot))
    return pd.DataFrame(rows, columns=FLOOR_COLUMNS)


def beyond_floor(delta_g: pd.DataFrame, floor: pd.DataFrame) -> pd.DataFrame:
    """The Δg table with the floor of its measure beside each row, `exceeds_floor_estimate` (|Δg| > |floor
    estimate|) and `exceeds_floor`: the Δg interval lies entirely beyond ± the floor bound
    max(|floor low|, |floor high|); None (with a reason) when either is missing."""
    f = floor[floor["kind"] != "2afc"][["measure", "estimate", "low", "high"]].rename(
        columns={"estimate": "floor_pct", "low": "floor_low", "high": "floor_high"})
    out = delta_g.merge(f, on="measure", how="left")
    bound = np.maximum(out["floor_low"].abs(), out["floor_high"].abs())
    known = np.isfinite(bound) & out["low"].notna() & out["high"].notna()
    beyond = (out["low"] > bound) | (out["high"] < -bound)
    out["floor_bound"] = bound
    out["exceeds_floor_estimate"] = (out["delta_pct"].abs() > out["floor_pct"].abs()).where(
        out["delta_pct"].notna() & out["floor_pct"].notna(), None)
    out["exceeds_floor"] = pd.Series(beyond, dtype=object).where(known, None)
    out["floor_reason"] = np.where(known, "", np.where(out["floor_pct"].isna(), "no null-edit control for this measure",
                                                       "no interval"))
    return out


# ------------------------------------------------------------------------------------ placebo tasks

def placebo_answers(answers: Answers) -> Answers:
    """The placebo tasks' answers as an Answers of their own, so the group analyses run on them unchanged."""
    return Answers(answers.vlm, answers.placebo.assign(placebo=False), planted=answers.planted)


def placebo_tests(tasks: dict[str, dict[str, Any]], delta_g: pd.DataFrame | None) -> pd.DataFrame:
    """Every group test of the placebo tasks: Bradley–Terry strengths (2AFC) and Δg within photo (MCQ)."""
    rows = []
    for task, e in tasks.items():
        bt = e["bradley_terry"]
        if bt is None:
            rows.append({"task": task, "test": "bradley_terry", "effect": "", "reason": e["bt_reason"]})
            continue
        terms = bt[(bt["term"] != "position_first") & (bt["se"] > 0)]
        rows += [{"task": task, "test": "bradley_terry", "effect": r.term, "estimate": r.strength, "low": r.ci_low,
                  "high": r.ci_high, "p_value": r.p, "p_adjusted": r.p_adjusted, "reason": r.reason}
                 for r in terms.itertuples()]
    if delta_g is not None:
        rows += [{"task": r.measure.split("_", 1)[1], "test": "delta_g (%)", "effect": f"{r.dimension}:{r.level}",
                  "estimate": r.delta_pct, "low": r.low, "high": r.high, "p_value": r.p_value,
                  "p_adjusted": r.p_adjusted, "reason": r.reason} for r in delta_g.itertuples()]
    return pd.DataFrame(rows, columns=PLACEBO_COLUMNS)


def placebo_verdicts(tests: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Per placebo task and test: how many effects are significant after adjustment, and the verdict."""
    rows = []
    for (task, test), sub in tests.groupby(["task", "test"], sort=True):
        p = sub["p_adjusted"].astype(float)
        significant = int((p < alpha).sum())
        verdict = "untested" if p.isna().all() else ("no" if significant else "yes")
        reason = "" if verdict != "untested" else "; ".join(sorted(set(sub["reason"].fillna("").astype(str)) - {""}))
        rows.append({"task": task, "test": test, "effects": len(sub), "significant": significant,
                     "min_p_adjusted": float(p.min()) if p.notna().any() else np.nan,
                     "placebo_effect_null": verdict, "reason": reason})
    return pd.DataFrame(rows, columns=["task", "test", "effects", "significant", "min_p_adjusted",
                                       "placebo_effect_null", "reason"])


# ------------------------------------------------------------------------------------ planted truth

def with_planted(table: pd.DataFrame, planted: list[float]) -> pd.DataFrame:
    low, high = table["low"].astype(float), table["high"].astype(float)
    return table.assign(planted=planted, covered=(low <= np.asarray(planted)) & (np.asarray(planted) <= high))


def planted_floor(floor: pd.DataFrame, planted: Any, cfg: Any, both_orders: bool) -> pd.DataFrame:
    from biasaudit.vlm import planted as P

    scales = answer_scales(cfg)
    truth = [P.control_share_edit(planted, r.measure, both_orders) if r.kind == "2afc" else
             P.control_delta_pct(planted, r.measure, scales.get(r.measure)) for r in floor.itertuples()]
    return with_planted(floor, truth)


def planted_placebo(tests: pd.DataFrame, answers: Answers, cfg: Any) -> pd.DataFrame:
    from biasaudit.vlm import planted as P
    from biasaudit.vlm.recovery import design

    df = answers.responses
    two = df[df["kind"] == "2afc"]
    measures = tuple(f"mcq_{t}" for t in df.loc[df["kind"] == "mcq", "task"].unique())
    truth = P.estimands(answers.planted, design(df), cfg.reflect_analysis, two_afc_tasks=tuple(two["task"].unique()),
                        measures=measures, both_orders=bool((two["order"] == 1).any()), values=answer_scales(cfg))
    values = []
    for r in tests.itertuples():
        if r.test == "bradley_terry":
            bt = truth["two_afc"][r.task]["bradley_terry"].set_index("term")["planted"]
            values.append(float(bt.get(r.effect, np.nan)))
        else:
            dg = truth["single"][f"mcq_{r.task}"]["delta_g"]
            dg = dg.set_index(dg["dimension"] + ":" + dg["level"])["planted"]
            values.append(float(dg.get(r.effect, np.nan)))
    return with_planted(tests, values)


# ------------------------------------------------------------------------------------ the section

def _estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    floor = artifact_floor(answers.controls, cfg)
    within = gaps.estimates(answers, cfg)["delta_g"]
    placebo = placebo_answers(answers)
    # only what the verdicts read: the headline Bradley–Terry tables and Δg within photo
    tests = placebo_tests(two_afc.headline_bradley_terry(placebo, cfg), gaps.delta_g(measure_frames(placebo.responses, cfg), cfg))
    if answers.planted is not None:
        two = answers.controls[answers.controls["kind"] == "2afc"]
        floor = planted_floor(floor, answers.planted, cfg, bool((two["order"] == 1).any()) or two.empty)
        if len(tests.dropna(subset=["estimate"])):
            tests = planted_placebo(tests, placebo, cfg)
    return {"floor": floor, "delta_g_vs_floor": None if within is None or floor.empty else beyond_floor(within, floor),
            "placebo_tests": tests, "placebo_verdicts": placebo_verdicts(tests, Boot.of(cfg).alpha)}


def estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    """floor (artefact floor rows), delta_g_vs_floor (None without both), placebo_tests, placebo_verdicts;
    computed once per VLM."""
    return answers.shared("controls", cfg, lambda: _estimates(answers, cfg))


def compute(answers: Answers, cfg: Any) -> Result | None:
    """The `<vlm>_controls` section, or None when the VLM was asked no control question."""
    if answers.controls.empty and answers.placebo.empty:
        return None
    vlm, e = answers.vlm, estimates(answers, cfg)
    res = Result(f"{vlm}_controls", f"{vlm}: controls (null edit, placebo questions){answers.tag}")
    tables = {"artifact_floor": e["floor"], "delta_g_vs_floor": e["delta_g_vs_floor"],
              "placebo_tests": e["placebo_tests"], "placebo_verdicts": e["placebo_verdicts"]}
    for name, table in tables.items():
        if table is not None and len(table):
            res.tables[f"{vlm}_{name}"] = table.assign(vlm=vlm)
    floor, verdicts = e["floor"], e["placebo_verdicts"]
    res.metrics = {"artifact_floor": {r.measure: {"estimate": r.estimate, "low": r.low, "high": r.high,
                                                  "p": r.p_value} for r in floor.itertuples()},
                   "placebo_effect_null": {f"{r.task}/{r.test}": r.placebo_effect_null for r in verdicts.itertuples()}}
    if e["delta_g_vs_floor"] is not None:
        d = e["delta_g_vs_floor"]
        res.metrics["delta_g_beyond_floor"] = f"{int((d['exceeds_floor'] == True).sum())}/{len(d)}"  # noqa: E712
    if "planted" in floor:
        res.notes.append(f"PLANTED truth: {int(floor['covered'].sum())} of {len(floor)} artefact-floor intervals "
                         "cover the declared edit artefact")
    res.notes += [f"placebo {r.task} ({r.test}): effect null: {r.placebo_effect_null}"
                  + (f" ({r.significant} of {r.effects} significant)" if r.significant else "")
                  for r in verdicts.itertuples()]
    if floor.empty:
        res.notes.append("no null-edit control rows (counterfactuals.null_edit is off, or the edits failed)")
    if not len(tables["placebo_tests"]):
        res.notes.append("no placebo questions (no reflect.task_specs entry with placebo: true is asked)")
    if not res.tables:
        res.status, res.reason = NO_DATA, "no retained control answers"
    return res
