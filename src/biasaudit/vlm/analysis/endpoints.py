"""The declared primary endpoints of one VLM (reflect_analysis.primary_endpoints, grammar:
params.vlm.parse_endpoint) and their Holm adjustment: the one family whose error rate the report states.
Every other p-value of the sections is exploratory (their `family` column)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit.params.vlm import parse_endpoint
from biasaudit.vlm.analysis import caveats, gaps, two_afc
from biasaudit.vlm.analysis.inference import sign_flip
from biasaudit.vlm.analysis.inputs import Answers, Boot, two_afc_tasks
from biasaudit.vlm.declared import check_endpoints
from biasaudit.vlm.groups import GROUP_CODES, group_code

PRIMARY, EXPLORATORY = "primary", "exploratory"
# each row carries its caveats (vlm.analysis.caveats): a refusal gap, the refusal bounds, the null-edit floor, the
# placebo verdict, so that a rejected endpoint is never read apart from what could explain it
COLUMNS = ["endpoint", "estimate", "low", "high", "n_photos", "p", "p_holm", "reject", "family", "reason",
           *caveats.COLUMNS]


def holm(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """p_holm (Holm over the finite p of the table's rows) and reject = p_holm < alpha."""
    from biasaudit.stats.resample import p_adjust

    p_holm = p_adjust(table["p"].to_numpy(float), "holm")
    return table.assign(p_holm=p_holm, reject=np.nan_to_num(p_holm, nan=1.0) < alpha)


def race_winrate_test(retained_2afc: pd.DataFrame, gender: str, race: str, boot: Boot) -> tuple[int, float, str]:
    """(photos, p, reason): sign-flip test over photos of Σ_u (wins_u − n_u / 2) = 0 for the race's comparisons
    with the other races of its gender (H0: no race preference within gender)."""
    me = GROUP_CODES.index(group_code(race, gender))
    rivals = [GROUP_CODES.index(group_code(r, gender)) for r in gaps.RACES if r != race]
    W = two_afc.unit_win_counts(retained_2afc)
    if not len(W):
        return 0, np.nan, "no retained comparison"
    wins, losses = W[:, me, rivals].sum(1), W[:, rivals, me].sum(1)
    d = (wins - (wins + losses) / 2)[(wins + losses) > 0]
    _, p, why = sign_flip(d, boot.n_permutations, boot.seed)
    if len(d) and 2.0 ** (1 - len(d)) >= boot.alpha:
        p, why = np.nan, f"underpowered: with {len(d)} photos the sign-flip test cannot reach p < {boot.alpha:g}"
    return len(d), p, why


def _delta_g(e: dict[str, str], delta_g: pd.DataFrame | None) -> dict[str, Any]:
    rows = pd.DataFrame() if delta_g is None else delta_g[
        (delta_g["measure"] == e["measure"]) & (delta_g["dimension"] == e["dimension"]) & (delta_g["level"] == e["level"])]
    if rows.empty:
        return {"reason": "no such Δg (measure not asked, or the level is the reference)"}
    r = rows.iloc[0]
    return {"estimate": r["delta_pct"], "low": r["low"], "high": r["high"], "n_photos": r["n_photos"],
            "p": r["p_value"], "reason": r["reason"]}


def _race_winrate(e: dict[str, str], answers: Answers, cfg: Any) -> dict[str, Any]:
    tasks = two_afc.estimates(answers, cfg)
    if e["task"] not in tasks:
        return {"reason": f"no retained 2AFC answers of task {e['task']}"}
    rw = tasks[e["task"]]["race_winrate"].set_index(["gender", "race"]).loc[(e["gender"], e["race"])]
    n, p, why = race_winrate_test(two_afc_tasks(answers)[e["task"]], e["gender"], e["race"], Boot.of(cfg))
    return {"estimate": rw["rate"], "low": rw["low"], "high": rw["high"], "n_photos": n, "p": p,
            "reason": "; ".join(r for r in (str(rw.get("reason") or ""), why) if r and r != "nan")}


def primary_endpoints(answers: Answers, cfg: Any) -> pd.DataFrame:
    """One row per declared endpoint: estimate, its interval, p, Holm-adjusted p over the endpoints, reject.
    Each endpoint must name a task declared primary (reflect.task_specs)."""
    check_endpoints(cfg.reflect_analysis.primary_endpoints, cfg.reflect)
    delta_g = gaps.estimates(answers, cfg)["delta_g"]
    rows = []
    for spec in cfg.reflect_analysis.primary_endpoints:
        e = parse_endpoint(spec)
        row = _delta_g(e, delta_g) if e["estimate"] == "delta_g" else _race_winrate(e, answers, cfg)
        row = {"endpoint": spec, "estimate": np.nan, "low": np.nan, "high": np.nan, "n_photos": 0, "p": np.nan} | row
        low, high = float(row["low"]), float(row["high"])
        cav = (caveats.of_delta_g(answers, cfg, e["measure"], e["dimension"], e["level"], low, high)
               if e["estimate"] == "delta_g" else
               caveats.of_race_winrate(answers, cfg, e["task"], e["gender"], e["race"], low, high))
        why = str(row.get("reason") or "")
        if "underpowered" in why:  # an interval or p blanked for too few photos is a caveat of the row too
            cav["caveats"] = "; ".join(x for x in ("UNDERPOWERED: " + why, cav["caveats"]) if x)
        rows.append(row | cav)
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("p_holm", "reject", "family")])
    return holm(table, Boot.of(cfg).alpha).assign(family=PRIMARY)[COLUMNS]


def error_rate_note(table: pd.DataFrame, alpha: float) -> str:
    """The family's error rate, and what it does not cover: refusals that depend on the answer."""
    rejected = table[table["reject"].astype(bool)]
    note = (f"family-wise error ≤ {alpha:g} over the {len(table)} primary endpoints of this VLM (Holm) when the "
            f"refused questions are missing at random; every other p is exploratory ({len(rejected)} of "
            f"{len(table)} primary endpoints rejected")
    fragile = rejected[rejected["robust_to_refusals"].astype(str) != "yes"]
    if len(rejected):
        note += (f"; {len(rejected) - len(fragile)} of them robust to refusals (refusal bounds exclude no effect)"
                 + (": " + ", ".join(f"{r.endpoint} is not ({r.caveats})" for r in fragile.itertuples())
                    if len(fragile) else ""))
    flagged = table[table["refusal_gap"].map(lambda v: v is True or v == 1)]
    if len(flagged):
        note += f"; refusal gap beside {', '.join(flagged['endpoint'])}: read their refusal bounds"
    return note + ")"
