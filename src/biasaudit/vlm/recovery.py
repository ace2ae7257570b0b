"""Method B: does the REFLECT analysis recover what the planted VLM was declared to do?

For a VLM with backend `planted` (SIMULATED answers from declared effects), every estimate of the
reflect_analysis sections (biasaudit.vlm.analysis: two_afc, gaps, significance) is set beside its exact
planted value (`vlm.planted.complete_case_estimands`, on the design that was asked: its source photos and
their occupations) and its interval: win rates (upper triangle of
each matrix; the lower one is its complement), race win rates within gender, the share of first-image
answers (position bias, also per pair type), Bradley–Terry strengths (of the estimator the analysis
headlines: reflect_analysis.two_afc_estimator) and position effect, Δg within photo, OLS coefficients,
and refusal rates by group. Each row states its interval width; an interval at least as wide as the
quantity's plausible range is uninformative and counted apart (biasaudit.known_truth). The paper's
pooled Δg is shown beside the planted within-photo value, with no claim to cover it. With a planted
selective refusal (answer-dependent) every complete-case row is still checked, against its complete-case
estimand (`vlm.planted.complete_case_estimands`: what the complete-case estimator converges to); column
`would_have_answered` holds the value without refusals (the estimands of `planted.would_answer`), and the
note says where the selective refusal moves it. The refusal bounds' CIs (vlm/analysis/refusals.py) are
checked against the would-have-answered values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import known_truth as K
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis.inputs import Boot, answer_scales, ratio_intervals
from biasaudit.vlm.groups import GROUP_CODES

NOTE = "PLANTED truth: the planted VLM's declared effects (SIMULATED answers, not a model)"
RANGE = {"win_rate": 1.0, "race_win_rate": 1.0, "share_first": 1.0, "refusal_rate": 1.0,
         "bt_strength": 4.0,  # log-odds −2 … 2 between two groups: win probabilities 0.12 … 0.88
         "delta_g": 100.0}  # percentage points, −50 % … +50 %
COLUMNS = ["vlm", "task", "group"] + K.COLUMNS + ["would_have_answered"]


def design(responses: pd.DataFrame) -> pd.DataFrame:
    """The source photos asked about (unit, occupation), each once."""
    return responses[["unit", "occupation"]].drop_duplicates("unit").sort_values("unit").reset_index(drop=True)


def _two_afc_rows(vlm: str, tasks: dict[str, dict[str, Any]], truth: dict[str, Any]) -> list[dict]:
    rows = []
    for task, t in truth["two_afc"].items():
        if task not in tasks:
            continue
        e = tasks[task]
        symmetric = e.get("estimator") == "symmetric"
        est = e["winrate"].merge(t["winrate_symmetric" if symmetric else "winrate"], on=["row", "col"])
        order = {g: i for i, g in enumerate(GROUP_CODES)}
        for r in est[[order[a] < order[b] for a, b in zip(est["row"], est["col"])]].itertuples():
            rows.append(K.row("win_rate", r.planted, r.rate, r.low, r.high, RANGE["win_rate"], null=0.5, vlm=vlm, task=task,
                              group=f"{r.row}>{r.col}"))
        rw = e["race_winrate"].merge(t["race_winrate_symmetric" if symmetric else "race_winrate"], on=["gender", "race"])
        for r in rw.itertuples():
            rows.append(K.row("race_win_rate", r.planted, r.rate, r.low, r.high, RANGE["race_win_rate"], null=0.5, vlm=vlm,
                              task=task, group=f"{r.race} {r.gender}"))
        pb = e["position_bias"]
        rows.append(K.row("share_first", t["share_first"], pb["share_first"], pb["share_first_low"],
                          pb["share_first_high"], RANGE["share_first"], null=0.5, vlm=vlm, task=task,
                          group="position A"))
        for r in e["position_by_type"].itertuples():
            if r.pair_type != "all":
                rows.append(K.row("share_first", t["share_first_by_type"][r.pair_type], r.share_first, r.low, r.high,
                                  RANGE["share_first"], null=0.5, vlm=vlm, task=task, group=f"position A ({r.pair_type})"))
        bt = e["bradley_terry"]
        if bt is not None:
            for r in bt.merge(t["bradley_terry_symmetric" if symmetric else "bradley_terry"], on="term").itertuples():
                note = "" if abs(r.planted - r.declared) < 1e-9 else \
                    "position pull differs by pair: no single declared value" if np.isnan(r.declared) else \
                    f"declared {r.declared:+.3f}; photo random effects (or, symmetric, the position pull) attenuate " \
                    "the marginal strength"
                rows.append(K.row("bt_strength", r.planted, r.strength, r.ci_low, r.ci_high, RANGE["bt_strength"],
                                  note, null=0.0, vlm=vlm, task=task, group=r.term))
    return rows


def _single_rows(vlm: str, single: dict[str, Any], truth: dict[str, Any], scales: dict[str, Any]) -> list[dict]:
    rows = []
    within, pooled, ols = (single.get(k) for k in ("delta_g", "mean_gaps", "ols"))
    for measure, t in truth["single"].items():
        dg = t["delta_g"]
        if within is not None:
            for r in within[within["measure"] == measure].merge(dg, on=["dimension", "level"]).itertuples():
                rows.append(K.row("delta_g", r.planted, r.delta_pct, r.low, r.high, RANGE["delta_g"], null=0.0, vlm=vlm,
                                  task=measure, group=f"{r.dimension}:{r.level}"))
        if pooled is not None:
            for r in pooled[pooled["measure"] == measure].merge(dg, on=["dimension", "level"]).itertuples():
                rows.append(K.row("delta_g_pooled", r.planted, r.delta_pct, np.nan, np.nan, RANGE["delta_g"],
                                  f"the paper's pooled means (no interval); its own estimand {r.planted_pooled:+.2f}",
                                  check=False, vlm=vlm, task=measure, group=f"{r.dimension}:{r.level}"))
        if ols is not None:
            values = scales.get(measure)
            # a coefficient cannot exceed the span of the answer scale; a salary's is taken as its mean
            scale = float(np.ptp(list(values.values()))) if values else float(t["means"].mean())
            for r in ols[ols["measure"] == measure].merge(t["ols"], on="term").itertuples():
                rows.append(K.row("ols_coef", r.planted, r.coef, r.ci_low, r.ci_high, scale, null=0.0, vlm=vlm, task=measure,
                                  group=r.term))
    return rows


def _refusal_rows(vlm: str, responses: pd.DataFrame, truth: dict[str, Any], boot: dict[str, Any]) -> list[dict]:
    single = responses[(responses["kind"] != "2afc") & responses["status"].isin(["ok", "refused"])]
    if single.empty:
        return []
    units = pd.factorize(single["unit"])[0]
    U, codes = int(units.max()) + 1, list(GROUP_CODES)
    g = single["group"].map({c: i for i, c in enumerate(codes)}).to_numpy()
    refused, asked = np.zeros((U, len(codes))), np.zeros((U, len(codes)))
    np.add.at(refused, (units, g), (single["status"] == "refused").to_numpy(float))
    np.add.at(asked, (units, g), 1.0)
    est = ratio_intervals(refused, asked, boot)
    return [K.row("refusal_rate", p, r.rate, r.low, r.high, RANGE["refusal_rate"], vlm=vlm, task="mcq+salary",
                  group=c) for c, p, r in zip(codes, truth["refusal"]["planted"], est.itertuples())]


def with_would_answer(rows: list[dict], would_rows: list[dict], planted: Any) -> list[dict]:
    """Each complete-case row with the would-have-answered value beside it (`would_rows`: the same rows
    built from the estimands of `planted.would_answer`); where a selective refusal is planted the note
    says how far it moves the complete-case estimand."""
    out = []
    for r, w in zip(rows, would_rows, strict=True):
        r = r | {"would_have_answered": w["planted"]}
        if P.selective(planted) and abs(r["planted"] - w["planted"]) > 1e-9:
            moved = f"{SELECTIVE}: would have answered {w['planted']:+.4g}"
            r["note"] = "; ".join(x for x in (r["note"], moved) if x)
        out.append(r)
    return out


SELECTIVE = "complete-case estimand under the planted selective refusal"


# each bounds table of the refusals section: the truth it is set against (part, key column, estimand table, join
# columns), the quantity, the identified set's format, the no-effect value and the row's group
BOUNDS = (("race_winrate_bounds", "two_afc", "task", "race_winrate", ["gender", "race"], "race_win_rate", ".3f", 0.5,
           lambda r: f"{r.race} {r.gender}"),
          ("delta_g_bounds", "single", "measure", "delta_g", ["dimension", "level"], "delta_g", "+.2f", 0.0,
           lambda r: f"{r.dimension}:{r.level}"))


def _bounds_rows(vlm: str, bounds: dict[str, Any], truth: dict[str, Any]) -> list[dict]:
    """The refusal bounds' CI against the would-have-answered value (vlm.planted.would_answer)."""
    rows = []
    for name, part, key, estimand, on, quantity, spec, null, group in BOUNDS:
        table = bounds.get(name)
        if table is None:
            continue
        for task, t in truth[part].items():
            for r in table[table[key] == task].merge(t[estimand], on=on).itertuples():
                rows.append(K.row(f"{quantity}_bounds", r.planted, r.complete_case, r.low, r.high, RANGE[quantity],
                                  f"identified set [{r.lower:{spec}}, {r.upper:{spec}}]", null=null, vlm=vlm,
                                  task=task, group=group(r)))
    return rows


def recovery(vlm: str, responses: pd.DataFrame, planted: Any, cfg: Any, tasks: dict[str, dict[str, Any]],
             single: dict[str, Any], bounds: dict[str, Any] | None = None) -> Result:
    """The validation section of one planted VLM (`planted`: its declared effects): table `<vlm>_validation`,
    metrics, notes. `tasks`: the two_afc section's estimates per task; `single`: delta_g, mean_gaps, ols."""
    boot = Boot.of(cfg)
    out = Result(f"{vlm}_validation", f"{vlm}: does the REFLECT analysis recover what was planted?")
    units = design(responses)
    both_orders = bool((responses.loc[responses["kind"] == "2afc", "order"] == 1).any())
    scales = answer_scales(cfg)
    asked = set(responses["kind"] + "_" + responses["task"])
    design_of = {"two_afc_tasks": tuple(sorted(responses.loc[responses["kind"] == "2afc", "task"].unique())),
                 "measures": tuple(m for m in scales if m in asked), "both_orders": both_orders, "values": scales}
    truth = P.complete_case_estimands(planted, units, cfg.reflect_analysis, **design_of)
    would = P.complete_case_estimands(P.would_answer(planted), units, cfg.reflect_analysis, **design_of)

    def estimate_rows(t: dict[str, Any]) -> list[dict]:
        return _two_afc_rows(vlm, tasks, t) + _single_rows(vlm, single, t, scales)

    rows = with_would_answer(estimate_rows(truth), estimate_rows(would), planted) + \
        _refusal_rows(vlm, responses, truth, boot.resampling)
    if bounds is not None:
        rows += [r | {"would_have_answered": r["planted"]} for r in _bounds_rows(vlm, bounds, would)]
    table = pd.DataFrame(rows, columns=COLUMNS)
    out.tables[C.VLM_VALIDATION.of(vlm)] = table
    out.notes.append(NOTE)
    if table.empty:
        out.status, out.reason = NO_DATA, "no retained answers to compare"
        return out
    summary = K.summary(table, boot.level)
    checks = table[table["check"] & table["informative"]]
    out.metrics = {"planted": True, "source_photos": len(units), **summary,
                   **{f"{q}_covered": f"{int(t['covered'].sum())}/{len(t)}" for q, t in checks.groupby("quantity")}}
    out.notes.append(f"{summary['covered']} of {summary['informative']} informative checks covered at "
                     f"{len(units)} source photos ({summary['uninformative']} uninformative rows counted apart); "
                     f"{summary['excludes_null']} of {summary['with_null']} intervals exclude the no-effect value")
    return out
