"""The caveats a group finding carries in its own row (issue #45): what a refusal pattern, the edit itself or
the question's wording could explain, read from the `refusals` and `controls` sections.

Per finding (a Δg of a single-image measure, or a 2AFC race win rate within gender):
- `refusal_gap_p`, `refusal_gap`: the refusal-rate gap test of the finding's kind × task (refusals.refusal_gaps;
  flagged when p < 1 − confidence): the groups are refused at different rates, so the complete-case estimate
  may be biased by refusals that depend on the answer.
- `bounds_low`, `bounds_high`: the CI of the worst-case (Manski) bounds of the same quantity
  (refusals.race_win_rate_bounds / delta_g_bounds: each refused question counted as each answer it could have
  had). `robust_to_refusals`: 'yes' only when that interval excludes the no-effect value (0.5 for a win rate,
  0 for Δg), i.e. every way the refused questions could have been answered keeps the effect (at the
  interval's level); 'no' when it holds it; '' without bounds (no refusal table, or too few photos).
- `floor_bound`, `exceeds_floor`: the null-edit artefact floor of the same measure (controls.artifact_floor):
  the largest effect editing alone allows (max(|low|, |high|) of the floor interval for Δg; of the floor
  share − 0.5 for 2AFC), and whether the finding's interval lies entirely beyond ± that bound.
- `placebo_effect_null`: the verdict of the placebo questions of the same kind (2AFC: Bradley–Terry; single
  image: Δg): 'no' when any placebo group test is significant after adjustment (the answers move with the
  face where they should not), 'yes' when none is, 'untested', or '' when no placebo question was asked.
- `caveats`: the above as one sentence, printed beside the finding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit.vlm.analysis import controls, refusals
from biasaudit.vlm.analysis.inputs import Answers, Boot

COLUMNS = ["refusal_gap_p", "refusal_gap", "bounds_low", "bounds_high", "robust_to_refusals", "floor_bound",
           "exceeds_floor", "placebo_effect_null", "caveats"]


def _kind_task(measure: str) -> tuple[str, str]:
    kind, _, task = measure.partition("_")
    return kind, task


def robust(contains_no_effect: Any) -> str:
    """'yes' only when the bounds' interval excludes no effect; 'no' when it holds it; '' when unknown."""
    if contains_no_effect is None or (isinstance(contains_no_effect, float) and np.isnan(contains_no_effect)):
        return ""
    return "no" if bool(contains_no_effect) else "yes"


def placebo_verdict(verdicts: pd.DataFrame, test: str) -> str:
    """One verdict over the placebo tasks of one test ('bradley_terry' or 'delta_g (%)')."""
    v = verdicts.loc[verdicts["test"] == test, "placebo_effect_null"].astype(str) if len(verdicts) else pd.Series()
    if v.empty:
        return ""
    return "no" if (v == "no").any() else ("untested" if (v == "untested").any() else "yes")


def _fmt(x: Any, digits: int = 3) -> str:
    x = float(x) if x is not None and pd.notna(x) else np.nan
    return "—" if not np.isfinite(x) else f"{x:.{digits}g}" if abs(x) >= 10 else f"{x:.{digits}f}"


def sentence(row: dict[str, Any], null: float, alpha: float) -> str:
    """The caveats of one finding as the report prints them beside it."""
    parts = []
    p = row.get("refusal_gap_p", np.nan)
    if row.get("refusal_gap"):
        parts.append(f"REFUSAL GAP: the groups are refused at different rates (p = {_fmt(p, 4)} < {alpha:g})")
    if row.get("robust_to_refusals"):
        parts.append(f"refusal bounds [{_fmt(row['bounds_low'])}, {_fmt(row['bounds_high'])}] "
                     + ("exclude" if row["robust_to_refusals"] == "yes" else "hold") + f" {null:g}: robust to "
                     f"refusals: {row['robust_to_refusals']}")
    elif pd.notna(p):
        parts.append("robust to refusals: unknown (no bounds interval)")
    if row.get("exceeds_floor") is not None and np.isfinite(row.get("floor_bound", np.nan)):
        parts.append(f"null-edit floor ±{_fmt(row['floor_bound'])}: "
                     + ("beyond it" if row["exceeds_floor"] else "within it (editing alone could explain it)"))
    if row.get("placebo_effect_null"):
        parts.append(f"placebo effect null: {row['placebo_effect_null']}")
    return "; ".join(parts)


def _first_rows(table: pd.DataFrame | None, keys: list[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    """The first row of `table` for each value of `keys` (as text), for lookups one finding at a time."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in ([] if table is None else table.to_dict("records")):
        out.setdefault(tuple(str(row[k]) for k in keys), row)
    return out


def _estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    r, c = refusals.estimates(answers, cfg), controls.estimates(answers, cfg)
    verdicts = c["placebo_verdicts"]
    return {"gaps": _first_rows(r["refusal_gaps"], ["kind", "task"]),
            "rw": _first_rows(r["race_winrate_bounds"], ["task", "gender", "race"]),
            "dg": _first_rows(r["delta_g_bounds"], ["measure", "dimension", "level"]),
            "floor": _first_rows(c["floor"], ["kind", "measure"]),
            "verdicts": {test: placebo_verdict(verdicts, test) for test in ("bradley_terry", "delta_g (%)")}}


def _gap(e: dict[str, Any], kind: str, task: str, alpha: float) -> dict[str, Any]:
    g = e["gaps"].get((kind, task))
    if g is None:
        return {"refusal_gap_p": np.nan, "refusal_gap": None}
    p = float(g["p"])
    return {"refusal_gap_p": p, "refusal_gap": bool(np.isfinite(p) and p < alpha)}


def _bounds(rows: dict[tuple[str, ...], dict[str, Any]], *key: str) -> dict[str, Any]:
    b = rows.get(tuple(str(k) for k in key))
    if b is None:
        return {"bounds_low": np.nan, "bounds_high": np.nan, "robust_to_refusals": ""}
    return {"bounds_low": b["low"], "bounds_high": b["high"], "robust_to_refusals": robust(b["contains_no_effect"])}


def _floor(floor: dict[tuple[str, ...], dict[str, Any]], kind: str, measure: str, low: float, high: float,
           null: float) -> dict[str, Any]:
    f = floor.get((kind, measure))
    if f is None or not np.isfinite([f["low"], f["high"]]).all():
        return {"floor_bound": np.nan, "exceeds_floor": None}
    centre = 0.5 if kind == "2afc" else 0.0  # the floor's own no-effect value
    bound = float(max(abs(f["low"] - centre), abs(f["high"] - centre)))
    if not (np.isfinite(low) and np.isfinite(high)):
        return {"floor_bound": bound, "exceeds_floor": None}
    return {"floor_bound": bound, "exceeds_floor": bool(low - null > bound or high - null < -bound)}


def of_delta_g(answers: Answers, cfg: Any, measure: str, dimension: str, level: str, low: float,
               high: float) -> dict[str, Any]:
    """The caveats of a Δg (or an OLS term, read on the same measure and level) with interval [low, high]
    in the Δg's own units (percent; an OLS coefficient's interval is not in them, so pass NaN there)."""
    e, alpha = answers.shared("caveats", cfg, lambda: _estimates(answers, cfg)), Boot.of(cfg).alpha
    kind, task = _kind_task(measure)
    row = _gap(e, kind, task, alpha) | _bounds(e["dg"], measure, dimension, level)
    row |= _floor(e["floor"], kind, measure, low, high, 0.0)
    row["placebo_effect_null"] = e["verdicts"]["delta_g (%)"]
    return row | {"caveats": sentence(row, 0.0, alpha)}


def of_race_winrate(answers: Answers, cfg: Any, task: str, gender: str, race: str, low: float,
                    high: float) -> dict[str, Any]:
    """The caveats of a 2AFC race win rate within gender with interval [low, high]."""
    e, alpha = answers.shared("caveats", cfg, lambda: _estimates(answers, cfg)), Boot.of(cfg).alpha
    row = _gap(e, "2afc", task, alpha) | _bounds(e["rw"], task, gender, race)
    row |= _floor(e["floor"], "2afc", task, low, high, 0.5)
    row["placebo_effect_null"] = e["verdicts"]["bradley_terry"]
    return row | {"caveats": sentence(row, 0.5, alpha)}


def table(answers: Answers, cfg: Any) -> pd.DataFrame:
    """`<vlm>_caveats`: the caveats of every Δg (measure, group `dimension:level`) and every 2AFC race win rate
    (measure `2afc_<task>`, group `gender:race`) of the VLM, which the report joins beside each row it shows."""
    from biasaudit.vlm.analysis import gaps, two_afc

    rows = []
    dg = gaps.estimates(answers, cfg)["delta_g"]
    for r in (dg.itertuples() if dg is not None else ()):
        rows.append({"measure": r.measure, "group": f"{r.dimension}:{r.level}"}
                    | of_delta_g(answers, cfg, r.measure, r.dimension, r.level, r.low, r.high))
    for task, e in two_afc.estimates(answers, cfg).items():
        for r in e["race_winrate"].itertuples():
            rows.append({"measure": f"2afc_{task}", "group": f"{r.gender}:{r.race}"}
                        | of_race_winrate(answers, cfg, task, r.gender, r.race, r.low, r.high))
    return pd.DataFrame(rows, columns=["measure", "group", *COLUMNS])
