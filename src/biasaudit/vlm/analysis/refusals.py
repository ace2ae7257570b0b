"""Section `refusals`: who is refused, and what the estimates could be had the VLM answered every question
it refused (issue #38). Parameters: the shared resampling and testing settings (inputs.Boot), the answer
scales (inputs.answer_scales) and the references (gaps.references).

- retention by group: per group × kind × task, questions asked, retained, refused, failed; a 2AFC
  comparison counts for both of its groups. refused_share = refused / (asked − failed).
- refusal-rate gap: per kind × task, H0 "within a source photo, the groups' images are exchangeable with
  respect to refusal"; statistic Σ_g N_g (p_g − p̄)² / (p̄(1 − p̄)) (N_g non-failed questions about g, p_g
  their refused share), p by permuting the group labels within each photo (n_permutations draws,
  (1 + #{T* ≥ T}) / (1 + B)). p < 1 − confidence is reported as a finding in the notes.
- worst-case bounds (Manski): a refused question is counted as each answer it could have had. 2AFC race
  win rate of race r within gender: lower = wins / (retained + refused comparisons involving r), upper =
  (wins + refused) / (the same). Δg within photo: a refused answer of the level at the lowest value and of
  the reference at the highest (lower bound), and the reverse (upper); MCQ: the lowest / highest letter
  value of the scale; salary: the smallest / largest retained salary of the photo's occupation (of all
  occupations when it has none). The set [lower, upper] holds the *would-have-answered* value whatever the
  refusals depend on; its CI is [2.5 % point of the lower bound, 97.5 % point of the upper bound] of one
  cluster bootstrap over source photos, so it covers the set (and the value) with ≥ the confidence level.
  `contains_no_effect`: the CI holds 0.5 (win rate) or 0 (Δg).
- failed answers (API errors, lost edits) are not refusals: they are left out of every count above but
  `failed`, as the complete-case estimates leave them out (missing for reasons unrelated to the answer).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.vlm.analysis import gaps
from biasaudit.vlm.analysis.inference import underpowered_intervals
from biasaudit.vlm.analysis.inputs import OK, Answers, Boot, answer_scales
from biasaudit.vlm.groups import CODE_TO_GROUP, GROUP_CODES

REFUSED, FAILED = "refused", "failed"
TABLE = {"race_winrate_bounds": "race_winrate", "delta_g_bounds": "gaps"}  # <vlm>_refusal_bounds_<...>
RETENTION_COLUMNS = ["group", "kind", "task", "asked", "retained", "refused", "failed", "retained_share",
                     "refused_share"]


# ------------------------------------------------------------------------------ retention by group

def by_group(responses: pd.DataFrame) -> pd.DataFrame:
    """One row per (question, group it shows): a 2AFC comparison once for each of its two groups."""
    two = responses[responses["kind"] == "2afc"]
    single = responses[responses["kind"] != "2afc"]
    if two.empty:  # a table of single-image answers alone need not have the 2AFC columns
        return single.reset_index(drop=True)
    return pd.concat([two.assign(group=two["group_a"]), two.assign(group=two["group_b"]), single], ignore_index=True)


def retention_by_group(responses: pd.DataFrame) -> pd.DataFrame:
    """Per group × kind × task: asked, retained (ok), refused, failed, retained_share, refused_share."""
    long = by_group(responses)
    status = long["status"]
    counts = long.assign(asked=1, retained=status.eq(OK).astype(int), refused=status.eq(REFUSED).astype(int),
                         failed=status.eq(FAILED).astype(int)).groupby(["group", "kind", "task"], sort=True)[
        ["asked", "retained", "refused", "failed"]].sum().reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        counts["retained_share"] = counts["retained"] / counts["asked"]
        counts["refused_share"] = counts["refused"] / (counts["asked"] - counts["failed"]).where(
            lambda n: n > 0)
    order = {g: i for i, g in enumerate(GROUP_CODES)}
    counts = counts.sort_values(["kind", "task", "group"], key=lambda c: c.map(order) if c.name == "group" else c)
    return counts[RETENTION_COLUMNS].reset_index(drop=True)


def unit_group_counts(long: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(refused, non-failed) questions per (source photo, group): (U, 10) arrays."""
    answered = long[long["status"].isin([OK, REFUSED])]
    units = pd.factorize(answered["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    # int even when nothing was answered (an empty map is float, which numpy refuses as an index)
    g = answered["group"].map({c: i for i, c in enumerate(GROUP_CODES)}).to_numpy(dtype=int)
    refused, n = np.zeros((U, len(GROUP_CODES))), np.zeros((U, len(GROUP_CODES)))
    np.add.at(refused, (units, g), answered["status"].eq(REFUSED).to_numpy(float))
    np.add.at(n, (units, g), 1.0)
    return refused, n


def heterogeneity(refused: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Σ_g N_g (p_g − p̄)² / (p̄(1 − p̄)) of the (..., U, G) counts, summed over photos (axis −2)."""
    R, N = refused.sum(-2), n.sum(-2)
    pbar = R.sum(-1) / N.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(N > 0, R / N, 0.0)
        return (N * (p - pbar[..., None]) ** 2).sum(-1) / (pbar * (1 - pbar))


def refusal_gap_test(refused: np.ndarray, n: np.ndarray, n_permutations: int, seed: int) -> tuple[float, float, str]:
    """(statistic, p, reason): the groups' refusal rates against within-photo permutations of the labels."""
    if n.sum() == 0:
        return np.nan, np.nan, "no answered or refused question"
    total = refused.sum()
    if total == 0 or total == n.sum():
        return 0.0, np.nan, "no refusal" if total == 0 else "every question refused"
    observed = float(heterogeneity(refused, n))
    rng = np.random.default_rng(seed)
    perm = np.argsort(rng.random((n_permutations,) + n.shape), axis=-1)
    null = heterogeneity(np.take_along_axis(refused[None], perm, -1), np.take_along_axis(n[None], perm, -1))
    return observed, float((1 + (null >= observed - 1e-12).sum()) / (1 + n_permutations)), ""


def refusal_gaps(responses: pd.DataFrame, boot: Boot) -> pd.DataFrame:
    """Per kind × task: the refusal-rate gap test, the groups refused least and most often."""
    long, by = by_group(responses), retention_by_group(responses)
    rows = []
    for (kind, task), sub in long.groupby(["kind", "task"], sort=True):
        refused, n = unit_group_counts(sub)
        stat, p, why = refusal_gap_test(refused, n, boot.n_permutations, boot.seed)
        shares = by[(by["kind"] == kind) & (by["task"] == task)].dropna(subset=["refused_share"])
        lo, hi = (shares.loc[shares["refused_share"].idxmin()], shares.loc[shares["refused_share"].idxmax()]) \
            if len(shares) else ({"group": "", "refused_share": np.nan},) * 2
        rows.append({"kind": kind, "task": task, "n_photos": int((n.sum(1) > 0).sum()),
                     "refused": int(refused.sum()), "lowest_group": lo["group"], "lowest_share": lo["refused_share"],
                     "highest_group": hi["group"], "highest_share": hi["refused_share"], "statistic": stat, "p": p,
                     "reason": why})
    return pd.DataFrame(rows, columns=["kind", "task", "n_photos", "refused", "lowest_group", "lowest_share",
                                       "highest_group", "highest_share", "statistic", "p", "reason"])


# ------------------------------------------------------------------------------ bounds: 2AFC

def _pair_counts(df: pd.DataFrame, units: np.ndarray, U: int, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    index = {g: i for i, g in enumerate(GROUP_CODES)}
    out = np.zeros((U, len(GROUP_CODES), len(GROUP_CODES)))
    np.add.at(out, (units, [index[g] for g in first], [index[g] for g in second]), 1.0)
    return out


def race_win_rate_bounds(two_afc: pd.DataFrame, boot: Boot) -> pd.DataFrame:
    """Rows (gender, race): the complete-case race win rate within gender and its worst-case bounds with a
    refused comparison counted as a loss (lower) or a win (upper) of the race; `two_afc` holds one task's
    retained and refused comparisons (failed ones are dropped here)."""
    from biasaudit.stats.resample import cluster_bootstrap

    df = two_afc[two_afc["status"].isin([OK, REFUSED])]
    units = pd.factorize(df["unit"])[0]
    U = int(units.max()) + 1 if len(units) else 0
    ok = (df["status"] == OK).to_numpy()
    first = (df["choice"] == "A").to_numpy()
    a, b = df["group_a"].to_numpy(), df["group_b"].to_numpy()
    W = _pair_counts(df, units[ok], U, np.where(first, a, b)[ok], np.where(first, b, a)[ok])
    F = _pair_counts(df, units[~ok], U, a[~ok], b[~ok])
    F = F + F.transpose(0, 2, 1)
    race = np.array([CODE_TO_GROUP[c][0] for c in GROUP_CODES])
    gender = np.array([CODE_TO_GROUP[c][1] for c in GROUP_CODES])
    rivals = (gender[:, None] == gender[None, :]) & (race[:, None] != race[None, :])
    order = [GROUP_CODES.index(f"{r}{g}") for g in ("M", "F") for r in ("A", "B", "L", "ME", "W")]
    wins = (W * rivals).sum(2)[:, order]
    n_ok = ((W + W.transpose(0, 2, 1)) * rivals).sum(2)[:, order]
    refused = (F * rivals).sum(2)[:, order]
    n_all = n_ok + refused
    m = len(order)

    def stat(s: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            den = np.where(s[..., 2 * m:] > 0, s[..., 2 * m:], np.nan)
            return np.concatenate([s[..., :m] / den, (s[..., :m] + s[..., m:2 * m]) / den], axis=-1)

    sums = np.hstack([wins, refused, n_all]).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cc = np.where(n_ok.sum(0) > 0, wins.sum(0) / n_ok.sum(0), np.nan)
    point = stat(sums)
    out = pd.DataFrame({"gender": [gender[i] for i in order], "race": [race[i] for i in order],
                        "n_retained": n_ok.sum(0).astype(int), "n_refused": refused.sum(0).astype(int),
                        "complete_case": cc, "lower": point[:m], "upper": point[m:],
                        "n_photos": (n_all > 0).sum(0).astype(int)})
    if U == 0:
        return out.assign(low=np.nan, high=np.nan, reason="no retained or refused comparison")
    ivs = cluster_bootstrap(np.hstack([wins, refused, n_all]), stat, **boot.resampling)
    return out.assign(low=[iv.low for iv in ivs[:m]], high=[iv.high for iv in ivs[m:]],
                      reason=[iv.reason or ivs[m + i].reason for i, iv in enumerate(ivs[:m])])


# ------------------------------------------------------------------------------ bounds: Δg within photo

def imputation_range(df: pd.DataFrame, values: dict[str, float] | None) -> tuple[pd.Series, pd.Series, str]:
    """(lowest, highest) value a refused answer could have had, per row of `df`, and how they were chosen."""
    if values is not None:
        lo, hi = min(values.values()), max(values.values())
        return (pd.Series(lo, index=df.index), pd.Series(hi, index=df.index),
                f"MCQ letter values {lo:g} … {hi:g}")
    ok = df[df["status"] == OK]
    usd = ok["value_usd"].astype(float)
    by_occ = usd.groupby(ok["occupation"]).agg(["min", "max"])
    lo = df["occupation"].map(by_occ["min"]).fillna(usd.min())
    hi = df["occupation"].map(by_occ["max"]).fillna(usd.max())
    return lo, hi, "the smallest / largest retained salary of the photo's occupation"


def imputed_cell_means(df: pd.DataFrame, lo: pd.Series, hi: pd.Series, dimension: str,
                       reference: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cell means (gaps.cell_means) with the refused answers imputed for the lower bound of every level's
    Δg (the reference's at the highest value, the others' at the lowest) and for the upper bound (the reverse)."""
    refused = (df["status"] == REFUSED).to_numpy()
    at_ref = (df[dimension] == reference).to_numpy()
    low = df.assign(y=df["y"].where(~refused, np.where(at_ref, hi, lo)))
    high = df.assign(y=df["y"].where(~refused, np.where(at_ref, lo, hi)))
    return gaps.cell_means(low, dimension), gaps.cell_means(high, dimension)


def _photo_sums(means: pd.DataFrame, level: str, reference: str) -> pd.DataFrame:
    cells = gaps.pair_cells(means, level, reference)
    return cells.assign(d=cells["level_mean"] - cells["ref_mean"]).groupby("unit")[["d", "ref_mean"]].sum()


def delta_g_bounds_row(df: pd.DataFrame, imputed: tuple[pd.DataFrame, pd.DataFrame], dimension: str, level: str,
                       reference: str, boot: Boot) -> dict[str, Any]:
    """Worst-case bounds of Δg within photo (level vs reference) with refused answers imputed at the ends
    of their range (`imputed`: imputed_cell_means); `df` holds retained answers (with y) and refused ones
    (y NaN) of one measure."""
    from biasaudit.stats.resample import cluster_bootstrap

    refused = df["status"] == REFUSED
    at_level, at_ref = df[dimension] == level, df[dimension] == reference
    sums = _photo_sums(imputed[0], level, reference).join(
        _photo_sums(imputed[1], level, reference), lsuffix="_lo", rsuffix="_hi", how="inner")
    row = {"dimension": dimension, "level": level, "reference": reference, "n_photos": len(sums),
           "n_refused_level": int((refused & at_level).sum()), "n_refused_reference": int((refused & at_ref).sum())}
    if sums.empty:
        return row | {"lower": np.nan, "upper": np.nan, "low": np.nan, "high": np.nan,
                      "reason": f"no source photo with both {level} and {reference} answered or refused"}

    def stat(s: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return 100.0 * np.stack([s[..., 0] / s[..., 1], s[..., 2] / s[..., 3]], axis=-1)

    X = sums[["d_lo", "ref_mean_lo", "d_hi", "ref_mean_hi"]].to_numpy(float)
    lower, upper = stat(X.sum(0))
    ivs = cluster_bootstrap(X, stat, **boot.resampling)
    return row | {"lower": lower, "upper": upper, "low": ivs[0].low, "high": ivs[1].high,
                  "reason": "; ".join(r for r in (ivs[0].reason, ivs[1].reason) if r)}


def delta_g_bounds(responses: pd.DataFrame, cfg: Any) -> pd.DataFrame | None:
    """Per single-image measure and level: the worst-case bounds of Δg within photo (module docstring)."""
    boot, rows = Boot.of(cfg), []
    for measure, values in answer_scales(cfg).items():
        kind, task = measure.split("_", 1)
        sub = responses[(responses["kind"] == kind) & (responses["task"] == task)
                        & responses["status"].isin([OK, REFUSED])]
        if sub.empty:
            continue
        y = sub["choice"].map(values) if values is not None else sub["value_usd"]
        sub = sub.assign(y=y.astype(float).where(sub["status"] == OK))
        lo, hi, how = imputation_range(sub, values)
        for dimension, levels, ref in gaps.references(cfg):
            imputed = imputed_cell_means(sub, lo, hi, dimension, ref)  # once for every level
            rows += [delta_g_bounds_row(sub, imputed, dimension, level, ref, boot) | {"measure": measure,
                                                                                     "imputation": how}
                     for level in levels if level != ref]
    return pd.DataFrame(rows) if rows else None


# ------------------------------------------------------------------------------ the section

def with_no_effect(table: pd.DataFrame, null: float, boot: Boot) -> pd.DataFrame:
    """Intervals blanked below min_clusters photos, and whether the set's CI holds the no-effect value."""
    table = underpowered_intervals(table, table["n_photos"], boot.min_clusters)
    contains = (table["low"] <= null) & (null <= table["high"])
    return table.assign(contains_no_effect=contains.where(table["low"].notna() & table["high"].notna()))


def _estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    boot, responses = Boot.of(cfg), answers.responses
    two = responses[responses["kind"] == "2afc"]
    rw = [race_win_rate_bounds(sub, boot).assign(task=task) for task, sub in two.groupby("task", sort=True)]
    within = gaps.estimates(answers, cfg)["delta_g"]
    dg = delta_g_bounds(responses, cfg)
    if dg is not None and within is not None:
        dg = dg.merge(within[["measure", "dimension", "level", "delta_pct"]].rename(
            columns={"delta_pct": "complete_case"}), on=["measure", "dimension", "level"], how="left")
    return {"retention_by_group": retention_by_group(responses), "refusal_gaps": refusal_gaps(responses, boot),
            "race_winrate_bounds": with_no_effect(pd.concat(rw, ignore_index=True), 0.5, boot) if rw else None,
            "delta_g_bounds": with_no_effect(dg, 0.0, boot) if dg is not None else None}


def estimates(answers: Answers, cfg: Any) -> dict[str, Any]:
    """retention_by_group, refusal_gaps, race_winrate_bounds (2AFC, with a task column) and delta_g_bounds
    (None without such answers); computed once per VLM (the validation reads the bounds)."""
    return answers.shared("refusals", cfg, lambda: _estimates(answers, cfg))


def notes(e: dict[str, Any], alpha: float, level: float = 0.95) -> list[str]:
    out = ["Failed answers (API errors, lost edits) are not refusals: they are left out of the bounds as of the "
           "complete-case estimates. Bounds count each refused question as each answer it could have had, so "
           "they hold the would-have-answered value whatever the refusals depend on."]
    for r in e["refusal_gaps"].itertuples():
        if np.isfinite(r.p) and r.p < alpha:
            out.append(f"FINDING: refusal-rate gap between groups in {r.kind} {r.task}: refused share "
                       f"{r.lowest_share:.3f} ({r.lowest_group}) to {r.highest_share:.3f} ({r.highest_group}), "
                       f"within-photo permutation p = {r.p:.4f}; the complete-case estimates may be biased by "
                       "selective refusal: read the bounds")
    for name, null in (("race_winrate_bounds", 0.5), ("delta_g_bounds", 0.0)):
        t = e[name]
        if t is not None and t["contains_no_effect"].notna().any():
            out.append(bounds_note(name, t, null, level))
    return out


def bounds_note(name: str, t: pd.DataFrame, null: float, level: float) -> str:
    """What the bounds' intervals say, and no more: an interval that excludes the no-effect value says the effect
    keeps its sign under every way the refused questions could have been answered, unless the interval is one of
    the (at most 1 − level) that miss; one that holds it says refusals alone could explain the estimate."""
    known = t[t["contains_no_effect"].notna()]
    out = known[known["contains_no_effect"] == False]  # noqa: E712 (None stays apart)
    where = [" ".join(str(r[c]) for c in ("task", "measure", "gender", "dimension", "level", "race") if c in r
                      and pd.notna(r[c]) and str(r[c])) + f" [{r['low']:.3g}, {r['high']:.3g}] "
             + ("above" if r["low"] > null else "below") + f" {null:g}" for _, r in out.iterrows()]
    text = (f"{name}: {len(out)} of {len(known)} bound intervals ({level:.0%}) exclude {null:g}"
            + (f" ({'; '.join(where)}): robust to refusals — every way the refused questions could have been "
               f"answered leaves the value on that side of {null:g}, unless the interval is among the at most "
               f"{1 - level:.0%} that miss the set of would-have-answered values" if len(out) else ""))
    if len(known) > len(out):
        text += (f"; the other {len(known) - len(out)} hold {null:g}: refusals that depend on the answer could explain "
                 "their estimates, which are not robust to refusals")
    return text


def compute(answers: Answers, cfg: Any) -> Result:
    vlm, e = answers.vlm, estimates(answers, cfg)
    res = Result(f"{vlm}_refusals", f"{vlm}: refusals by group and worst-case bounds{answers.tag}")
    res.tables[f"{vlm}_retention_by_group"] = e["retention_by_group"].assign(vlm=vlm)
    res.tables[f"{vlm}_refusal_gaps"] = e["refusal_gaps"].assign(vlm=vlm, family="exploratory")
    for name in ("race_winrate_bounds", "delta_g_bounds"):
        if e[name] is not None:
            res.tables[f"{vlm}_refusal_bounds_{TABLE[name]}"] = e[name].assign(vlm=vlm)
    res.notes = notes(e, Boot.of(cfg).alpha, Boot.of(cfg).level)
    if answers.responses.empty:
        res.status, res.reason = NO_DATA, "no answers"
    return res
