"""Section `two_afc`: per 2AFC task, the win-rate matrix, race win rates within gender, the position bias
and Bradley–Terry strengths (definitions: the package docstring). Parameters: `bt_reference`, and the
shared resampling and testing settings (inputs.Boot)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.outputs import NO_DATA, Figure, Result
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


def win_rate_table(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None,
                   groups: tuple[str, ...] = GROUP_CODES) -> pd.DataFrame:
    """Tidy win-rate matrix (row, col, wins, n, rate[, low, high, reason]); the CI resamples photos."""
    W = unit_win_counts(two_afc, groups)
    N = W + W.transpose(0, 2, 1)
    G = len(groups)
    rows, cols = np.meshgrid(groups, groups, indexing="ij")
    tidy = ratio_intervals(W.reshape(len(W), G * G), N.reshape(len(N), G * G), boot)
    return pd.concat([pd.DataFrame({"row": rows.ravel(), "col": cols.ravel()}), tidy], axis=1)


def race_win_rates_within_gender(two_afc: pd.DataFrame, boot: dict[str, Any] | None = None) -> pd.DataFrame:
    """Rows (gender, race): wins, n, rate over comparisons of two different races of that gender
    [, low, high, reason: the cluster-bootstrap CI over source photos]."""
    W = unit_win_counts(two_afc)
    N = W + W.transpose(0, 2, 1)
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


def bradley_terry(two_afc: pd.DataFrame, reference: str, confidence: float,
                  groups: tuple[str, ...] = GROUP_CODES) -> tuple[pd.DataFrame | None, str]:
    """Bradley–Terry log-strengths relative to group `reference`, with a position effect; errors clustered
    by source photo. Returns (table with term, strength, se, ci_low, ci_high, p, n, n_clusters) or (None, reason)."""
    import statsmodels.api as sm

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
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = sm.Logit(y, _bt_design(two_afc, others)).fit(disp=0, maxiter=200, cov_type="cluster",
                                                               cov_kwds={"groups": clusters})
    except Exception as exc:  # perfect separation, singular design
        return None, f"Bradley–Terry fit failed: {type(exc).__name__}: {exc}"
    if not np.all(np.isfinite(fit.params)) or not fit.mle_retvals.get("converged", False):
        return None, "Bradley–Terry fit did not converge (probably separation: some group always wins)"
    return _bt_table(fit, ["position_first"] + others, reference, confidence, clusters), ""


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


def _task(two_afc: pd.DataFrame, cfg: Any) -> dict[str, Any]:
    boot = Boot.of(cfg)
    why = degenerate_2afc(two_afc)
    bt, reason = bradley_terry(two_afc, cfg.reflect_analysis.bt_reference, boot.level)
    winrate = win_rate_table(two_afc, boot.resampling)
    race = race_win_rates_within_gender(two_afc, boot.resampling)
    return {"position_bias": position_bias(two_afc) | {f"share_first_{k}": v for k, v in share_first_blanked(
                two_afc, boot).items() if k not in ("share_first", "n_photos")},
            "degenerate": why, "winrate": underpowered_intervals(winrate, winrate["n_photos"], boot.min_clusters),
            "matrix": win_rate_matrix(two_afc)[0],
            "race_winrate": underpowered_intervals(race, race["n_photos"], boot.min_clusters).assign(degenerate=why),
            "bradley_terry": None if bt is None else bt_tests(bt, boot.min_clusters, boot.p_adjust),
            "bt_reason": reason}


def estimates(answers: Answers, cfg: Any) -> dict[str, dict[str, Any]]:
    """Per 2AFC task: position_bias, degenerate, winrate, matrix, race_winrate, bradley_terry (None with its
    bt_reason when not fitted); computed once per VLM (the validation and the summary read them)."""
    return answers.shared("two_afc", cfg, lambda: {t: _task(sub, cfg) for t, sub in two_afc_tasks(answers).items()})


def race_win_rates(e: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {g: dict(zip(s["race"], s["rate"])) for g, s in e["race_winrate"].groupby("gender")}


def _add_task(res: Result, vlm: str, task: str, e: dict[str, Any], tag: str) -> None:
    tidy, rate, rw = e["winrate"], e["matrix"], e["race_winrate"]
    n = tidy.pivot(index="row", columns="col", values="n").reindex(index=rate.index, columns=rate.columns)
    res.tables[f"{vlm}_winrate_{task}"] = tidy.assign(vlm=vlm)
    res.tables[C.RACE_WINRATE.of(vlm, task)] = rw.assign(vlm=vlm)
    if e["bradley_terry"] is not None:
        res.tables[f"{vlm}_bradley_terry_{task}"] = e["bradley_terry"].assign(vlm=vlm, family="exploratory")
    res.figures[f"{vlm}_winrate_{task}"] = Figure(
        heatmap_figure(rate, n, f"{vlm} · 2AFC {task}{tag}"), f"2AFC {task}: win-rate matrix",
        "Cell = share of retained comparisons in which the row group was chosen over the column group "
        f"(both orders pooled; n = {int(tidy['wins'].sum())} retained comparisons).")
    res.figures[f"{vlm}_race_winrate_{task}"] = Figure(
        bar_figure(rw, "race", "rate", "gender", f"{vlm} · race win rates within gender · {task}{tag}",
                   "win rate", 0.5), f"2AFC {task}: race win rates within gender",
        "Wins of each race over the other races of the same gender / comparisons involving it.")


def compute(answers: Answers, cfg: Any) -> Result:
    vlm, tasks = answers.vlm, estimates(answers, cfg)
    res = Result(f"{vlm}_2afc", f"{vlm}: 2AFC win rates{answers.tag}")
    res.metrics = {"position_bias": {t: e["position_bias"] for t, e in tasks.items()},
                   "race_win_rates": {t: race_win_rates(e) for t, e in tasks.items()},
                   "bradley_terry": {t: "table" if e["bradley_terry"] is not None else e["bt_reason"]
                                     for t, e in tasks.items()}}
    for task, e in tasks.items():
        _add_task(res, vlm, task, e, answers.tag)
    if not tasks:
        res.status, res.reason = NO_DATA, "no retained 2AFC answers"
    return res
