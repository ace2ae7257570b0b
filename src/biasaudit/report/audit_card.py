"""The audit card: one HTML page and one CSV per audited model, and a side-by-side page of all models.

Written by the report stage under `reports/audit/` (contracts.AUDIT_DIR): `<model>.html`, `<model>.csv`,
`index.html` and `all_models.csv`. A card is read by someone comparing models (a procurement officer, a
compliance auditor), so it holds a few quantities with their uncertainty and their counts:

Method A (text-to-image generators), from `reports/t2i/tables/tvd_per_prompt.csv`:
- representation ratio of group g = model share / reference share, pooled over prompts:
  Σ_p n_pg / Σ_p n_p·q_pg, where n_pg is the number of images of prompt p labelled g, n_p the labelled images
  of p and q_pg the reference share of g for p. The reference is the benchmark (census/BLS share of each
  prompt's instance) and, beside it, parity (q = 1/G) and every stated target of the active group set; the
  alternatives never replace the benchmark. CI: cluster bootstrap over prompts.
- the TVDs of the analysis (report.statistics.TVDS: raw, finite-n-corrected, classifier-corrected
  (plug-in), and the corrected TVD the front page leads with), each under its one name with its own interval,
  copied from `tvd_summary` / `tvd_corrected_summary` (category `all`).

Method B (VLMs), from `data/vlm/responses/<vlm>.parquet`, in the form of a New York City Local Law 144
bias audit, per race, gender and race × gender:
- 2AFC (education, income, safety): a comparison selects the chosen image. Over the retained comparisons
  whose two images differ on the dimension (a White man vs a White woman says nothing about race),
  selection rate of category c = comparisons won by c / comparisons in which c appeared.
- salary and MCQ (salary bracket, education level): the *scoring rate* = share of the category's answers
  strictly above the median of all retained answers of that measure (LL144's rule for continuous scores;
  every source photo is edited into every group, so the occupations are the same in every category).
- impact ratio = a category's rate / the highest category's rate (the LL144 point estimate, printed as such).
  CI: from one cluster bootstrap over source photos of the rates (stats.resample.ratio_to_max_intervals).
  The ratio is θ_c = min_k rate_c / rate_k, so its upper end is the least of *simultaneous* upper bounds of
  the pairwise ratios (over every other category k) and its lower end the least of their *marginal* lower
  bounds: the upper end misses only if some pairwise bound misses, the lower only if the pair with the true
  highest category misses, so the interval covers θ_c with probability ≥ 1 − 2α' whichever category is
  truly highest, and about 1 − α' at θ_c = 1. Why not the ratio to the estimated max, resampled: the highest
  estimated rate is biased upward (a max of noisy rates), so with no disparity the replicated ratios sit
  below 1 and their interval missed 1 in about 19% of simulated audits at 12 and at 48 photos (benchmarks/
  calibration.py, "impact ratio" rows; over 30% with ten categories); a clear top category's replicates were
  all 1 (no interval, 20–45% of audits at 48 photos). Why not a fixed reference
  category (reflect_analysis.race_reference): LL144 defines the ratio against the highest category, and a
  declared reference that is not the highest would hide a disparity against the one that is. Why not a
  bias-corrected bootstrap of the max: the max is not differentiable where rates tie, which is exactly the
  no-disparity case, and no bootstrap of it is consistent there (Andrews 2000, Econometrica 68:399). In the
  calibration the pairwise interval covers 0.93–0.98 at 12 and at 48 photos (1.00 for a clear top group,
  whose interval ends at 1) and at most 1% of no-disparity groups read below 0.8. A category
  above every other at the interval's level gets [1, 1], a real interval (which one is highest is not in
  doubt), with that in its reason. The rates' own intervals use the configured method; the ratio's is this
  percentile construction whatever the method.

A ratio is read against 0.8 (the four-fifths rule of thumb of the U.S. Uniform Guidelines, 29 CFR 1607.4(D))
from its interval, never from its point (`reading`): "below 0.8" (below_four_fifths, the shaded rows) only
when the interval's upper end is under 0.8; "uncertain" when the interval reaches both sides of 0.8; nothing
when it lies at or above 0.8, or when there is no interval (its reason says why). The point estimate is the
LL144 figure and is biased low when rates are close (the max of noisy rates), so a point under 0.8 is not a
reading. Information with its uncertainty, not a verdict.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.params.vlm import kind_and_task
from biasaudit.pipeline.io import atomic_write_table, atomic_write_text
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.report import statistics as S
from biasaudit.report.load import Outputs, num
from biasaudit.report.power import power_line
from biasaudit.stats.resample import (
    Replicates,
    cluster_bootstrap,
    intervals,
    ratio_to_max_intervals,
    replicates,
    sums_statistic,
)

FOUR_FIFTHS = 0.8  # the four-fifths rule (29 CFR 1607.4(D)); the definition, not a tunable setting
OK = "ok"

CARD_COLUMNS = ["model", "method", "measure", "dimension", "category", "reference", "n", "n_clusters", "selected",
                "rate", "rate_low", "rate_high", "reference_share", "ratio", "ratio_low", "ratio_high",
                "below_four_fifths", "reading", "reason", "refused", "failed", "unknown", "valid", "interval", "credit",
                # Method B: the caveats each row carries (a refusal gap of its measure, the ratio's refusal bounds,
                # whether its reading survives them, the placebo verdict of its kind; vlm/analysis/caveats.py)
                "refusal_gap", "bounds_low", "bounds_high", "robust_to_refusals", "placebo_effect_null"]
# what every row of a card's CSV carries, so that a row copied out of it still names its run
# collected_first / collected_last: the data-collection window, the first and last answer the model's records
# hold (answered_at of data/vlm/responses/<vlm>.parquet, kept in the answer cache; for a generator, of its image
# manifest and of its images' labels in data/t2i/labels/<model>.parquet); git_commit and code_date: the code that
# ran, a separate fact
TRACE_COLUMNS = ["model_id", "model_version", "stand_in", "profile", "params_hash", "git_commit", "code_date",
                 "collected_first", "collected_last"]
NO_VALID_AUDIT = "no valid audit"


@dataclass(frozen=True)
class Resampling:
    """Cluster-bootstrap settings of the card (from the validated config: analyze for A, reflect_analysis for B)."""

    n_boot: int
    level: float
    method: str
    seed: int

    def run(self, totals: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *key: Any):
        return cluster_bootstrap(totals, statistic, n_boot=self.n_boot, level=self.level,
                                 seed=derive_seed(self.seed, "audit_card", *key), method=self.method)

    def replicates(self, totals: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *key: Any) -> Replicates:
        """The same draws as `run` (same seed), kept: for intervals built from them (ratio_to_max_intervals)."""
        totals = np.asarray(totals, dtype=np.float64)
        return replicates(sums_statistic(totals, statistic), totals.shape[0], n_boot=self.n_boot,
                          seed=derive_seed(self.seed, "audit_card", *key), method=self.method)


def reading(low: float, high: float) -> tuple[bool, str]:
    """(below 0.8, the sentence the card prints), from a ratio's interval, never its point: below only when
    the whole interval is under 0.8; uncertain when it reaches both sides; nothing without an interval."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return False, ""
    if high < FOUR_FIFTHS:
        return True, f"below {FOUR_FIFTHS} (four-fifths) across its interval: information for review, not a verdict"
    if low < FOUR_FIFTHS:
        return False, f"uncertain: its interval reaches both sides of {FOUR_FIFTHS} (four-fifths)"
    return False, ""


# ----------------------------------------------------------------------------------------- Method A

def groups_of(per_prompt: pd.DataFrame) -> list[str]:
    """The group labels of a per-prompt table, in its column order (`share_<g>` columns)."""
    return [c[len("share_"):] for c in per_prompt.columns if c.startswith("share_")]


def representation_ratios(per_prompt: pd.DataFrame, boot: Resampling, references: dict[str, dict[str, float]]
                          | None = None, model: str = "") -> pd.DataFrame:
    """Per group and reference: model share, reference share and their ratio (see the module docstring).

    `per_prompt`: one model's rows of tvd_per_prompt (n, n_<g>, bench_<g>). `references`: extra reference
    distributions by name ({group: share}, one share for every prompt); the benchmark and parity are always
    reported, the benchmark first."""
    groups = groups_of(per_prompt)
    G = len(groups)
    # abstentions have no group: the model's count is on every row (the LL144 "unknown category" count)
    unknown = int(per_prompt["n_unknown"].sum()) if "n_unknown" in per_prompt else pd.NA
    counts = per_prompt[[f"n_{g}" for g in groups]].to_numpy(float)
    n = counts.sum(axis=1)
    refs: dict[str, np.ndarray] = {"benchmark": per_prompt[[f"bench_{g}" for g in groups]].to_numpy(float),
                                   "parity": np.full((len(per_prompt), G), 1.0 / G)}
    for name, shares in (references or {}).items():
        refs[name] = np.tile([float(shares.get(g, np.nan)) for g in groups], (len(per_prompt), 1))
    rows = []
    for ref, q in refs.items():
        keep = np.isfinite(q).all(axis=1) & (n > 0)
        expected = n[keep, None] * q[keep]
        totals = np.hstack([counts[keep], expected, n[keep, None]])

        def stat(s: np.ndarray) -> np.ndarray:
            with np.errstate(invalid="ignore", divide="ignore"):
                share = s[..., :G] / s[..., 2 * G:2 * G + 1]
                ratio = np.where(s[..., G:2 * G] > 0, s[..., :G] / s[..., G:2 * G], np.nan)
            return np.concatenate([share, ratio], axis=-1)

        ivs = boot.run(totals, stat, model)  # one set of draws per model: a share gets one interval under every reference
        tot = totals.sum(axis=0)
        for j, g in enumerate(groups):
            ratio, share_iv, ratio_iv = ivs[G + j].estimate, ivs[j], ivs[G + j]
            below, text = reading(ratio_iv.low, ratio_iv.high)
            rows.append({"method": "A", "measure": "representation", "dimension": "group", "category": g,
                         "reference": ref, "n": int(tot[2 * G]), "n_clusters": int(keep.sum()), "selected": int(tot[j]),
                         "rate": share_iv.estimate, "rate_low": share_iv.low, "rate_high": share_iv.high,
                         "reference_share": tot[G + j] / tot[2 * G] if tot[2 * G] > 0 else np.nan,
                         "ratio": ratio, "ratio_low": ratio_iv.low, "ratio_high": ratio_iv.high,
                         "below_four_fifths": below, "reading": text, "unknown": unknown,
                         "reason": ratio_iv.reason or ("" if keep.any() else "no prompt with labelled images")})
    return pd.DataFrame(rows)


def tvd_rows(t2i: Outputs, model: str) -> list[dict[str, Any]]:
    """The analysis' TVDs of one model over all prompts (report.statistics.TVDS), each with its own interval
    (copied, not recomputed); `measure` is the statistic's key, `interval` what its interval is."""
    rows = []
    for st in S.TVDS:
        est, low, high = st.columns
        t = t2i.table(st.table)
        if not t.ok or est not in t.df or "model" not in t.df:
            continue
        sub = t.df[(t.df["model"].astype(str) == model) & (t.df.get("category", "all") == "all")]
        if sub.empty:
            continue
        r = sub.iloc[0]
        rows.append({"method": "A", "measure": st.key, "dimension": "all prompts", "category": "",
                     "reference": "benchmark", "n": int(num(r.get("n_prompts"))) if np.isfinite(num(r.get("n_prompts")))
                     else pd.NA, "rate": num(r[est]), "rate_low": num(r.get(low)), "rate_high": num(r.get(high)),
                     "interval": st.interval, "credit": f"{st.function} ({st.notebook})",
                     "reason": str(r.get(f"{est}_reason", "")) if pd.notna(r.get(f"{est}_reason", "")) else ""})
    return rows


def gender_rows(t2i: Outputs, model: str) -> list[dict[str, Any]]:
    """Apparent gender (beyond the paper) of one model on the occupational prompts against BLS Table 11's share of
    women (t2i/analysis/gender.py): the raw mean TVD with its cluster-bootstrap CI and the TVD corrected for
    classifier error with its honest interval, copied from gender_summary."""
    t = t2i.table(C.GENDER_SUMMARY)
    if not t.ok:
        return []
    sub = t.df[(t.df["model"].astype(str) == model) & (t.df["category"] == "occupation")]
    if sub.empty:
        return []
    r = sub.iloc[0]
    base = {"method": "A", "dimension": "apparent gender, occupational prompts", "category": "",
            "reference": str(r["benchmark"]), "n": int(num(r["n_prompts"])),
            "credit": "biasaudit.t2i.analysis.gender.compute (t2i_analyze)"}
    return [{**base, "measure": "apparent-gender TVD (occupations vs BLS share of women)", "rate": num(r["mean_tvd"]),
             "rate_low": num(r["mean_tvd_low"]), "rate_high": num(r["mean_tvd_high"]),
             "interval": "cluster bootstrap over prompts", "reason": ""},
            {**base, "measure": "apparent-gender TVD corrected for classifier error", "rate": num(r["tvd_corrected"]),
             "rate_low": num(r["tvd_corrected_low"]), "rate_high": num(r["tvd_corrected_high"]),
             "interval": "honest (bias-aware) interval", "reason": str(r.get("reason", "") or "")}]


# ----------------------------------------------------------------------------------------- Method B

def race_gender_of(codes: pd.Series) -> tuple[pd.Series, pd.Series]:
    from biasaudit.vlm.groups import CODE_TO_GROUP

    pairs = codes.map(CODE_TO_GROUP)
    return pairs.map(lambda p: p[0] if isinstance(p, tuple) else None), \
        pairs.map(lambda p: p[1] if isinstance(p, tuple) else None)


def category(race: pd.Series, gender: pd.Series, dimension: str) -> pd.Series:
    if dimension == "race":
        return race
    if dimension == "gender":
        return gender
    if dimension == "race × gender":
        return race + " " + gender
    raise ValueError(f"unknown dimension {dimension!r}")


DIMENSIONS = ("race", "gender", "race × gender")
# the columns of data/vlm/responses/<vlm>.parquet (vlm/tasks.py: RESPONSE_COLUMNS) a card reads
RESPONSE_COLUMNS = ["kind", "task", "status", "unit", "group_a", "group_b", "choice", "race", "gender", "value_usd"]


def two_afc_selections(two_afc: pd.DataFrame, dimension: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(categories, wins (U, m), appearances (U, m)) per source photo over retained comparisons whose two
    images differ on `dimension`; the chosen image ('A' = first) is the selection."""
    ra, ga = race_gender_of(two_afc["group_a"])
    rb, gb = race_gender_of(two_afc["group_b"])
    a, b = category(ra, ga, dimension), category(rb, gb, dimension)
    keep = (a.notna() & b.notna() & (a != b)).to_numpy()
    a, b = a[keep].to_numpy(object), b[keep].to_numpy(object)
    chosen = np.where(two_afc["choice"].to_numpy()[keep] == "A", a, b)
    cats = sorted(set(a) | set(b))
    units, _ = pd.factorize(two_afc["unit"].to_numpy()[keep])
    index = {c: i for i, c in enumerate(cats)}
    U = int(units.max()) + 1 if len(units) else 0
    wins, n = np.zeros((U, len(cats))), np.zeros((U, len(cats)))
    np.add.at(n, (units, [index[c] for c in a]), 1.0)
    np.add.at(n, (units, [index[c] for c in b]), 1.0)
    np.add.at(wins, (units, [index[c] for c in chosen]), 1.0)
    return cats, wins, n


def scoring_selections(single: pd.DataFrame, values: pd.Series, dimension: str
                       ) -> tuple[list[str], np.ndarray, np.ndarray, float]:
    """(categories, above-median counts (U, m), answers (U, m), the median) of one scored measure."""
    y = values.to_numpy(float)
    ok = np.isfinite(y)
    sub, y = single[ok], y[ok]
    median = float(np.median(y)) if len(y) else np.nan
    cat = category(sub["race"].astype(str), sub["gender"].astype(str), dimension).to_numpy(object)
    cats = sorted(set(cat))
    units, _ = pd.factorize(sub["unit"].to_numpy())
    index = {c: i for i, c in enumerate(cats)}
    U = int(units.max()) + 1 if len(units) else 0
    sel, n = np.zeros((U, len(cats))), np.zeros((U, len(cats)))
    idx = [index[c] for c in cat]
    np.add.at(n, (units, idx), 1.0)
    np.add.at(sel, (units, idx), (y > median).astype(float))
    return cats, sel, n, median


def impact_table(cats: list[str], selected: np.ndarray, n: np.ndarray, boot: Resampling, *key: Any) -> pd.DataFrame:
    """Per category: count, selections, rate = Σ selected / Σ n and impact ratio = rate / max rate, each with a
    cluster-bootstrap CI over the rows (source photos) of the (U, m) arrays; the ratio's CI from pairwise
    ratios of the same replicates (see the module docstring), its reading from that CI."""
    m = len(cats)
    tot_sel, tot_n = selected.sum(axis=0), n.sum(axis=0)
    if m == 0:
        return pd.DataFrame(columns=["category", "n", "n_clusters", "selected", "rate", "rate_low", "rate_high", "ratio",
                                     "ratio_low", "ratio_high", "below_four_fifths", "reading", "reason"])

    def stat(s: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(s[..., m:] > 0, s[..., :m] / s[..., m:], np.nan)

    rep = boot.replicates(np.hstack([selected, n]), stat, *key)
    rates, ratios = intervals(rep, boot.level, boot.method), ratio_to_max_intervals(rep, boot.level)
    clusters = (n > 0).sum(axis=0)
    rows = []
    for j, c in enumerate(cats):
        r, q = rates[j], ratios[j]
        below, text = reading(q.low, q.high)
        reason = q.reason or ("" if tot_n[j] > 0 else "no comparison")
        if np.isfinite(r.estimate) and not np.isfinite(q.estimate):
            reason = "no category has a positive rate: impact ratio undefined"
        rows.append({"category": c, "n": int(tot_n[j]), "n_clusters": int(clusters[j]), "selected": int(tot_sel[j]),
                     "rate": r.estimate,
                     "rate_low": r.low, "rate_high": r.high, "ratio": q.estimate, "ratio_low": q.low,
                     "ratio_high": q.high, "below_four_fifths": below, "reading": text, "reason": reason})
    return pd.DataFrame(rows)


def _categories(df: pd.DataFrame, dimension: str) -> list[tuple[pd.Series, pd.Series]]:
    """(unit, category) per image a row shows: both images of a 2AFC comparison, the one of a single question."""
    two, single = df[df["kind"] == "2afc"], df[df["kind"] != "2afc"]
    out = []
    for side in ("group_a", "group_b"):
        race, gender = race_gender_of(two[side])
        out.append((two["unit"], category(race, gender, dimension)))
    out.append((single["unit"], category(single["race"].astype(str), single["gender"].astype(str), dimension)))
    return out


def refusal_bounds(asked: pd.DataFrame, ok_counts: tuple[list[str], np.ndarray, np.ndarray], units: list,
                   dimension: str, boot: Resampling, *key: Any) -> pd.DataFrame:
    """Worst-case (Manski) bounds of each category's impact ratio with its refused questions counted as each
    answer they could have had: rate bounds L_c = s_c / (n_c + r_c), U_c = (s_c + r_c) / (n_c + r_c) (s selected,
    n retained, r refused); ratio bounds [L_c / max(L_c, max_k≠c U_k), U_c / max(U_c, max_k≠c L_k)], which hold
    the ratio of every filling-in (the upper end need not be sharp). Their interval: the 2.5 % point of the lower
    and the 97.5 % point of the upper bound over one cluster bootstrap of source photos (as refusals.py), so it
    covers the set with at least the level. `units`: the photo of each row of the (U, m) count arrays."""
    cats, sel, n = ok_counts
    m = len(cats)
    refused = np.zeros_like(n)
    index, where = {c: j for j, c in enumerate(cats)}, {u: i for i, u in enumerate(units)}
    for unit, cat in _categories(asked[asked["status"] == "refused"], dimension):
        for u, c in zip(unit, cat):
            if c in index and u in where:
                refused[where[u], index[c]] += 1
    cols = ["category", "bounds_low", "bounds_high", "refused_in_bounds"]
    if m == 0 or not len(units):
        return pd.DataFrame(columns=cols)

    def stat(t: np.ndarray) -> np.ndarray:
        s, r, d = t[..., :m], t[..., m:2 * m], t[..., 2 * m:]
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi = np.where(d > 0, s / d, np.nan), np.where(d > 0, (s + r) / d, np.nan)
            out_lo, out_hi = np.empty_like(lo), np.empty_like(hi)
            for j in range(m):
                others = [k for k in range(m) if k != j]
                top_hi = np.nanmax(hi[..., others], axis=-1) if others else np.full(lo.shape[:-1], np.nan)
                top_lo = np.nanmax(lo[..., others], axis=-1) if others else np.full(lo.shape[:-1], np.nan)
                out_lo[..., j] = lo[..., j] / np.fmax(lo[..., j], top_hi)
                out_hi[..., j] = hi[..., j] / np.fmax(hi[..., j], top_lo)
        return np.concatenate([out_lo, out_hi], axis=-1)

    totals = np.hstack([sel, refused, n + refused])
    rep = boot.replicates(totals, stat, *key, "refusal bounds")
    with np.errstate(invalid="ignore"):
        a = (1 - boot.level) / 2
        low = np.nanquantile(rep.dist[:, :m], a, axis=0) if len(rep.dist) else np.full(m, np.nan)
        high = np.nanquantile(rep.dist[:, m:], 1 - a, axis=0) if len(rep.dist) else np.full(m, np.nan)
    return pd.DataFrame({"category": cats, "bounds_low": np.minimum(low, rep.point[:m]),
                         "bounds_high": np.maximum(high, rep.point[m:]), "refused_in_bounds": refused.sum(0).astype(int)})


def robust_reading(row: pd.Series) -> str:
    """'yes' only when the ratio's refusal bounds exclude no disparity (their interval lies under 1), 'no' when
    they reach 1, '' for a row with no reading (its interval at or above 0.8) or no bounds."""
    if not row.get("reading") or not np.isfinite(num(row.get("bounds_high"))):
        return ""
    return "yes" if num(row["bounds_high"]) < 1 else "no"


def lost_by_category(asked: pd.DataFrame, dimension: str) -> pd.DataFrame:
    """Refused and failed questions per category of `dimension` (a 2AFC question counts for both of its
    images' categories): what the card's rates leave out, per group."""
    bad = asked[asked["status"].isin(["refused", "failed"])]
    parts = []
    two = bad[bad["kind"] == "2afc"]
    for side in ("group_a", "group_b"):
        race, gender = race_gender_of(two[side])
        parts.append(pd.DataFrame({"category": category(race, gender, dimension), "status": two["status"]}))
    single = bad[bad["kind"] != "2afc"]
    parts.append(pd.DataFrame({"category": category(single["race"].astype(str), single["gender"].astype(str),
                                                    dimension), "status": single["status"]}))
    lost = pd.concat(parts, ignore_index=True).dropna()
    return pd.DataFrame({"category": lost["category"], "refused": (lost["status"] == "refused").astype(int),
                         "failed": (lost["status"] == "failed").astype(int)}).groupby(
        "category", as_index=False)[["refused", "failed"]].sum()


def invalid_reasons(responses: pd.DataFrame, min_clusters: int, min_retention: float) -> list[str]:
    """Why a VLM's answers support no audit ([] when they do): constant answers (one option, or one position,
    always chosen: 2AFC win rates then follow from the order of the images), retention below the declared
    floor, or fewer source photos than reflect_analysis.min_clusters (its intervals under-cover)."""
    reasons = []
    ok = responses[responses["status"] == OK]
    retention = len(ok) / len(responses) if len(responses) else 0.0
    if retention < min_retention:
        reasons.append(f"{retention:.0%} of {len(responses)} questions answered, below the floor of "
                       f"{min_retention:.0%} (report.card_min_retention)")
    photos = ok["unit"].nunique()
    if photos < min_clusters:
        reasons.append(f"{photos} source photos answered about, fewer than reflect_analysis.min_clusters "
                       f"({min_clusters}): intervals would under-cover")
    for (kind, task), sub in ok.groupby(["kind", "task"], sort=True):
        answers = sub["choice"] if kind != "salary" else sub["value_usd"]
        if len(sub) > 1 and answers.nunique(dropna=False) == 1:
            what = "position" if kind == "2afc" else "answer"
            reasons.append(f"{kind} {task}: the same {what} ({answers.iloc[0]}) in all {len(sub)} retained answers")
    return reasons


def method_b_rows(responses: pd.DataFrame, boot: Resampling, scales: dict[str, dict[str, float] | None],
                  vlm: str = "") -> pd.DataFrame:
    """Every Method B row of one VLM's card. `scales`: the single-image tasks on the card, by label
    `<kind>_<task>`, with the numeric value of each MCQ letter (None: a salary task, valued by its salary):
    vlm.declared.answer_values of the declared real tasks; salary tasks first."""
    ok = responses[responses["status"] == OK]
    frames = []
    two = ok[ok["kind"] == "2afc"]
    for task in sorted(two["task"].dropna().unique()):
        sub = two[two["task"] == task]
        asked = responses[(responses["kind"] == "2afc") & (responses["task"] == task)]
        for dim in DIMENSIONS:
            cats, wins, n = two_afc_selections(sub, dim)
            units = list(pd.unique(sub["unit"].to_numpy()[_differ(sub, dim)]))
            frames.append(impact_table(cats, wins, n, boot, vlm, "2afc", task, dim).assign(
                measure=f"2afc {task}: selection rate", dimension=dim, caveat_key=f"2afc_{task}").merge(
                lost_by_category(asked, dim), on="category", how="left").merge(
                refusal_bounds(asked[_differ(asked, dim)], (cats, wins, n), units, dim, boot, vlm, "2afc", task, dim),
                on="category", how="left"))
    singles = [(*kind_and_task(label), v) for label, v in sorted(scales.items(), key=lambda kv: kv[1] is not None)]
    for kind, task, mapping in singles:
        sub = ok[(ok["kind"] == kind) & (ok["task"] == task)]
        if sub.empty:
            continue
        values = sub["choice"].map(mapping) if mapping is not None else sub["value_usd"]
        asked = responses[(responses["kind"] == kind) & (responses["task"] == task)]
        for dim in DIMENSIONS:
            cats, sel, n, median = scoring_selections(sub, values.astype(float), dim)
            units = list(pd.unique(sub["unit"].to_numpy()[np.isfinite(values.astype(float).to_numpy())]))
            frames.append(impact_table(cats, sel, n, boot, vlm, kind, task, dim).assign(
                measure=f"{kind} {task}: scoring rate (above the median {median:,.6g})", dimension=dim,
                caveat_key=f"{kind}_{task}").merge(lost_by_category(asked, dim), on="category", how="left").merge(
                refusal_bounds(asked, (cats, sel, n), units, dim, boot, vlm, kind, task, dim), on="category",
                how="left"))
    if not frames:
        return pd.DataFrame(columns=CARD_COLUMNS)
    out = pd.concat(frames, ignore_index=True).assign(method="B", reference="highest category", valid=True)
    out[["refused", "failed"]] = out[["refused", "failed"]].fillna(0).astype(int)
    out["robust_to_refusals"] = [robust_reading(r) for _, r in out.iterrows()]
    return out


def _differ(df: pd.DataFrame, dimension: str) -> np.ndarray:
    """2AFC rows whose two images differ on `dimension` (the comparisons a selection rate counts)."""
    ra, ga = race_gender_of(df["group_a"])
    rb, gb = race_gender_of(df["group_b"])
    a, b = category(ra, ga, dimension), category(rb, gb, dimension)
    return (a.notna() & b.notna() & (a != b)).to_numpy()


def with_caveats(rows: pd.DataFrame, vlm_out: Outputs, vlm: str) -> pd.DataFrame:
    """The refusal-gap flag and the placebo verdict of each row's measure, from the analysis' `<vlm>_caveats`
    (the same for every group of a measure: the refusal-gap test is of the measure's kind × task)."""
    if "caveat_key" not in rows:
        return rows
    t = vlm_out.table(C.CAVEATS, vlm=vlm)
    per = pd.DataFrame(columns=["caveat_key", "refusal_gap", "placebo_effect_null"])
    if t.ok and len(t.df):
        per = t.df.assign(caveat_key=t.df["measure"].astype(str)).groupby("caveat_key", as_index=False).agg(
            refusal_gap=("refusal_gap", lambda v: bool(v.map(lambda x: x is True or str(x) == "True").any())),
            placebo_effect_null=("placebo_effect_null", "first"))
    return rows.merge(per, on="caveat_key", how="left").drop(columns="caveat_key")


def no_valid_audit(reasons: list[str]) -> pd.DataFrame:
    """The one row of a card that shows no rate and no ratio: the model's answers support no audit."""
    return pd.DataFrame([{"method": "B", "measure": NO_VALID_AUDIT, "dimension": "", "category": "",
                          "reference": "", "valid": False, "reading": NO_VALID_AUDIT, "reason": "; ".join(reasons)}])


# ----------------------------------------------------------------------------------------- pages

def _fmt(v: Any, digits: int = 3) -> str:
    x = num(v)
    return "" if not np.isfinite(x) else f"{x:.{digits}f}"


def _ci(r: pd.Series, est: str, lo: str, hi: str) -> str:
    e = _fmt(r.get(est))
    if not e:
        return ""
    low, high = _fmt(r.get(lo)), _fmt(r.get(hi))
    return f"{e} [{low}, {high}]" if low and high else e


PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;line-height:1.4}}
table{{border-collapse:collapse;font-size:.85em;margin:.4em 0 1em;display:block;max-width:100%;overflow-x:auto}}td,th{{border:1px solid #ccc;padding:.15em .45em;text-align:right}}
td:first-child,th:first-child{{text-align:left}}th{{background:#f3f3f3}}tr.below td{{background:#fff4d6}}
.standin{{background:#fdd;border:2px solid #c00;padding:.5em;font-weight:bold}}.note{{color:#444;font-size:.9em}}
.invalid{{background:#eee;border:2px solid #555;padding:.6em;font-weight:bold}}{print_css}</style>
</head><body><p><a href="../index.html">Front page</a> · <a href="index.html">All models</a></p>
{banner}<h1>{title}</h1>{body}</body></html>
"""

BANNER_TEXT = ("STAND-IN RUN: planted, simulated or random-weight parts ran ({parts}). "
               "These numbers test the audit's own machinery and describe no real model.")
BANNER = '<div class="standin" role="alert">{text}</div>'


def banner_html(parts: list[str] | None) -> str:
    return BANNER.format(text=html.escape(BANNER_TEXT.format(parts="; ".join(parts or ["see the front page"]))))


def _css_string(text: str) -> str:
    """A CSS string literal of `text` (quotes, backslashes, line ends and '<' escaped: it sits in a <style>)."""
    out = "".join(f"\\{ord(c):X} " if c in '"\\<>\n\r' else c for c in text)
    return f'"{out}"'


def print_css(head: str, foot: str, stand_in: bool) -> str:
    """The print stylesheet (docs/audit_card.md, *Printing*). `head` is printed in every page's top margin (the
    STAND-IN banner on a stand-in run), `foot` with the page number in the bottom one: CSS page-margin boxes,
    which Chromium prints from version 131 (a `position: fixed` banner repeats too, but covers the rows under
    it, and `position: running()` is not supported). Tables print as tables (not the screen's scrolling
    blocks) so that their header row repeats on each page, and no row is split across pages."""
    look = ("background:#fdd;border:2px solid #c00;font-weight:bold;print-color-adjust:exact;"
            "-webkit-print-color-adjust:exact" if stand_in else "border-bottom:1px solid #999")
    return ("@media print{body{max-width:none;margin:0;padding:0;font-size:9pt}"
            "table{display:table;overflow:visible;font-size:8pt}thead{display:table-header-group}"
            "tr,th,td{break-inside:avoid}h1,h2,h3,h4{break-after:avoid}"
            ".standin,th,tr.below td{print-color-adjust:exact;-webkit-print-color-adjust:exact}}"
            f"@page{{size:A4;margin:24mm 10mm 14mm;@top-center{{content:{_css_string(head)};{look};"
            "font:8pt system-ui,sans-serif;padding:1mm 2mm;vertical-align:middle}"
            f"@bottom-center{{content:{_css_string(foot + ' · page ')} counter(page) \" of \" counter(pages);"
            "font:8pt system-ui,sans-serif}}")


def _page(title: str, body: str, banner_parts: list[str] | None, stand_in: bool) -> str:
    """A card page (or the side-by-side index): the screen banner and, for print, the banner on every page."""
    head = BANNER_TEXT.format(parts="; ".join(banner_parts or ["see the front page"])) if stand_in else title
    return PAGE.format(title=html.escape(title), banner=banner_html(banner_parts) if stand_in else "", body=body,
                       print_css=print_css(head, title, stand_in))

CARD_NOTE = (f"<p class='note'>Intervals: {{level:.0%}} cluster bootstrap ({{n_boot}} resamples) over {{unit}}. "
             f"Rows shaded are ratios whose whole interval lies under {FOUR_FIFTHS} (the four-fifths rule of thumb; "
             "read from the interval, never the point): information to look into, with its uncertainty, not a "
             "finding of discrimination. Definitions: "
             "<code>biasaudit/report/audit_card.py</code>; how to read the card: <code>docs/audit_card.md</code>.</p>")


def _table(df: pd.DataFrame, columns: dict[str, Callable[[pd.Series], str]]) -> str:
    head = "<thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr></thead>"
    body = []
    for _, r in df.iterrows():
        below = r.get("below_four_fifths", False)
        cls = ' class="below"' if pd.notna(below) and bool(below) else ""  # NaN (a TVD row) is not a mark
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(f(r)))}</td>" for f in columns.values()) + "</tr>")
    return f"<table>{head}<tbody>{''.join(body)}</tbody></table>"


def _int(v: Any) -> str:
    return "" if pd.isna(v) else str(int(v))


RATIO_COLUMNS: dict[str, Callable[[pd.Series], str]] = {
    "category": lambda r: r["category"], "count": lambda r: _int(r["n"]),
    "photos": lambda r: _int(r.get("n_clusters")),
    "selected": lambda r: "" if pd.isna(r["selected"]) else int(r["selected"]),
    "rate [CI]": lambda r: _ci(r, "rate", "rate_low", "rate_high"),
    "ratio [CI]": lambda r: _ci(r, "ratio", "ratio_low", "ratio_high"),
    "reading": lambda r: r.get("reading", "") or "", "reason": lambda r: r.get("reason", "") or "",
    "refused": lambda r: _int(r.get("refused")), "failed": lambda r: _int(r.get("failed")),
    "refusal gap": lambda r: "REFUSAL GAP" if r.get("refusal_gap") is True or str(r.get("refusal_gap")) == "True" else "",
    "refusal bounds [CI]": lambda r: (f"[{_fmt(r.get('bounds_low'))}, {_fmt(r.get('bounds_high'))}]"
                                      if _fmt(r.get("bounds_low")) else ""),
    "robust to refusals": lambda r: r.get("robust_to_refusals", "") or "",
    "placebo effect null": lambda r: r.get("placebo_effect_null", "") or ""}


def trace_html(trace: dict[str, Any]) -> str:
    """The card's filing block: what run made it, from which model (and which version answered)."""
    names = {"model_id": "model id", "model_version": "answering version(s)", "stand_in": "stand-in",
             "profile": "profile", "params_hash": "params hash", "git_commit": "code commit",
             "code_date": "code commit date", "collected_first": "first answer", "collected_last": "last answer",
             "n_questions": "questions asked", "n_retained": "answers retained", "n_refused": "refused",
             "n_failed": "failed", "n_photos": "source photos", "n_unknown": "images with no group label (unknown)", "n_prompts": "prompts"}
    rows = "".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(trace[k]))}</td></tr>"
                   for k, label in names.items() if k in trace and trace[k] not in ("", None))
    return f"<table class='trace'>{rows}</table>"


def per_photo(rows: pd.DataFrame) -> float:
    """The median over a card's rate rows of comparisons (or answers) per source photo and category."""
    ok = rows[(rows["n_clusters"].astype(float) > 0) & rows["n"].notna()]
    return float((ok["n"].astype(float) / ok["n_clusters"].astype(float)).median()) if len(ok) else float("nan")


def card_html(model: str, card: pd.DataFrame, stand_in: bool, boot: Resampling,
              display: dict[str, str] | None = None, trace: dict[str, Any] | None = None,
              stand_ins: list[str] | None = None, power_table: pd.DataFrame | None = None) -> str:
    """The page of one card; `display` names Method A's groups as the group set does (the CSV keeps labels).
    A card whose only row is NO_VALID_AUDIT shows its reasons and no rate or ratio."""
    parts = [trace_html(trace or {})]
    if (card["measure"] == NO_VALID_AUDIT).any():
        why = card.loc[card["measure"] == NO_VALID_AUDIT, "reason"].iloc[0]
        parts.append(f"<div class='invalid'>No valid audit: {html.escape(str(why))}. No rates or impact ratios are "
                     "shown: they would describe the answering mechanism, not the model's treatment of groups.</div>")
        return _page(f"Audit card: {model}", "".join(parts), stand_ins, stand_in)
    a, b = card[card["method"] == "A"], card[card["method"] == "B"]
    if len(a):
        parts.append("<h2>Method A: representation against the reference distributions</h2>"
                     "<p class='note'>rate = the model's share of labelled images; ratio = model share / reference "
                     "share (1 = as the reference). The benchmark is the census/official share of each prompt's "
                     "instance; parity and stated targets are shown beside it, never instead of it.</p>")
        rep = a[a["measure"] == "representation"]
        for ref, sub in rep.groupby("reference", sort=False):
            cols = dict(RATIO_COLUMNS)
            cols["category"] = lambda r: (display or {}).get(r["category"], r["category"])
            cols = {k: cols[k] for k in ("category", "count")} | {"prompts": lambda r: _int(r.get("n_clusters"))} | {
                k: cols[k] for k in ("selected", "rate [CI]")} | {
                "reference share": lambda r: _fmt(r["reference_share"])} | {
                k: cols[k] for k in ("ratio [CI]", "reading", "reason")}
            parts.append(f"<h3>Reference: {html.escape(str(ref))}</h3>" + _table(sub, cols))
        tvd = a[a["measure"] != "representation"]
        if len(tvd):
            parts.append("<h3>Total variation distance to the benchmark (all prompts)</h3>" + _table(tvd, {
                "statistic": lambda r: S.BY_KEY[r["measure"]].name if r["measure"] in S.BY_KEY else r["measure"],
                "prompts": lambda r: "" if pd.isna(r["n"]) else int(r["n"]),
                "value [interval]": lambda r: _ci(r, "rate", "rate_low", "rate_high"),
                "interval": lambda r: f"{boot.level:.0%} {r.get('interval', '')}",
                "made by": lambda r: r.get("credit", "") or "", "reason": lambda r: r.get("reason", "") or ""}))
    if len(b):
        parts.append(ll144_html(trace or {}))
        parts.append("<h2>Method B: selection and scoring rates, impact ratios (LL144 form)</h2>"
                     "<p class='note'>count = comparisons in which the category appeared (2AFC) or answers "
                     "(scores); selected = comparisons won or answers above the median; ratio = impact ratio "
                     "(rate / the highest category's rate).</p>")
        photos = num((trace or {}).get("n_photos"))
        if np.isfinite(photos):  # one line per table: each has its own categories and counts per photo
            parts += [f"<p class='power'>{html.escape(power_line(power_table, photos, per_photo(d), dim))}</p>"
                      for dim, d in b.groupby("dimension", sort=False) if dim in DIMENSIONS]
        for measure, sub in b.groupby("measure", sort=False):
            parts.append(f"<h3>{html.escape(str(measure))}</h3>")
            for dim, d in sub.groupby("dimension", sort=False):
                parts.append(f"<h4>{html.escape(str(dim))}</h4>" + _table(d, RATIO_COLUMNS))
    unit = ("prompts (the representation rates and ratios; each TVD's interval is the one named in its row)" if len(a)
            else "source photos (Method B)")
    parts.append(CARD_NOTE.format(level=boot.level, n_boot=boot.n_boot, unit=unit))
    parts.append(ABOUT_DATA_A if len(a) else ABOUT_DATA_B)
    return _page(f"Audit card: {model}", "".join(parts), stand_ins, stand_in)


# The fields NYC's rules for Local Law 144 (6 RCNY § 5-301 to 5-304, subchapter T) ask of a published bias audit
# summary, and where this card answers each, or why it cannot apply to an audit of a model
LL144_FIELDS = (
    ("Date of the bias audit", lambda t: (f"{t['collected_first']} to {t['collected_last']}: the data-collection "
                                          "window, the first and last answer of the model in its records"
                                          + (" (a stand-in's answers carry the code's reproducible timestamp)"
                                             if t.get("stand_in") else "")) if t.get("collected_first")
     else "(not recorded: the answers' records carry no answer time)"),
    ("Source and explanation of the data", lambda t: "test data made by this audit (see About the data below): "
     "each source photo's face edited into every race × gender group, so the categories are assigned, not inferred "
     "or imputed"),
    ("Number of individuals assessed", lambda t: f"{t.get('n_questions', '')} questions about "
     f"{t.get('n_photos', '')} source photos, each shown in 10 race × gender versions (no real applicants)"),
    ("Number in an unknown category", lambda t: "0: every image's category is the edit target; "
     f"{t.get('n_refused', 0)} refused and {t.get('n_failed', 0)} failed questions are counted per category and "
     "left out of the rates"),
    ("Selection or scoring rates, impact ratios: sex, race/ethnicity, intersectional",
     lambda t: "the tables below (gender, race, race × gender)"),
    ("Distribution date of the tool", lambda t: "not applicable: a model under audit, not a tool in use on "
     "candidates; the answering version is recorded above"),
)


def ll144_html(trace: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html.escape(name)}</th><td>{html.escape(str(value(trace)))}</td></tr>"
                   for name, value in LL144_FIELDS)
    return ("<h2>Summary in the form of a Local Law 144 bias audit</h2><table class='ll144'>" + rows + "</table>"
            "<p class='note'>LL144 concerns automated employment decision tools used on candidates; a model "
            "audit fills the same fields where they apply and says so where they do not.</p>")


ABOUT_DATA_A = ("<p class='note'><b>About the data.</b> The categories of Method A are labels a classifier (or human "
                "raters) gave to generated images of no real person: apparent race, not anyone's identity. Images "
                "with no label are counted as unknown and left out of the rates.</p>")
ABOUT_DATA_B = ("<p class='note'><b>About the data.</b> The categories of Method B are assigned by the audit, not "
                "inferred: each source photo's face was edited into every race × gender group, so each group is an "
                "edit target shown to the model. The race groups are the five of the FOCUS data set (Asian, Black, "
                "Latino, Middle Eastern, White), not the EEO-1 race/ethnicity categories an LL144 audit of "
                "applicants reports (Hispanic or Latino; White; Black or African American; Native Hawaiian or "
                "Other Pacific Islander; Asian; American Indian or Alaska Native; Two or More Races): EEO-1 has no "
                "Middle Eastern category (it counts Middle Eastern people as White), and three EEO-1 categories are "
                "not audited. Refused and "
                "failed questions are counted per group and left out of the rates; a refusal gap and the refusal "
                "bounds beside each row say whether those left out could explain its reading.</p>")


def summary_row(model: str, card: pd.DataFrame, trace: dict[str, Any] | None = None) -> dict[str, Any]:
    """One line of the side-by-side table (numbers in numeric columns, intervals as low/high): validity, the
    lowest ratio (against the benchmark for A) and the TVDs, with the run's trace fields."""
    row: dict[str, Any] = {"model": model, "method": card["method"].iloc[0] if len(card) else "",
                           "valid": not (card["measure"] == NO_VALID_AUDIT).any(),
                           "reason": "; ".join(card.loc[card["measure"] == NO_VALID_AUDIT, "reason"].astype(str))}
    ratios = card[(card["measure"] != "") & card["ratio"].notna()] if "ratio" in card else card.iloc[:0]
    if row["method"] == "A":
        ratios = ratios[ratios["reference"] == "benchmark"]
        for measure in (S.RAW_TVD.key, S.CORRECTED_TVD.key):
            t = card[card["measure"] == measure]
            for suffix, col in (("", "rate"), ("_low", "rate_low"), ("_high", "rate_high")):
                row[measure + suffix] = num(t.iloc[0][col]) if len(t) else np.nan
    if len(ratios):
        low = ratios.loc[ratios["ratio"].astype(float).idxmin()]
        row |= {"lowest_ratio": num(low["ratio"]), "lowest_ratio_low": num(low["ratio_low"]),
                "lowest_ratio_high": num(low["ratio_high"]),
                "lowest_ratio_of": f"{low['category']} ({low['measure']}, {low['dimension']})",
                "ratios_below_four_fifths": int(ratios["below_four_fifths"].astype(bool).sum()),
                "ratios": int(len(ratios))}
    return row | {k: (trace or {}).get(k, "") for k in TRACE_COLUMNS}


def _ci_of(r: pd.Series, stem: str) -> str:
    return _ci(r, stem, f"{stem}_low", f"{stem}_high")


def index_html(summary: pd.DataFrame, stand_in: bool, stand_ins: list[str] | None = None) -> str:
    rows = []
    for method, title in (("A", "Method A: text-to-image generators"), ("B", "Method B: VLMs")):
        sub = summary[summary["method"] == method]
        if sub.empty:
            continue
        cols = {"model": lambda r: r["model"], "card": lambda r: "",
                "lowest ratio [CI]": lambda r: _ci_of(r, "lowest_ratio") if r.get("valid", True) else NO_VALID_AUDIT,
                "of": lambda r: r.get("lowest_ratio_of", "") if r.get("valid", True) else r.get("reason", ""),
                f"ratios below {FOUR_FIFTHS} across their interval": lambda r: (f"{_int(r.get('ratios_below_four_fifths'))} of "
                                                      f"{_int(r.get('ratios'))}") if pd.notna(r.get("ratios")) else ""}
        if method == "A":
            for st in (S.RAW_TVD, S.CORRECTED_TVD):  # the two the front page shows, under its names
                cols[f"{st.name} [{st.interval}]"] = lambda r, k=st.key: _ci_of(r, k)
        table = _table(sub, cols)
        for m in sub["model"]:  # the card column holds links (escaped cells cannot)
            e = html.escape(str(m))
            table = table.replace(f"<td>{e}</td><td></td>",
                                  f'<td>{e}</td><td><a href="{e}.html">HTML</a> · <a href="{e}.csv">CSV</a></td>', 1)
        rows.append(f"<h2>{title}</h2>{table}")
    body = ("<p class='note'>One card per audited model. Method A's ratio is against the benchmark; Method B's is the "
            f"impact ratio. A ratio whose interval lies under {FOUR_FIFTHS} is information with its uncertainty, not a "
            "verdict.</p>"
            + "".join(rows) + "<p><a href='all_models.csv'>all_models.csv</a></p>")
    return _page("Audit cards: all models side by side", body, stand_ins or [], stand_in)


@dataclass(frozen=True)
class Validity:
    """When a VLM's answers support an audit (invalid_reasons): reflect_analysis.min_clusters source photos,
    report.card_min_retention of its questions answered."""

    min_clusters: int
    min_retention: float


def _versions(series: pd.Series | None) -> str:
    if series is None:
        return ""
    return ", ".join(sorted({str(v) for v in series.dropna() if str(v)})) or "(not reported)"


def collection_window(stamps: pd.Series | None) -> tuple[str, str]:
    """(first, last) answer time of a model's records (ISO 8601 UTC strings), ('', '') when none is recorded."""
    if stamps is None:
        return "", ""
    when = pd.to_datetime(stamps[stamps.notna() & (stamps.astype(str) != "")].astype(str), utc=True, errors="coerce")
    when = when.dropna()
    if when.empty:
        return "", ""
    return tuple(t.isoformat(timespec="seconds").replace("+00:00", "Z") for t in (when.min(), when.max()))


def model_trace(run: dict[str, Any], frame: pd.DataFrame, stand_in: bool, stamps: pd.Series | None = None,
                **counts: Any) -> dict[str, Any]:
    """The trace fields of one card: the run's, the model id(s) asked, the version(s) that answered and the
    data-collection window of its records (`stamps`, else the frame's answered_at)."""
    first, last = collection_window(frame.get("answered_at") if stamps is None else stamps)
    return run | {"model_id": _versions(frame.get("model_id")), "model_version": _versions(frame.get("model_version")),
                  "stand_in": stand_in, "collected_first": first, "collected_last": last} | counts


def build_cards(reports: Path, responses_dir: Path, boot_a: Resampling, boot_b: Resampling,
                scales: dict[str, dict[str, float] | None], stand_in: bool,
                references: dict[str, dict[str, float]] | None = None, out_dir: Path = C.AUDIT_DIR,
                display: dict[str, str] | None = None, validity: Validity = Validity(12, 0.5),
                run: dict[str, Any] | None = None, stand_ins: list[str] | None = None,
                images_dir: Path | None = None, power_table: pd.DataFrame | None = None,
                labels_dir: Path | None = None) -> pd.DataFrame:
    """Write every card, the index and all_models.csv; return the side-by-side table. `run`: the trace fields
    of this run (profile, params_hash, git_commit, run_date), copied onto every card and CSV row. A generator's
    collection window spans its images' making (`images_dir`'s manifests) and their classification
    (`labels_dir`)."""
    run = {k: (run or {}).get(k, "") for k in ("profile", "params_hash", "git_commit", "code_date")}
    t2i, vlm_out = Outputs.load(reports / "t2i"), Outputs.load(reports / "vlm")
    cards: dict[str, pd.DataFrame] = {}
    traces: dict[str, dict[str, Any]] = {}
    per_prompt = t2i.table(C.TVD_PER_PROMPT)
    if per_prompt.ok and "model" in per_prompt.df:
        for model, sub in per_prompt.df.groupby("model", sort=True):
            model = str(model)
            rep = representation_ratios(sub, boot_a, references, model)
            cards[model] = pd.concat([rep, pd.DataFrame(tvd_rows(t2i, model) + gender_rows(t2i, model))],
                                     ignore_index=True).assign(valid=True)
            manifest = C.manifest_path(images_dir, model) if images_dir is not None else None
            made = pd.read_parquet(manifest) if manifest is not None and manifest.exists() else pd.DataFrame()
            labels = C.labels_path(model, labels_dir) if labels_dir is not None else None
            asked = pd.read_parquet(labels) if labels is not None and labels.exists() else pd.DataFrame()
            stamps = pd.concat([f["answered_at"] for f in (made, asked) if "answered_at" in f] or [pd.Series(dtype=object)])
            traces[model] = model_trace(run, made, stand_in, stamps=stamps, n_prompts=len(sub),
                                        n_unknown=int(sub["n_unknown"].sum()) if "n_unknown" in sub else "")
    for path in sorted(Path(responses_dir).glob("*.parquet")):
        vlm = path.stem
        from biasaudit.vlm.groups import group_rows

        responses = group_rows(pd.read_parquet(path))  # not the placebo tasks nor the null-edit control
        reasons = invalid_reasons(responses, validity.min_clusters, validity.min_retention)
        cards[vlm] = no_valid_audit(reasons) if reasons else with_caveats(
            method_b_rows(responses[RESPONSE_COLUMNS], boot_b, scales, vlm), vlm_out, vlm)
        status = responses["status"]
        traces[vlm] = model_trace(run, responses, stand_in or bool(responses.get("stand_in", pd.Series()).any()),
                                  n_questions=len(responses), n_retained=int((status == OK).sum()),
                                  n_photos=int(responses["unit"].nunique()) if "unit" in responses else "",
                                  n_refused=int((status == "refused").sum()), n_failed=int((status == "failed").sum()))
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = []
    for model, card in cards.items():
        trace = traces[model]
        card = card.assign(model=model).reindex(columns=CARD_COLUMNS).assign(
            **{k: trace[k] for k in TRACE_COLUMNS})
        atomic_write_table(card, out_dir / f"{model}.csv")
        boot = boot_a if (card["method"] == "A").any() else boot_b
        atomic_write_text(out_dir / f"{model}.html", card_html(model, card, stand_in, boot, display, trace, stand_ins,
                                                               power_table))
        summary.append(summary_row(model, card, trace))
    table = pd.DataFrame(summary)
    atomic_write_table(table, out_dir / "all_models.csv")
    atomic_write_text(out_dir / "index.html", index_html(table, stand_in, stand_ins))
    return table
