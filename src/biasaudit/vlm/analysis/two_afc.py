"""Section `two_afc`: per 2AFC task, the win-rate matrix, race win rates within gender, the position bias
(also per pair type) and Bradley–Terry strengths (definitions: the package docstring). Parameters:
`bt_reference`, `two_afc_estimator` (symmetric: each pair's two orders averaged, the headline; pooled: every
answer, with one position term), and the shared resampling and testing settings (inputs.Boot)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.outputs import NO_DATA, Figure, Result
from biasaudit.vlm.analysis.inference import underpowered_intervals
from biasaudit.vlm.analysis.inputs import Answers, Boot, degenerate_2afc, ratio_intervals, two_afc_tasks
from biasaudit.vlm.figures import bar_figure, heatmap_figure
from biasaudit.vlm.groups import CODE_TO_GROUP, GROUP_CODES


def _winners(two_afc: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    first = two_afc["choice"].to_numpy() == "A"
    winner = np.where(first, two_afc["group_a"].to_numpy(), two_afc["group_b"].to_numpy())
    loser = np.where(first, two_afc["group_b"].to_numpy(), two_afc["group_a"].to_numpy())
    return winner, loser


def win_counts(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> pd.DataFrame:
    """wins[r, c] = retained comparisons in which r was chosen over c."""
    winner, loser = _winners(two_afc)
    wins = pd.crosstab(pd.Categorical(winner, categories=groups), pd.Categorical(loser, categories=groups),
                       dropna=False)
    wins = wins.reindex(index=list(groups), columns=list(groups), fill_value=0)
    wins.index.name, wins.columns.name = "row", "col"
    return wins


def win_rate_matrix(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rate, n): rate[r, c] = wins of r over c / comparisons of r and c; NaN where n = 0."""
    wins = win_counts(two_afc, groups)
    n = wins + wins.T
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = wins / n.where(n > 0)
    return rate, n


def unit_win_counts(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> np.ndarray:
    """W[u, r, c] = retained comparisons on source photo u in which r was chosen over c."""
    winner, loser = _winners(two_afc)
    units = pd.factorize(two_afc["unit"])[0] if len(two_afc) else np.zeros(0, int)
    index = {g: i for i, g in enumerate(groups)}
    W = np.zeros((int(units.max()) + 1 if len(units) else 0, len(groups), len(groups)))
    np.add.at(W, (units, [index[g] for g in winner], [index[g] for g in loser]), 1.0)
    return W


def order_pairs(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame, int]:
    """(pairs, one_order): per (unit, lo, hi) retained in *both* orders (lo = the earlier of the two group
    codes in `groups`), s = the order-averaged share of answers choosing lo: ½[mean over the lo-first answers
    + mean over the hi-first answers]; any position pull, whatever the pair, cancels from s under no group
    effect. `one_order`: the pairs retained in one order only, left out."""
    codes = pd.Index(groups)
    ia, ib = codes.get_indexer(two_afc["group_a"]), codes.get_indexer(two_afc["group_b"])
    lo_first = ia < ib
    lo_won = (two_afc["choice"].to_numpy() == "A") == lo_first
    units, names = pd.factorize(two_afc["unit"], sort=True)
    # one key per (unit, lo, hi) in the order of the sorted unit and group names (rows as a groupby would sort them)
    by_name = np.argsort(np.argsort(np.asarray(groups, dtype=object)))
    G = len(groups)
    key = (units * G + by_name[np.minimum(ia, ib)]) * G + by_name[np.maximum(ia, ib)]
    cell = 2 * key + lo_first
    size = 2 * G * G * len(names)
    n = np.bincount(cell, minlength=size).reshape(-1, 2)
    won = np.bincount(cell, lo_won.astype(float), minlength=size).reshape(-1, 2)
    asked = (n > 0).sum(1)
    both = np.flatnonzero(asked == 2)
    share = won[both] / n[both]
    by_rank = np.argsort(by_name)
    u, rest = np.divmod(both, G * G)
    pairs = pd.DataFrame({"unit": np.asarray(names)[u], "lo": np.asarray(groups)[by_rank[rest // G]],
                          "hi": np.asarray(groups)[by_rank[rest % G]], "s": (share[:, 0] + share[:, 1]) / 2})
    return pairs, int((asked == 1).sum())


def symmetric_unit_counts(two_afc: pd.DataFrame, groups: tuple[str, ...] = GROUP_CODES) -> tuple[np.ndarray, np.ndarray]:
    """(W, N)[u, r, c] over pairs retained in both orders: N = 2 answers per pair, W = 2 s (r's share of
    them, order-averaged), so each pair weighs its two orders equally."""
    pairs, _ = order_pairs(two_afc, groups)
    units = pd.factorize(two_afc["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    u = pd.Index(pd.unique(two_afc["unit"])).get_indexer(pairs["unit"])
    index = {g: i for i, g in enumerate(groups)}
    lo, hi = pairs["lo"].map(index).to_numpy(), pairs["hi"].map(index).to_numpy()
    W, N = np.zeros((U, len(groups), len(groups))), np.zeros((U, len(groups), len(groups)))
    np.add.at(W, (u, lo, hi), 2 * pairs["s"].to_numpy())
    np.add.at(W, (u, hi, lo), 2 * (1 - pairs["s"].to_numpy()))
    np.add.at(N, (u, lo, hi), 2.0)
    np.add.at(N, (u, hi, lo), 2.0)
    return W, N


def unit_counts(two_afc: pd.DataFrame, estimator: str = "pooled",
                groups: tuple[str, ...] = GROUP_CODES) -> tuple[np.ndarray, np.ndarray]:
    """(wins, comparisons)[u, r, c] of the estimator: pooled (every retained answer) or symmetric."""
    if estimator == "symmetric":
        return symmetric_unit_counts(two_afc, groups)
    W = unit_win_counts(two_afc, groups)
    return W, W + W.transpose(0, 2, 1)


def win_rate_table(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None,
                   groups: tuple[str, ...] = GROUP_CODES, estimator: str = "pooled") -> pd.DataFrame:
    """Tidy win-rate matrix (row, col, wins, n, rate[, low, high, reason]); the CI resamples photos."""
    W, N = unit_counts(two_afc, estimator, groups)
    G = len(groups)
    rows, cols = np.meshgrid(groups, groups, indexing="ij")
    tidy = ratio_intervals(W.reshape(len(W), G * G), N.reshape(len(N), G * G), boot)
    return pd.concat([pd.DataFrame({"row": rows.ravel(), "col": cols.ravel()}), tidy], axis=1)


def race_win_rates_within_gender(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None,
                                 estimator: str = "pooled") -> pd.DataFrame:
    """Rows (gender, race): wins, n, rate over comparisons of two different races of that gender
    [, low, high, reason: the cluster-bootstrap CI over source photos]."""
    W, N = unit_counts(two_afc, estimator)
    race = np.array([CODE_TO_GROUP[c][0] for c in GROUP_CODES])
    gender = np.array([CODE_TO_GROUP[c][1] for c in GROUP_CODES])
    rivals = (gender[:, None] == gender[None, :]) & (race[:, None] != race[None, :])
    order = [GROUP_CODES.index(f"{r}{g}") for g in ("M", "F") for r in ("A", "B", "L", "ME", "W")]
    wins, n = (W * rivals).sum(axis=2)[:, order], (N * rivals).sum(axis=2)[:, order]
    keys = pd.DataFrame({"gender": [gender[i] for i in order], "race": [race[i] for i in order]})
    return pd.concat([keys, ratio_intervals(wins, n, boot)], axis=1)


def share_first_interval(two_afc: pd.DataFrame, boot: dict[str, Any]) -> dict[str, Any]:
    """P(answer 'A') with its cluster-bootstrap CI over source photos."""
    first = (two_afc["choice"].to_numpy() == "A").astype(float)
    units = pd.factorize(two_afc["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    a, n = np.bincount(units, first, U)[:, None], np.bincount(units, minlength=U).astype(float)[:, None]
    r = ratio_intervals(a, n, boot).iloc[0]
    return {"share_first": r["rate"], "low": r["low"], "high": r["high"], "reason": r["reason"], "n_photos": U}


def position_bias(two_afc: pd.DataFrame) -> dict[str, Any]:
    """share_first and position_bias_rate (see the package docstring), with their counts."""
    n = len(two_afc)
    out: dict[str, Any] = {"n": n, "share_first": float((two_afc["choice"] == "A").mean()) if n else None}
    if not n:
        return out | {"pairs_both_orders": 0, "position_bias_rate": None}
    key = two_afc.assign(lo=np.minimum(two_afc["group_a"], two_afc["group_b"]),
                         hi=np.maximum(two_afc["group_a"], two_afc["group_b"]))
    key["order"] = np.where(key["group_a"] == key["lo"], "lo_first", "hi_first")
    cols = ["unit", "task", "lo", "hi"]
    # the first retained answer in each order; a pair is "both orders" only when it has one of each
    firsts = key.drop_duplicates(cols + ["order"]).pivot(index=cols, columns="order", values="choice")
    both = firsts.dropna(subset=[c for c in ("lo_first", "hi_first")]) if {"lo_first", "hi_first"} <= set(
        firsts.columns) else firsts.iloc[:0]
    same_position = int((both["lo_first"] == both["hi_first"]).sum()) if len(both) else 0
    out["pairs_both_orders"] = int(len(both))
    out["position_bias_rate"] = same_position / len(both) if len(both) else None
    return out


def position_by_pair_type(two_afc: pd.DataFrame, boot: dict[str, Any] | None) -> pd.DataFrame:
    """Share of 'A' answers over all retained answers, pairs of the same gender and pairs across genders
    (pair_type, wins = 'A' answers, n, rate[, low, high, reason]): a position pull that differs by pair
    shows as different rates."""
    gender = {c: g for c, (_, g) in CODE_TO_GROUP.items()}
    same = two_afc["group_a"].map(gender).to_numpy() == two_afc["group_b"].map(gender).to_numpy()
    first = (two_afc["choice"].to_numpy() == "A").astype(float)
    units = pd.factorize(two_afc["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    masks = [np.ones(len(first), bool), same, ~same]
    a = np.column_stack([np.bincount(units, first * m, U) for m in masks]) if U else np.zeros((0, 3))
    n = np.column_stack([np.bincount(units, m.astype(float), U) for m in masks]) if U else np.zeros((0, 3))
    return pd.concat([pd.DataFrame({"pair_type": ["all", "same_gender", "cross_gender"]}),
                      ratio_intervals(a, n, boot)], axis=1).rename(columns={"rate": "share_first"})


def _bt_design(two_afc: pd.DataFrame, others: list[str]) -> np.ndarray:
    """Columns: the position effect (log-odds of choosing the image shown first), then +1/−1 per group."""
    a = two_afc["group_a"].to_numpy()
    b = two_afc["group_b"].to_numpy()
    X = np.zeros((len(two_afc), len(others) + 1))
    X[:, 0] = 1.0
    for j, g in enumerate(others, start=1):
        X[:, j] = (a == g).astype(float) - (b == g).astype(float)
    return X


def _bt_table(fit: Any, names: list[str], reference: str, confidence: float, clusters: np.ndarray) -> pd.DataFrame:
    from scipy import stats as st

    G = int(clusters.max() + 1)
    # t(G − 1) instead of statsmodels' normal reference: at 12 photos the normal interval covered 0.926
    # (benchmarks/calibration.py), as the OLS does with its CR1 errors
    df_t = max(G - 1, 1)
    half = st.t.ppf(0.5 + confidence / 2, df_t) * fit.bse
    with np.errstate(invalid="ignore", divide="ignore"):
        p = 2 * st.t.sf(np.abs(fit.params / fit.bse), df_t)
    table = pd.DataFrame({"term": names, "strength": fit.params, "se": fit.bse, "ci_low": fit.params - half,
                          "ci_high": fit.params + half, "p": p})
    ref_row = pd.DataFrame([{"term": reference, "strength": 0.0, "se": 0.0, "ci_low": 0.0, "ci_high": 0.0,
                             "p": np.nan}])
    return pd.concat([table, ref_row], ignore_index=True).assign(n=len(clusters), n_clusters=G)


def _cluster_logit(y: np.ndarray, X: np.ndarray, clusters: np.ndarray, has_constant: bool) -> tuple[Any, str]:
    """(statsmodels Logit fit with errors clustered by `clusters`, '') or (None, why not)."""
    import statsmodels.api as sm

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # check_rank and hasconst: statsmodels' rank and implicit-constant checks (a full QR and two SVDs
            # of the design, 10x the fit itself) set only df_model and k_constant, which neither the estimates
            # nor the cluster-robust errors read; the symmetric design has no constant (rows are β_lo − β_hi)
            fit = sm.Logit(y, X, check_rank=False, hasconst=has_constant).fit(
                disp=0, maxiter=200, cov_type="cluster", cov_kwds={"groups": clusters})
    except Exception as exc:  # perfect separation, singular design
        return None, f"Bradley–Terry fit failed: {type(exc).__name__}: {exc}"
    if not np.all(np.isfinite(fit.params)) or not fit.mle_retvals.get("converged", False):
        return None, "Bradley–Terry fit did not converge (probably separation: some group always wins)"
    return fit, ""


def bradley_terry(two_afc: pd.DataFrame, reference: str, confidence: float,
                  groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame | None, str]:
    """Bradley–Terry log-strengths relative to group `reference`, with a position effect; errors clustered
    by source photo. Returns (table with term, strength, se, ci_low, ci_high, p, n, n_clusters) or (None, reason)."""
    if len(two_afc) < len(groups):
        return None, f"too few retained comparisons ({len(two_afc)})"
    present = sorted(set(two_afc["group_a"]) | set(two_afc["group_b"]), key=list(groups).index)
    if reference not in present:
        return None, f"reference group {reference} not among the compared groups"
    others = [g for g in present if g != reference]
    y = (two_afc["choice"].to_numpy() == "A").astype(float)
    if y.min() == y.max():
        return None, f"every retained answer is '{'A' if y[0] else 'B'}': strengths are not identifiable"
    clusters = pd.factorize(two_afc["unit"])[0]
    fit, why = _cluster_logit(y, _bt_design(two_afc, others), clusters, has_constant=True)
    return (None, why) if fit is None else (_bt_table(fit, ["position_first"] + others, reference, confidence,
                                                      clusters), "")


def bradley_terry_symmetric(two_afc: pd.DataFrame, reference: str, confidence: float,
                            groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame | None, str]:
    """Order-symmetric Bradley–Terry: logit E[s] = β_lo − β_hi on the order-averaged outcome s of each pair
    retained in both orders (order_pairs; a fractional response of 2 answers), no position term, so that a
    position pull of any form cancels under no group effect; errors clustered by source photo, t(G − 1)
    reference. Returns (table as `bradley_terry`, plus pairs_one_order: the pairs left out) or (None, reason)."""
    pairs, one_order = order_pairs(two_afc, groups)
    if len(pairs) < len(groups):
        return None, f"too few pairs retained in both orders ({len(pairs)}; {one_order} in one order only)"
    present = sorted(set(pairs["lo"]) | set(pairs["hi"]), key=list(groups).index)
    if reference not in present:
        return None, f"reference group {reference} not among the compared groups"
    others = [g for g in present if g != reference]
    y = pairs["s"].to_numpy(float)
    if y.min() == y.max():
        return None, f"every pair's order-averaged outcome is {y[0]:g}: strengths are not identifiable"
    X = np.column_stack([(pairs["lo"] == g).to_numpy(float) - (pairs["hi"] == g).to_numpy(float) for g in others])
    clusters = pd.factorize(pairs["unit"])[0]
    fit, why = _cluster_logit(y, X, clusters, has_constant=False)
    if fit is None:
        return None, why
    return _bt_table(fit, others, reference, confidence, clusters).assign(pairs_one_order=one_order), ""


BT_FITS = {"symmetric": bradley_terry_symmetric, "pooled": bradley_terry}
ESTIMATORS = tuple(BT_FITS)


def bt_tests(bt: pd.DataFrame, min_clusters: int, method: str) -> pd.DataFrame:
    """The strengths' p-values adjusted over the table (Holm/BH; the position effect apart); p-values and
    CIs blanked with a reason below `min_clusters` photos, where the cluster-robust logit does not hold
    its level."""
    from biasaudit.stats.resample import p_adjust

    bt = bt.assign(reason="")
    strengths = bt["term"] != "position_first"
    bt = underpowered_intervals(bt, bt["n_clusters"], min_clusters, ("ci_low", "ci_high", "p"))
    bt["p_adjusted"] = np.nan
    bt.loc[strengths, "p_adjusted"] = p_adjust(bt.loc[strengths, "p"].to_numpy(float), method)
    bt.loc[~strengths, "p_adjusted"] = bt.loc[~strengths, "p"]
    return bt.assign(p_adjust_method=method)


# ------------------------------------------------------------------------------------- the section

def share_first_blanked(two_afc: pd.DataFrame, boot: Boot) -> dict[str, Any]:
    """share_first's interval, blanked with a reason below min_clusters photos (underpowered_intervals)."""
    iv = pd.DataFrame([share_first_interval(two_afc, boot.resampling)])
    return underpowered_intervals(iv, iv["n_photos"], boot.min_clusters).iloc[0].to_dict()


def _bt(two_afc: pd.DataFrame, cfg: Any, estimator: str) -> tuple[pd.DataFrame | None, str]:
    """One estimator's Bradley–Terry table with its tests (bt_tests), or None and the reason."""
    boot = Boot.of(cfg)
    table, why = BT_FITS[estimator](two_afc, cfg.reflect_analysis.bt_reference, boot.level)
    return (None if table is None else bt_tests(table, boot.min_clusters, boot.p_adjust)), why


def _task(two_afc: pd.DataFrame, cfg: Any) -> dict[str, Any]:
    boot = Boot.of(cfg)
    why = degenerate_2afc(two_afc)
    estimator = cfg.reflect_analysis.two_afc_estimator
    fits = {k: _bt(two_afc, cfg, k) for k in ESTIMATORS}
    _, one_order = order_pairs(two_afc)
    tidy, groups = win_rate_table(two_afc, boot.resampling, estimator=estimator), list(GROUP_CODES)
    race = race_win_rates_within_gender(two_afc, boot.resampling, estimator)
    by_type = position_by_pair_type(two_afc, boot.resampling)
    if "n_photos" in by_type:
        by_type = underpowered_intervals(by_type, by_type["n_photos"], boot.min_clusters)
    return {"estimator": estimator,
            "position_bias": position_bias(two_afc) | {f"share_first_{k}": v for k, v in share_first_blanked(
                two_afc, boot).items() if k not in ("share_first", "n_photos")} | {"pairs_one_order": one_order},
            "position_by_type": by_type,
            "degenerate": why, "winrate": underpowered_intervals(tidy, tidy["n_photos"], boot.min_clusters),
            "matrix": tidy.pivot(index="row", columns="col", values="rate").reindex(index=groups, columns=groups),
            "race_winrate": underpowered_intervals(race, race["n_photos"], boot.min_clusters).assign(degenerate=why),
            "bradley_terry": fits[estimator][0], "bt_reason": fits[estimator][1],
            "bradley_terry_other": {k: fit for k, fit in fits.items() if k != estimator}}


def estimates(answers: Answers, cfg: Any) -> dict[str, dict[str, Any]]:
    """Per 2AFC task: position_bias, degenerate, winrate, matrix, race_winrate, bradley_terry (None with its
    bt_reason when not fitted); computed once per VLM (the validation and the summary read them)."""
    return answers.shared("two_afc", cfg, lambda: {t: _task(sub, cfg) for t, sub in two_afc_tasks(answers).items()})


def headline_bradley_terry(answers: Answers, cfg: Any) -> dict[str, dict[str, Any]]:
    """Per 2AFC task: bradley_terry and bt_reason as in `estimates` (the headline estimator's), without the
    rest: what the placebo verdicts read (controls.placebo_tests)."""
    estimator = cfg.reflect_analysis.two_afc_estimator
    return {t: dict(zip(("bradley_terry", "bt_reason"), _bt(sub, cfg, estimator)))
            for t, sub in two_afc_tasks(answers).items()}


def race_win_rates(e: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {g: dict(zip(s["race"], s["rate"])) for g, s in e["race_winrate"].groupby("gender")}


ESTIMATOR_NOTE = {
    "symmetric": "each pair asked in both orders counts the average of its two orders (pairs retained in one "
                 "order only are left out), so a position pull cancels",
    "pooled": "every retained answer, both orders pooled"}


def _add_task(res: Result, vlm: str, task: str, e: dict[str, Any], tag: str) -> None:
    tidy, rate, rw = e["winrate"], e["matrix"], e["race_winrate"]
    n = tidy.pivot(index="row", columns="col", values="n").reindex(index=rate.index, columns=rate.columns)
    res.tables[f"{vlm}_winrate_{task}"] = tidy.assign(vlm=vlm, estimator=e["estimator"])
    res.tables[C.RACE_WINRATE.of(vlm, task)] = rw.assign(vlm=vlm, estimator=e["estimator"])
    res.tables[f"{vlm}_position_{task}"] = e["position_by_type"].assign(vlm=vlm)
    if e["bradley_terry"] is not None:
        res.tables[f"{vlm}_bradley_terry_{task}"] = e["bradley_terry"].assign(vlm=vlm, estimator=e["estimator"],
                                                                           family="exploratory")
    for other, (bt, _) in e["bradley_terry_other"].items():
        if bt is not None:
            res.tables[f"{vlm}_bt_{other}_{task}"] = bt.assign(vlm=vlm, estimator=other, family="exploratory")
    res.figures[f"{vlm}_winrate_{task}"] = Figure(
        heatmap_figure(rate, n, f"{vlm} · 2AFC {task}{tag}"), f"2AFC {task}: win-rate matrix",
        "Cell = share of retained comparisons in which the row group was chosen over the column group "
        f"({ESTIMATOR_NOTE[e['estimator']]}; n = {int(tidy['wins'].sum())} retained answers).")
    res.figures[f"{vlm}_race_winrate_{task}"] = Figure(
        bar_figure(rw, "race", "rate", "gender", f"{vlm} · race win rates within gender · {task}{tag}",
                   "win rate", 0.5), f"2AFC {task}: race win rates within gender",
        f"Wins of each race over the other races of the same gender / comparisons involving it "
        f"({ESTIMATOR_NOTE[e['estimator']]}).")


def compute(answers: Answers, cfg: Any) -> Result:
    vlm, tasks = answers.vlm, estimates(answers, cfg)
    res = Result(f"{vlm}_2afc", f"{vlm}: 2AFC win rates{answers.tag}")
    res.metrics = {"two_afc_estimator": cfg.reflect_analysis.two_afc_estimator,
                   "position_bias": {t: e["position_bias"] | {
                       f"share_first_{r.pair_type}": r.share_first for r in e["position_by_type"].itertuples()}
                       for t, e in tasks.items()},
                   "race_win_rates": {t: race_win_rates(e) for t, e in tasks.items()},
                   "bradley_terry": {t: "table" if e["bradley_terry"] is not None else e["bt_reason"]
                                     for t, e in tasks.items()}}
    for task, e in tasks.items():
        _add_task(res, vlm, task, e, answers.tag)
    if not tasks:
        res.status, res.reason = NO_DATA, "no retained 2AFC answers"
    return res
