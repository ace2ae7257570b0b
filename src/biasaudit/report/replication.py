"""The replication table: every number the two papers publish (data/reference/published/) beside this
run's value of the same statistic, with its interval, the difference and whether the interval covers it.

One row per published row (`id`). Each `statistic` is read from the one table that computes it (the
`source` column names it; `LOOKUPS` maps statistic → reader); where this run does not compute it the row
says "not computed: <why>". Kinds of rows:

- result: a number the paper reports; `difference` = this run − published, `covered` = the run's interval
  [low, high] contains the published value (empty when the run's table has no interval for it);
- claim: a bound the paper states (relation `<` or `>`, e.g. "most … are classified as Black" is a share
  > 0.5); `covered` = the run's whole interval lies on the claimed side of the bound; no difference;
- design: a setting of the published study (150 prompts, 300 annotated images, …); `difference` = this
  run − published, no interval.

Under a stand-in run (`Params.stand_ins()` non-empty: a stand-in, planted or simulated part ran) the
table claims no comparison: `difference` and `covered` are empty and every note starts with
"stand-in run: no comparison" (the page carries the banner). The one exception is the referee run (profile
`referee`, biasaudit/referee.py): there every model is PLANTED with the published values as its truth, so the
table compares, each note starts with REFEREE_NOTE, and `referee_check` rules each row recovered, a named
chance miss, or not recovered (a row whose statistic no planter sets says so). Written to `reports/replication.csv` and
`reports/pages/replication.html`, linked from the front page.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, select_autoescape

from biasaudit import contracts as C
from biasaudit.pipeline.io import atomic_write_table, atomic_write_text
from biasaudit.report.html import HEAD, PAGES, STAND_IN_NOTE, STYLE, replication_summary
from biasaudit.report.load import Loaded, Outputs, ci, fmt, num, read_json
from biasaudit.vlm.groups import COUNTERFACTUAL, NULL_EDIT, ORIGINAL

PUBLISHED_FILES = ("method_a.csv", "method_b.csv")
PUBLISHED_COLUMNS = ("id", "method", "kind", "statistic", "model", "run_model", "category", "group", "subset",
                     "relation", "value", "unit", "sentence")
COLUMNS = ("id", "method", "kind", "statistic", "model", "run_model", "category", "group", "subset", "unit",
           "relation", "published", "this_run", "low", "high", "difference", "covered", "source", "note", "sentence")
NOT_COMPUTED = "not computed"
EVERY = "*"  # run_model: every model (or VLM) of the run
REFEREE_PROFILE = "referee"
REFEREE_NOTE = ("referee run: compared with the PLANTED truth (= the published value, biasaudit/referee.py), "
                "not a replication of any real model")
CHANCE_MISS = "chance miss"
RECOVERED, NOT_RECOVERED, CANNOT_PLANT = "recovered", "not recovered", "cannot be planted"  # referee_check's verdicts
# a row whose planted world itself misses its target (referee.planting_misses): its miss is never chance
PLANTING_MISSED = "planting missed"


def load_published(folder: Path) -> pd.DataFrame:
    """Both papers' published numbers, one row each, in id order (strings kept as written)."""
    frames = [pd.read_csv(Path(folder) / name, dtype=str, keep_default_na=False) for name in PUBLISHED_FILES]
    df = pd.concat(frames, ignore_index=True)
    missing = [c for c in PUBLISHED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{folder}: published CSVs lack column(s) {', '.join(missing)}")
    if df["id"].duplicated().any():
        raise ValueError(f"{folder}: duplicate ids {sorted(df.loc[df['id'].duplicated(), 'id'])}")
    return df


def subset_of(text: str) -> dict[str, str]:
    """'space=face;instance=Chen' → {'space': 'face', 'instance': 'Chen'}."""
    out = {}
    for part in str(text or "").split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass
class RunValue:
    """This run's value of one published statistic: the estimate, its interval (NaN: none), the table and
    column it came from, a note, or the reason it is not computed."""

    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    source: str = ""
    note: str = ""
    missing: str = ""  # why not computed ('' when computed)


def not_computed(why: str, source: str = "") -> RunValue:
    return RunValue(source=source, missing=why)


def covers(published: float, low: float, high: float, relation: str = "=") -> bool | None:
    """Whether [low, high] covers the published value ('='), or lies wholly on the claimed side of a
    bound ('<': high below it, '>': low above it); None without an interval."""
    if any(math.isnan(x) for x in (published, low, high)):
        return None
    if relation == "<":
        return bool(high < published)
    if relation == ">":
        return bool(low > published)
    return bool(low <= published <= high)


def is_referee(profile: str, stand_ins: Sequence[str]) -> bool:
    """The referee run: the referee profile, whose every model is planted (a run of real models compares as
    any other run, whatever its profile is called)."""
    return profile == REFEREE_PROFILE and bool(stand_ins)


def point_tolerance(published: str) -> float:
    """Half a unit of the published value's last digit ('0.222' → 0.0005, '172' → 0.5): in the referee run a
    value without an interval is recovered within the published rounding."""
    text = str(published).strip()
    decimals = len(text.split(".", 1)[1]) if "." in text else 0
    return 0.5 * 10.0 ** -decimals


def compare(row: Mapping[str, Any], rv: RunValue, stand_in: bool, referee: bool = False) -> dict[str, Any]:
    """One replication row: the published row, this run's value and interval, difference, covered, note.
    `referee`: the referee run compares although its models are planted (its note says so), and rules a row
    without an interval by the point: a claim's point on the claimed side, a number within its rounding."""
    pub = num(row["value"])
    rel = str(row.get("relation") or "=")
    out = {c: row.get(c, "") for c in COLUMNS if c in PUBLISHED_COLUMNS}
    out.update(published=pub, this_run=rv.value, low=rv.low, high=rv.high, source=rv.source,
               difference=math.nan, covered="")
    notes = []
    if referee:
        stand_in = False
    if rv.missing:
        notes.append(f"{NOT_COMPUTED}: {rv.missing}")
    elif referee and math.isnan(num(rv.low)) and not math.isnan(rv.value):
        if rel == "=":
            out["difference"] = rv.value - pub
            tol = point_tolerance(row["value"])
            out["covered"] = bool(abs(rv.value - pub) <= tol + 1e-9)
            notes.append(f"no interval: recovered when within the published rounding (± {tol:g})")
        else:
            out["covered"] = _holds(rv.value, pub, rel)
            notes.append(f"no interval: recovered when the point lies on the claimed side ({rel} {fmt(pub)})")
    elif not stand_in:
        if rel == "=" and not math.isnan(rv.value):
            out["difference"] = rv.value - pub
        c = covers(pub, rv.low, rv.high, rel)
        if c is not None:
            out["covered"] = c
        elif not math.isnan(rv.value) and row.get("kind") == "design":
            notes.append("a setting of the study: compared as a value, no interval")
        elif not math.isnan(rv.value):
            notes.append("no interval in this run's table: point only" + (
                "" if rel == "=" else f"; the point {'satisfies' if _holds(rv.value, pub, rel) else 'does not satisfy'}"
                f" the claim ({rel} {fmt(pub)})"))
        if rel != "=" and c is False:
            against = rv.low > pub if rel == "<" else rv.high < pub
            if rv.low == rv.high:  # a count or a set-valued reading, not an estimate with an interval
                against = True
            notes.append("the interval lies on the other side of the bound: the run contradicts the claim" if against
                         else "the interval straddles the bound: the claim is neither confirmed nor contradicted")
    if rv.note:
        notes.append(rv.note)
    if referee:
        notes.insert(0, REFEREE_NOTE)
    elif stand_in:
        notes.insert(0, STAND_IN_NOTE)
    out["note"] = "; ".join(notes)
    return out


def _holds(x: float, bound: float, rel: str) -> bool:
    return x < bound if rel == "<" else x > bound if rel == ">" else x == bound


# ------------------------------------------------------------------------------ this run's values

@dataclass
class Run:
    """What the lookups read: the two analysis folders, the FOCUS manifest, the active labels and the few
    settings the tables do not record (`design`: faces.detector, faces.det_threshold, faces.skin_method;
    `options`: measure → its answer options, e.g. {"mcq_salary": {"A": …, …}})."""

    t2i: Outputs
    vlm: Outputs
    groups: tuple[str, ...] = C.GROUPS
    focus_manifest: Path | None = None
    design: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    level: float = 0.95  # of the run's intervals; a direction claim's test uses α = 1 − level

    @classmethod
    def load(cls, reports: Path, root: Path = Path("."), **kw: Any) -> "Run":
        return cls(Outputs.load(Path(reports) / "t2i"), Outputs.load(Path(reports) / "vlm"),
                   focus_manifest=Path(root) / C.FOCUS_MANIFEST, **kw)


def _src(t: Loaded, column: str, where: str = "") -> str:
    return f"{t.name}.{column}" + (f" ({where})" if where else "")


class NotComputed(Exception):
    """Raised by a reader that finds no run value; the table builder turns it into not_computed(why, source)."""

    def __init__(self, why: str, source: str = ""):
        super().__init__(why)
        self.why, self.source = why, source


def _pick(t: Loaded, row: Mapping[str, Any], column: str, **match: str) -> pd.DataFrame:
    """The rows of a loaded table for the row's model and the given column values; NotComputed, naming why,
    when there are none."""
    if not t.ok:
        raise NotComputed(t.reason or f"no table {t.name}", _src(t, column))
    df = t.df
    model = str(row["run_model"])
    if "model" in df and model != EVERY:
        if model not in set(df["model"].astype(str)):
            raise NotComputed(f"this run has no model {model} (its models: "
                              f"{', '.join(dict.fromkeys(df['model'].astype(str)))})", _src(t, column))
        df = df[df["model"].astype(str) == model]
    for col, val in match.items():
        sel = df[df[col].astype(str).str.lower() == str(val).lower()]
        if sel.empty:
            raise NotComputed(f"{t.name} has no row with {col} = {val}" + (f" for {model}" if model != EVERY else ""),
                              _src(t, column))
        df = sel
    return df


def _one(t: Loaded, row: Mapping[str, Any], column: str, low: str = "", high: str = "", **match: str) -> RunValue:
    df = _pick(t, row, column, **match)
    r = df.iloc[0]
    return RunValue(num(r[column]), num(r[low]) if low else math.nan, num(r[high]) if high else math.nan,
                    _src(t, column))


def mean_tvd(run: Run, row: Mapping[str, Any]) -> RunValue:
    return _one(run.t2i.table(C.TVD_SUMMARY), row, "mean_tvd", "mean_tvd_low", "mean_tvd_high",
                category=row["category"])


def mean_deviation(run: Run, row: Mapping[str, Any]) -> RunValue:
    rv = _one(run.t2i.table(C.DEVIATION_BY_RACE), row, "mean_deviation", "mean_deviation_low", "mean_deviation_high",
              category=row["category"], race=row["group"])
    rv.note = "mean over prompts of (model share − benchmark share)" + (
        "; the paper's '20%' read as 0.20 of a share (percentage points)" if row["relation"] == "=" else "")
    return rv


def share_reaching(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.THRESHOLD_SUMMARY)
    df = _pick(t, row, "share_reaching", category=row["category"], group=row["group"])
    r = df.iloc[0]
    return RunValue(num(r["share_reaching"]), source=_src(t, "share_reaching"),
                    note=f"{int(num(r['n_reaching']))} of {int(num(r['n_prompts_above']))} prompts above the "
                         f"benchmark share {fmt(r['threshold'], 2)} reach it")


def threshold_share(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.THRESHOLD_SUMMARY)
    df = _pick(t, row, "threshold", group=row["group"])
    return RunValue(num(df["threshold"].iloc[0]), source=_src(t, "threshold", "analyze.threshold_share"))


def L_mean(run: Run, row: Mapping[str, Any]) -> RunValue:
    return _one(run.t2i.table(C.SKIN_SUMMARY_BY_LABEL), row, "L_mean", "L_mean_lo", "L_mean_hi", label=row["group"])


def n_classified(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    col = f"n_{row['group']}"
    df = _pick(t, row, col)
    if col not in df:
        return not_computed(f"{t.name} has no column {col} (not a label of the active group set)", _src(t, col))
    return RunValue(float(df[col].map(num).sum()), source=_src(t, col, "summed over prompts"))


def dark_share(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.SKIN_DARK_SHARE)
    df = _pick(t, row, "share", group=row["group"])
    r = df.iloc[0]
    want = num(subset_of(row["subset"]).get("L_below"))
    rv = RunValue(num(r["share"]), num(r["share_low"]), num(r["share_high"]), _src(t, "share"),
                  f"{int(num(r['n_dark']))} faces below L* {fmt(r['L_threshold'], 0)}")
    if not math.isnan(want) and num(r["L_threshold"]) != want:
        return not_computed(f"this run's threshold is L* < {fmt(r['L_threshold'], 0)} (the analysis' very-dark threshold), "
                            f"the paper's {fmt(want, 0)}", rv.source)
    return rv


def prompt_tvd_max(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    instance = subset_of(row["subset"]).get("instance", "")
    df = _pick(t, row, "tvd", category=row["category"], instance=instance)
    tv = df["tvd"].map(num).dropna()
    if tv.empty:
        return not_computed(f"no labelled image for the prompt {instance}", _src(t, "tvd"))
    return RunValue(float(tv.max()), source=_src(t, "tvd", "largest over models"),
                    note=f"{len(tv)} model(s)")


def earnings_slope_p(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.SKIN_EARNINGS_OLS)
    df = _pick(t, row, "p_value", group=row["group"])
    r = df.iloc[0]
    if math.isnan(num(r["p_value"])):
        return not_computed(f"no fit ({int(num(r['n_clusters']))} prompts)", _src(t, "p_value"))
    return RunValue(num(r["p_value"]), source=_src(t, "p_value"),
                    note=f"slope {fmt(r['slope'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] L* per "
                         f"analyze.earnings_unit_usd of median weekly earnings, {int(num(r['n_clusters']))} prompts")


def homogeneity_gap(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.HOMOGENEITY_BY_RACE)
    space = subset_of(row["subset"]).get("space", "")
    df = _pick(t, row, "gap", space=space, group=row["group"])
    r = df.iloc[0]
    return RunValue(num(r["gap"]), num(r["gap_lo"]), num(r["gap_hi"]), _src(t, "gap", "the paper's unstratified gap"),
                    f"within-prompt gap {fmt(r['wp_gap'])} [{fmt(r['wp_gap_lo'])}, {fmt(r['wp_gap_hi'])}]")


def _bins(run: Run, row: Mapping[str, Any], group: str, column: str) -> RunValue:
    t = run.t2i.table(C.HOMOGENEITY_BY_L_BIN)
    df = _pick(t, row, column, space=subset_of(row["subset"]).get("space", ""), group=group)
    r = df.iloc[0]
    lo, hi = (num(r[f"{column}_lo"]), num(r[f"{column}_hi"])) if f"{column}_lo" in df else (math.nan, math.nan)
    return RunValue(num(r[column]), lo, hi, _src(t, column))


def mean_similarity(run: Run, row: Mapping[str, Any]) -> RunValue:
    rv = _bins(run, row, str(row["group"]), "intra")
    rv.source += " (mean intra-bin cosine; interval: intra_lo/hi, bootstrap over prompts)" if rv.source else ""
    return rv


def similarity_difference(run: Run, row: Mapping[str, Any]) -> RunValue:
    """One L* bin's mean similarity minus the next lighter bin's: `intra_minus_next` with its bootstrap interval
    (the same resamples for both bins) when the second bin is the next one of the table, else the point
    difference."""
    a, _, b = str(row["group"]).partition(" minus ")
    x, y = _bins(run, row, a, "intra"), _bins(run, row, b, "intra")
    if x.missing or y.missing:
        return not_computed(x.missing or y.missing, x.source)
    t = run.t2i.table(C.HOMOGENEITY_BY_L_BIN)
    df = _pick(t, row, "intra", space=subset_of(row["subset"]).get("space", "")).reset_index(drop=True)
    groups = list(df["group"].astype(str))
    i = groups.index(a)
    if i + 1 < len(groups) and groups[i + 1] == b and "intra_minus_next" in df:
        r = df.iloc[i]
        return RunValue(num(r["intra_minus_next"]), num(r.get("intra_minus_next_lo")), num(r.get("intra_minus_next_hi")),
                        _src(t, "intra_minus_next", f"{a} − {b}"))
    return RunValue(x.value - y.value, source=f"{x.source}: {a} − {b}", note="not adjacent bins: point only")


def n_in_bin(run: Run, row: Mapping[str, Any]) -> RunValue:
    return _bins(run, row, str(row["group"]), "n")


def cohen_kappa(run: Run, row: Mapping[str, Any]) -> RunValue:
    kind = subset_of(row["subset"]).get("kind", "")
    mean = run.t2i.table(C.MEAN_KAPPA, where="reliability")
    rv = _one(mean, row, "mean_cohen_kappa", kind=kind)
    pairs = run.t2i.table(C.PAIRWISE_KAPPA, where="reliability")
    try:
        df = _pick(pairs, row, "cohen_kappa", kind=kind)
    except NotComputed:  # no pairwise table: the mean stands without an interval
        df = pd.DataFrame()
    if len(df) == 1:  # one pair: the mean is that pair's κ, whose bootstrap interval over images is the interval
        rv.low, rv.high = num(df["ci_low"].iloc[0]), num(df["ci_high"].iloc[0])
        rv.source += f"; interval: {pairs.name}.ci_low/ci_high"
    elif len(df):
        rv.note = f"mean of {len(df)} pairs (no interval of the mean): " + ", ".join(
            f"{r.rater_a}–{r.rater_b} {fmt(r.cohen_kappa)} [{fmt(r.ci_low)}, {fmt(r.ci_high)}]" for r in df.itertuples())
    return rv


def fleiss_kappa(run: Run, row: Mapping[str, Any]) -> RunValue:
    raters = subset_of(row["subset"]).get("raters", "all")
    return _one(run.t2i.table(C.FLEISS_KAPPA, where="reliability"), row, "fleiss_kappa", "ci_low", "ci_high",
                group=row["group"], raters=raters)


def disagreement_share(run: Run, row: Mapping[str, Any]) -> RunValue:
    against = subset_of(row["subset"]).get("against", "")
    t = run.t2i.table(C.disagreements(run.groups), where="reliability")
    if against not in run.groups:
        return not_computed(f"{against} is not a label of the active group set", _src(t, against))
    df = _pick(t, row, against, index=row["group"])
    r = df.iloc[0]
    return RunValue(num(r[against]), source=_src(t, against, "all rater pairs, classifier included"),
                    note=f"{int(num(r['n_disagreements']))} disagreements involve {row['group']}")


def reliability_sample(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.PAIRWISE_KAPPA, where="reliability")
    df = _pick(t, row, "n")
    return RunValue(num(df["n"].iloc[0]), source=_src(t, "n", "images every rater labelled"))


def n_raters(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.PAIRWISE_KAPPA, where="reliability")
    df = _pick(t, row, "rater_a")
    hh = df[df["kind"] == "human-human"]
    humans = set(hh["rater_a"].astype(str)) | set(hh["rater_b"].astype(str))
    return RunValue(float(len(humans)), source=_src(t, "rater_a/rater_b", "human raters"))


def n_labels(run: Run, row: Mapping[str, Any]) -> RunValue:
    return RunValue(float(len(run.groups)), source="Params.groups (benchmarks.group_set)")


def parsing_classes(run: Run, row: Mapping[str, Any]) -> RunValue:
    method = run.design.get("faces.skin_method", "")
    return not_computed(f"a constant of the parsing network (faces/bisenet.py N_CLASSES), not a run output; this run's "
                        f"skin mask: faces.skin_method = {method or '?'}")


def det_threshold(run: Run, row: Mapping[str, Any]) -> RunValue:
    if "faces.det_threshold" not in run.design:
        return not_computed("faces.det_threshold not passed to the report")
    return RunValue(num(run.design["faces.det_threshold"]), source="params faces.det_threshold",
                    note=f"applies to the InsightFace detector; this run's detector: {run.design.get('faces.detector', '?')}")


def benchmark_share(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    col = f"bench_{row['group']}"
    instance = subset_of(row["subset"]).get("instance", "")
    try:
        df = _pick(t, row, col, category=row["category"], instance=instance)
    except NotComputed as exc:
        return not_computed(exc.why + " (this run's prompts do not include it)", exc.source)
    return RunValue(num(df[col].iloc[0]), source=_src(t, col, "the benchmark of this run's prompt"))


def _per_prompt(run: Run) -> tuple[pd.DataFrame, str]:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    return (t.df, "") if t.ok else (pd.DataFrame(), t.reason or "no tvd_per_prompt")


def n_prompts(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    df, why = _per_prompt(run)
    if why:
        return not_computed(why, _src(t, "prompt_id"))
    if row["category"] == "each":
        per = df.groupby("category")["prompt_id"].nunique()
        return RunValue(float(per.min()), source=_src(t, "prompt_id", "fewest prompts of a category"),
                        note=", ".join(f"{k} {v}" for k, v in per.items()))
    return RunValue(float(df["prompt_id"].nunique()), source=_src(t, "prompt_id", "prompts with a labelled image"))


def images_per_prompt(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    df, why = _per_prompt(run)
    if why:
        return not_computed(why, _src(t, "n"))
    labelled = df["n"].map(num) + (df["n_unknown"].map(num) if "n_unknown" in df else 0)
    return RunValue(float(labelled.median()), source=_src(t, "n + n_unknown", "median labelled images per prompt × model"))


def n_models(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_SUMMARY)
    if not t.ok:
        return not_computed(t.reason, _src(t, "model"))
    return RunValue(float(t.df["model"].nunique()), source=_src(t, "model"))


def n_categories(run: Run, row: Mapping[str, Any]) -> RunValue:
    t = run.t2i.table(C.TVD_SUMMARY)
    if not t.ok:
        return not_computed(t.reason, _src(t, "category"))
    return RunValue(float(t.df.loc[t.df["category"] != "all", "category"].nunique()), source=_src(t, "category"))


# ------------------------------------------------------------------------------------- Method B

def _focus(run: Run) -> tuple[pd.DataFrame, str]:
    path = run.focus_manifest
    if path is None or not path.exists():
        return pd.DataFrame(), f"{C.FOCUS_MANIFEST} not found (the counterfactuals stage has not run)"
    df = pd.read_parquet(path)
    if "status" in df:
        df = df[df["status"] == C.OK]
    return df, ""


def _focus_count(column: str | None, what: str, arm: str = COUNTERFACTUAL) -> Callable[[Run, Mapping[str, Any]], RunValue]:
    """A count of the FOCUS manifest's ok edits of one arm: the paper's counterfactual edits (B01–B07), or a
    control arm the paper does not have (null_edit, original: their own rows)."""
    def lookup(run: Run, row: Mapping[str, Any]) -> RunValue:
        df, why = _focus(run)
        if why:
            return not_computed(why)
        if "arm" in df:
            df = df[df["arm"].fillna(COUNTERFACTUAL).astype(str) == arm]
        elif arm != COUNTERFACTUAL:  # a manifest without arms (an imported set) has no control edits
            df = df.iloc[:0]
        src = f"{C.FOCUS_MANIFEST} ({what}, arm {arm}, edits with status ok)"
        if column is None:
            return RunValue(float(len(df)), source=src)
        if column == "group":
            return RunValue(float(df[["race", "gender"]].drop_duplicates().shape[0]), source=src)
        return RunValue(float(df[column].nunique()), source=src)
    return lookup


def n_vlms(run: Run, row: Mapping[str, Any]) -> RunValue:
    summary = read_json(run.vlm.root / "summary.json")
    if not isinstance(summary, dict) or not isinstance(summary.get("vlms"), dict):
        return not_computed(f"{run.vlm.root}/summary.json not found (reflect_analysis has not run)")
    return RunValue(float(len(summary["vlms"])), source="reports/vlm/summary.json (vlms)",
                    note=", ".join(summary["vlms"]))


def n_task_kinds(run: Run, row: Mapping[str, Any]) -> RunValue:
    tables = [t for _, t in run.vlm.tables_of(C.RETENTION) if t.ok]
    if not tables:
        return not_computed("no <vlm>_retention table in reports/vlm/tables")
    kinds = sorted({str(k) for t in tables for k, a in zip(t.df["kind"], t.df["asked"]) if num(a) > 0})
    return RunValue(float(len(kinds)), source="<vlm>_retention.kind (asked > 0)", note=", ".join(kinds))


def two_afc_scenarios(run: Run, row: Mapping[str, Any]) -> RunValue:
    tasks = sorted({k["task"] for k, t in run.vlm.tables_of(C.RACE_WINRATE)})
    if not tasks:
        return not_computed("no <vlm>_race_winrate_<task> table in reports/vlm/tables")
    return RunValue(float(len(tasks)), source="<vlm>_race_winrate_<task> tables", note=", ".join(tasks))


def two_afc_images(run: Run, row: Mapping[str, Any]) -> RunValue:
    return not_computed("fixed by the task design (biasaudit.vlm.tasks: two images of one source photo, or one "
                        "composite of the two for a one-image VLM), not a run output")


def mcq_options(run: Run, row: Mapping[str, Any]) -> RunValue:
    options = run.options.get(str(row["category"]))
    if options is None:
        return not_computed(f"no answer options for {row['category']} passed to the report")
    return RunValue(float(len(options)), source="params reflect.task_specs (the MCQ tasks' values)",
                    note=", ".join(map(str, options)))


def share_negative_delta_g(run: Run, row: Mapping[str, Any]) -> RunValue:
    ref = subset_of(row["subset"]).get("reference", "White")
    frames = [t.df.assign(vlm=k["vlm"]) for k, t in run.vlm.tables_of(C.DELTA_G) if t.ok]
    if not frames:
        return not_computed("no <vlm>_delta_g table in reports/vlm/tables")
    df = pd.concat(frames, ignore_index=True)
    df = df[(df["measure"] == row["category"]) & (df["dimension"] == "race") & (df["level"].astype(str) != ref)]
    d = df["delta_pct"].map(num).dropna()
    if d.empty:
        return not_computed(f"no race Δg on {row['category']} in this run")
    per = df.assign(neg=df["delta_pct"].map(num) < 0).groupby("vlm")["neg"].mean()
    return RunValue(float((d < 0).mean()), source="<vlm>_delta_g.delta_pct (race, pooled over VLMs)",
                    note="per VLM: " + ", ".join(f"{v} {x:.2f}" for v, x in per.items()))


# ------------------------------------------------------------------ direction claims (the seeds' stated claims)
#
# A claim such as "Imagen 4 Fast has the largest Black disparity" is read as a margin with an interval: the
# claimed model's (or group's) estimate against the nearest other one, on the claimed side of 0 (relation
# ">", value 0), so `covered` is true only when the run supports the claim. Where the table has only
# marginal intervals, the margin's interval is built from them: [lo_claimed − hi_other, hi_claimed − lo_other]
# for each other, the smallest over others; when every marginal interval covers (probability ≥ 1 − k·α for k
# intervals) the true margin lies in it, so it is conservative.

def _margin(frame: pd.DataFrame, claimed: str, extreme: str, what: str) -> RunValue:
    """frame: index = models (or groups), columns est, lo, hi. The margin by which `claimed` is the largest
    (extreme max) or the smallest (min) of them, with the interval from the marginal ones."""
    frame = frame[frame["est"].notna()]
    if claimed not in frame.index:
        raise NotComputed(f"no estimate for {claimed} ({what})")
    others = frame.drop(index=claimed)
    if others.empty:
        raise NotComputed(f"only {claimed} has an estimate: nothing to compare ({what})")
    c = frame.loc[claimed]
    sign = 1.0 if extreme == "max" else -1.0
    point = sign * (c["est"] - others["est"])
    if sign > 0:
        low, high = c["lo"] - others["hi"], c["hi"] - others["lo"]
    else:
        low, high = others["lo"] - c["hi"], others["hi"] - c["lo"]
    nearest = point.idxmin()
    shown = ", ".join(f"{k} {fmt(r.est)}" + ("" if math.isnan(r.lo) else f" [{fmt(r.lo)}, {fmt(r.hi)}]")
                      for k, r in frame.iterrows())
    rv = RunValue(float(point.min()), float(low.min()), float(high.min()))
    rv.note = (f"margin of {claimed} over the nearest other ({nearest}) as the {'largest' if sign > 0 else 'smallest'} "
               f"{what}; interval from the marginal ones (conservative); {shown}")
    return rv


def _frame(df: pd.DataFrame, key: str, est: str, lo: str = "", hi: str = "") -> pd.DataFrame:
    return pd.DataFrame({"est": df[est].map(num).to_numpy(),
                         "lo": df[lo].map(num).to_numpy() if lo and lo in df else math.nan,
                         "hi": df[hi].map(num).to_numpy() if hi and hi in df else math.nan},
                        index=df[key].astype(str).to_numpy())


def _all_models(t: Loaded, column: str, **match: str) -> pd.DataFrame:
    return _pick(t, {"run_model": EVERY}, column, **match)


MODEL_MEASURES = {  # subset measure= → (table, estimate, low, high, what, match from the row)
    "mean_deviation": (C.DEVIATION_BY_RACE, "mean_deviation", "mean_deviation_low", "mean_deviation_high",
                       "mean deviation (model − benchmark share)", ("category", "race")),
    "mean_tvd": (C.TVD_SUMMARY, "mean_tvd", "mean_tvd_low", "mean_tvd_high", "mean TVD", ("category",)),
    "L_mean": (C.SKIN_SUMMARY_BY_MODEL, "L_mean", "L_mean_lo", "L_mean_hi", "mean L* of every measured face", ()),
    "diversity_de2000": (C.SKIN_SUMMARY_BY_MODEL, "diversity_de2000", "diversity_de2000_lo", "diversity_de2000_hi",
                         "skin-tone diversity (mean pairwise ΔE2000, every measured face)", ()),
}


def model_extreme(run: Run, row: Mapping[str, Any]) -> RunValue:
    """The row's model is the largest (extreme=max) or smallest (min) of the run's models on a measure."""
    sub = subset_of(row["subset"])
    measure, extreme = sub.get("measure", ""), sub.get("extreme", "max")
    if measure == "face_similarity":
        t = run.t2i.table(C.HOMOGENEITY_OVERALL)
        df = _all_models(t, "intra", space=sub.get("space", "face"))
        rv = _margin(_frame(df, "model", "intra", "intra_lo", "intra_hi"), str(row["run_model"]), extreme,
                     "mean pairwise face cosine (every embedded face)")
        rv.source = _src(t, "intra", f"{extreme} of models")
        return rv
    spec, est, lo, hi, what, keys = MODEL_MEASURES[measure]
    t = run.t2i.table(spec)
    names = {"category": row["category"], "race": row["group"]}
    df = _all_models(t, est, **{k: names[k] for k in keys})
    rv = _margin(_frame(df, "model", est, lo, hi), str(row["run_model"]), extreme, what)
    rv.source = _src(t, est, f"{extreme} of models")
    return rv


def group_extreme(run: Run, row: Mapping[str, Any]) -> RunValue:
    """Within the row's model: its group has the largest homogeneity gap of every label (the paper's gap)."""
    sub = subset_of(row["subset"])
    t = run.t2i.table(C.HOMOGENEITY_BY_RACE)
    df = _pick(t, row, "gap", space=sub.get("space", "face"))
    rv = _margin(_frame(df, "group", "gap", "gap_lo", "gap_hi"), str(row["group"]), sub.get("extreme", "max"),
                 f"homogeneity gap ({sub.get('space', 'face')})")
    rv.source = _src(t, "gap", "largest of labels")
    return rv


def wilson(k: float, n: float, level: float) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n."""
    from scipy.stats import norm

    if n <= 0:
        return math.nan, math.nan
    z = float(norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def prompt_deviation(run: Run, row: Mapping[str, Any]) -> RunValue:
    """A prompt's share of a label minus its benchmark share, with a Wilson interval for the share (images of
    one prompt: a binomial count); for every model ("*"), the one least favourable to the claim."""
    t = run.t2i.table(C.TVD_PER_PROMPT)
    g, instance, rel = str(row["group"]), subset_of(row["subset"]).get("instance", ""), str(row["relation"])
    try:
        df = _pick(t, row, f"n_{g}", category=row["category"], instance=instance)
    except NotComputed as exc:
        return not_computed(exc.why + " (this run's prompts do not include it)", exc.source)
    per = []
    for r in df.to_dict("records"):
        k, n, bench = num(r.get(f"n_{g}")), num(r.get("n")), num(r.get(f"bench_{g}"))
        lo, hi = wilson(k, n, run.level)
        per.append((str(r["model"]), k / n - bench if n > 0 else math.nan, lo - bench, hi - bench, int(n)))
    frame = pd.DataFrame(per, columns=["model", "est", "lo", "hi", "n"]).dropna(subset=["est"])
    if frame.empty:
        return not_computed(f"no labelled image for the prompt {instance}", _src(t, f"n_{g}"))
    agg = "max" if rel == "<" else "min"  # the model least favourable to the claim
    rv = RunValue(float(getattr(frame["est"], agg)()), float(getattr(frame["lo"], agg)()),
                  float(getattr(frame["hi"], agg)()), _src(t, f"n_{g}/n − bench_{g}", f"prompt {instance}"))
    rv.note = "share − benchmark, Wilson interval per model: " + ", ".join(
        f"{r.model} {fmt(r.est)} [{fmt(r.lo)}, {fmt(r.hi)}] of {r.n}" for r in frame.itertuples()) + (
        f"; the {'largest' if agg == 'max' else 'smallest'} over models" if len(frame) > 1 else "")
    return rv


def women_share_slope(run: Run, row: Mapping[str, Any]) -> RunValue:
    """L* per 10 points of women in the occupation: the seed's subset (the row's model and label)."""
    from biasaudit.t2i.analysis.skin import SEED_SUBSET

    t = run.t2i.table(C.SKIN_WOMEN_SHARE_OLS)
    df = _pick(t, row, "slope", subset=SEED_SUBSET, group=row["group"])
    r = df.iloc[0]
    if math.isnan(num(r["slope"])):
        raise NotComputed(f"no fit ({int(num(r['n_clusters']))} prompts)", _src(t, "slope"))
    rv = RunValue(num(r["slope"]), num(r["ci_low"]), num(r["ci_high"]), _src(t, "slope", "subset seed"),
                  f"L* per 10 points of women, {int(num(r['faces']))} faces in {int(num(r['n_clusters']))} prompts, "
                  f"p {fmt(r['p_value'])}")
    try:  # the labelled extension beside it
        from biasaudit.t2i.analysis.skin import LABEL_ADJUSTED

        e = _pick(t, row, "slope", subset=LABEL_ADJUSTED).iloc[0]
        rv.note += f"; extension (every label, label fixed effects): {fmt(e['slope'])} [{fmt(e['ci_low'])}, {fmt(e['ci_high'])}]"
    except NotComputed:
        pass
    return rv


def closest_not_most_diverse(run: Run, row: Mapping[str, Any]) -> RunValue:
    """1 when the model with the smallest overall TVD is not the one with the most diverse skin tones, else 0.
    The interval is [1, 1] when the most diverse model is clear (its diversity interval beyond every other
    model's) and clearly not the closest (its TVD interval above another model's: which other model is the
    closest need not be clear); [0, 0] when both are clear and the same model; else [0, 1]."""
    tv = run.t2i.table(C.TVD_SUMMARY)
    sk = run.t2i.table(C.SKIN_SUMMARY_BY_MODEL)
    a = _frame(_all_models(tv, "mean_tvd", category="all"), "model", "mean_tvd", "mean_tvd_low", "mean_tvd_high")
    b = _frame(_all_models(sk, "diversity_de2000"), "model", "diversity_de2000", "diversity_de2000_lo",
               "diversity_de2000_hi")
    if len(a) < 2 or len(b) < 2:
        raise NotComputed("fewer than two models to compare", _src(tv, "mean_tvd"))
    closest, diverse = str(a["est"].idxmin()), str(b["est"].idxmax())
    ca, cb = _margin(a, closest, "min", "TVD"), _margin(b, diverse, "max", "diversity")
    value = float(closest != diverse)
    above = a.drop(index=diverse, errors="ignore")
    not_closest = diverse in a.index and bool(((a.at[diverse, "lo"] - above["hi"]) > 0).any())
    if cb.low > 0 and not_closest:
        low = high = 1.0
    elif cb.low > 0 and ca.low > 0:
        low, high = value, value
    else:
        low, high = 0.0, 1.0
    return RunValue(value, low, high, f"{_src(tv, 'mean_tvd', 'all')} beside {_src(sk, 'diversity_de2000')}",
                    f"closest to the benchmarks: {closest} (margin {fmt(ca.value)} [{fmt(ca.low)}, {fmt(ca.high)}]); "
                    f"most diverse skin tones: {diverse} (margin {fmt(cb.value)} [{fmt(cb.low)}, {fmt(cb.high)}])"
                    + ("; its TVD interval lies above another model's: clearly not the closest" if not_closest else "")
                    + ("" if low == high else "; not clear from the intervals: [0, 1]"))


def classifier_hispanic_for_white(run: Run, row: Mapping[str, Any]) -> RunValue:
    """Of the images where a human and the classifier split White/Hispanic, the share where the classifier
    says Hispanic (human White): above 0.5 when the classifier labels White faces Hispanic more often than
    humans do. Wilson interval (the pairs of one image are counted as independent: each human's labels are
    stacked)."""
    t = run.t2i.table(C.confusion(run.groups), where="reliability")
    a, b = str(row["group"]), subset_of(row["subset"]).get("against", "")
    if not t.ok:
        raise NotComputed(t.reason or "no confusion table", _src(t, b))
    df = t.df.set_index(t.df["human"].astype(str))
    if a not in df.index or b not in df.index or a not in df or b not in df:
        raise NotComputed(f"{t.name} lacks {a} or {b}", _src(t, b))
    k, m = num(df.loc[a, b]), num(df.loc[b, a])
    if k + m == 0:
        raise NotComputed(f"no {a}/{b} disagreement between a human and the classifier", _src(t, b))
    lo, hi = wilson(k, k + m, run.level)
    return RunValue(k / (k + m), lo, hi, _src(t, f"[{a}, {b}] / ([{a}, {b}] + [{b}, {a}])"),
                    f"human {a} → classifier {b}: {int(k)}; human {b} → classifier {a}: {int(m)}")


def _significant_vlms(run: Run, spec: C.Table, keep: Callable[[pd.DataFrame], pd.Series], what: str) -> RunValue:
    tables = [(k["vlm"], t) for k, t in run.vlm.tables_of(spec) if t.ok]
    if not tables:
        raise NotComputed(f"no {spec.name} table in reports/vlm/tables")
    alpha = 1 - run.level
    per = {}
    for vlm, t in tables:
        df = t.df[keep(t.df)]
        p = df["p_adjusted"].map(num)
        per[vlm] = (int((p < alpha).sum()), int(p.notna().sum()))
    count = float(sum(1 for s, _ in per.values() if s > 0))
    return RunValue(count, count, count, f"{spec.name}.p_adjusted ({what}, α = {alpha:g})",
                    f"VLMs with at least one significant {what} (a count of adjusted tests, no interval needed): "
                    + ", ".join(f"{v} {s} of {n}" for v, (s, n) in per.items()))


def vlms_with_disparity(run: Run, row: Mapping[str, Any]) -> RunValue:
    """How many VLMs show at least one race or gender gap (Δg of the row's measure, or any) with an adjusted
    p below α: disparities that persist under the face-only control."""
    m = str(row["category"])
    return _significant_vlms(run, C.DELTA_G, lambda d: d["dimension"].isin(["race", "gender"])
                             & ((d["measure"] == m) if m else True), "Δg")


def vlms_with_task_variation(run: Run, row: Mapping[str, Any]) -> RunValue:
    """How many VLMs have at least one race whose effect differs across the tasks (the joint sign-flip test of
    the task × group interaction, adjusted over races)."""
    return _significant_vlms(run, C.TASK_INTERACTION, lambda d: d["kind"] == "joint", "task × race interaction")


LOOKUPS: dict[str, Callable[[Run, Mapping[str, Any]], RunValue]] = {
    "mean_tvd": mean_tvd, "mean_deviation": mean_deviation, "share_reaching": share_reaching,
    "threshold_share": threshold_share, "L_mean": L_mean, "n_classified": n_classified, "dark_share": dark_share,
    "prompt_tvd_max": prompt_tvd_max, "earnings_slope_p": earnings_slope_p, "homogeneity_gap": homogeneity_gap,
    "mean_similarity": mean_similarity, "similarity_difference": similarity_difference, "n_in_bin": n_in_bin,
    "cohen_kappa": cohen_kappa, "fleiss_kappa": fleiss_kappa, "disagreement_share": disagreement_share,
    "reliability_sample": reliability_sample, "n_raters": n_raters, "n_labels": n_labels,
    "parsing_classes": parsing_classes, "det_threshold": det_threshold, "benchmark_share": benchmark_share,
    "n_prompts": n_prompts, "n_prompts_per_category": n_prompts, "images_per_prompt": images_per_prompt,
    "n_models": n_models, "n_categories": n_categories,
    "focus_images": _focus_count(None, "edits"), "focus_occupations": _focus_count("occupation", "occupations"),
    "focus_groups": _focus_count("group", "race × gender"), "focus_races": _focus_count("race", "races"),
    "focus_genders": _focus_count("gender", "genders"), "focus_null_edits": _focus_count(None, "null edits", NULL_EDIT),
    "focus_originals": _focus_count(None, "unedited originals", ORIGINAL), "n_vlms": n_vlms, "n_task_kinds": n_task_kinds,
    "two_afc_scenarios": two_afc_scenarios, "two_afc_images": two_afc_images, "mcq_options": mcq_options,
    "share_negative_delta_g": share_negative_delta_g, "model_extreme": model_extreme, "group_extreme": group_extreme,
    "prompt_deviation": prompt_deviation, "women_share_slope": women_share_slope,
    "closest_not_most_diverse": closest_not_most_diverse, "classifier_hispanic_for_white": classifier_hispanic_for_white,
    "vlms_with_disparity": vlms_with_disparity, "vlms_with_task_variation": vlms_with_task_variation,
}


# ------------------------------------------------------------------ readings (the assumptions page)
#
# Where a published sentence admits two readings, the table takes one; `alternative_readings` gives, per row of
# data/reference/assumptions.csv that declares such a reading (R01–R04), this run's value under the reading
# taken and under the alternative, for the assumptions page.

def _tvd(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(p, float) - np.asarray(q, float)).sum())


def pooled_tvd(df: pd.DataFrame, groups: Sequence[str]) -> float:
    """The TVD between a model's labels pooled over its prompts and the benchmark pooled the same way
    (each prompt's benchmark weighted by its labelled images): one distribution against one."""
    n = df["n"].map(num).to_numpy(float)
    if n.sum() <= 0:
        return math.nan
    counts = np.array([df[f"n_{g}"].map(num).fillna(0).sum() for g in groups])
    bench = np.array([(df[f"bench_{g}"].map(num).fillna(0) * n).sum() for g in groups]) / n.sum()
    return _tvd(counts / n.sum(), bench)


def _reading_a06(run: Run) -> str:
    t = run.t2i.table(C.TVD_PER_PROMPT)
    dev = run.t2i.table(C.DEVIATION_BY_RACE)
    row = {"run_model": "imagen-4-fast"}
    pp = _pick(t, row, "share_white", category="occupation")
    d = _pick(dev, row, "mean_deviation", category="occupation", race="white").iloc[0]
    share, bench = pp["share_white"].map(num).mean(), pp["bench_white"].map(num).mean()
    return (f"taken (percentage points, mean of share − benchmark): {fmt(d['mean_deviation'])} "
            f"[{fmt(d['mean_deviation_low'])}, {fmt(d['mean_deviation_high'])}]; alternative (relative, mean share / "
            f"mean benchmark − 1): {fmt(share / bench - 1) if bench else '—'} (imagen-4-fast, occupation)")


def _reading_a17(run: Run) -> str:
    t = run.t2i.table(C.SKIN_DARK_SHARE)
    df = _all_models(t, "share")
    n = df["n_dark"].map(num)
    hits = (df["share"].map(num) * n).sum()
    per = ", ".join(f"{r.model} {fmt(r.share)} [{fmt(r.share_low)}, {fmt(r.share_high)}]" for r in df.itertuples())
    return (f"taken (per model, each > 0.5): {per}; alternative (pooled over models): "
            f"{fmt(hits / n.sum()) if n.sum() else '—'} of {int(n.sum())} faces below L* {fmt(df['L_threshold'].iloc[0], 0)}")


def _reading_b12(run: Run) -> str:
    rv = share_negative_delta_g(run, {"category": "mcq_salary", "subset": "reference=White"})
    if rv.missing:
        raise NotComputed(rv.missing)
    return f"taken (pooled over VLMs): {fmt(rv.value)}; alternative (each VLM): {rv.note.removeprefix('per VLM: ')}"


def _reading_tvd(run: Run) -> str:
    s = run.t2i.table(C.TVD_SUMMARY)
    t = run.t2i.table(C.TVD_PER_PROMPT)
    summ = _all_models(s, "mean_tvd", category="all")
    pp = _all_models(t, "n")
    groups = [g for g in run.groups if f"n_{g}" in pp and f"bench_{g}" in pp]
    parts = [f"{r.model} {fmt(r.mean_tvd)} → {fmt(pooled_tvd(pp[pp['model'] == r.model], groups))}"
             for r in summ.itertuples()]
    return "taken (mean of per-prompt TVDs) → alternative (pooled TVD): " + ", ".join(parts)


READINGS: dict[str, Callable[[Run], str]] = {"R01": _reading_a06, "R02": _reading_a17, "R03": _reading_b12,
                                             "R04": _reading_tvd}


def alternative_readings(run: Run) -> dict[str, str]:
    """Per reading row of the assumptions table: this run's value under the reading taken and the alternative."""
    out = {}
    for rid, fn in READINGS.items():
        try:
            out[rid] = fn(run)
        except NotComputed as exc:
            out[rid] = f"{NOT_COMPUTED}: {exc.why}"
        except (KeyError, ValueError, TypeError) as exc:
            out[rid] = f"{NOT_COMPUTED}: {type(exc).__name__}: {exc}"
    return out


# ------------------------------------------------------------ seed elements with no published number
#
# What the seeds describe or promise without a number to compare (the prompt as a homogeneity group, the global
# SSIM of each edit the rebuttal promises, the intervals of the similarity-by-L* rows): computed by the analysis
# and listed under the table, each with where it is and this run's value.

def seed_elements(run: Run) -> list[dict[str, str]]:
    """One entry per seed element without a published number: element, source, this run's value (or why not)."""
    from biasaudit.report.load import read_csv

    out = []
    t = run.t2i.table(C.HOMOGENEITY_BY_PROMPT)
    if t.ok:
        parts = []
        for (model, space), d in t.df.groupby(["model", "space"]):
            g = d["gap"].map(num)
            top = d.loc[g.idxmax()] if g.notna().any() else None
            parts.append(f"{model}/{space}: median prompt gap {fmt(g.median())} over {g.notna().sum()} prompts"
                         + (f", largest {fmt(top['gap'])} ({top['group']})" if top is not None else ""))
        value = "; ".join(parts)
    else:
        value = f"{NOT_COMPUTED}: {t.reason}"
    out.append({"element": "homogeneity with the prompt as the group (similarity 'within groups defined by race, "
                           "prompt, and skin tone')", "source": f"{C.HOMOGENEITY_BY_PROMPT.name}.gap", "value": value})
    out.append({"element": "similarity by L* bin with intervals, and the 0.222 difference with its interval",
                "source": "homogeneity_by_L_bin.intra_lo/hi, intra_minus_next", "value": "rows A29–A34 above"})
    by_group = read_csv(run.vlm.root / "edit_checks" / "by_group.csv")
    if by_group is not None and "ssim_global_mean" in by_group:
        s = by_group["ssim_global_mean"].map(num)
        value = (f"mean over the edits of each group: {fmt(s.min())}–{fmt(s.max())} across {len(s)} groups "
                 "(1 = pixel-identical)")
    else:
        value = f"{NOT_COMPUTED}: no reports/vlm/edit_checks/by_group.csv with ssim_global_mean (validate_edits has not run)"
    out.append({"element": "Method B: SSIM between each original and its counterfactual, globally (the rebuttal's "
                           "promise; beside it SSIM, PSNR and ΔE outside the face)",
                "source": "edit_checks.parquet ssim_global; reports/vlm/edit_checks/by_group.csv", "value": value})
    parts = []
    # the group labels of vlm/realism.py's by_group: its calibration row per measure, and every edit pooled
    for measure, calibration in (("realism", "original"), ("identity", "original beside itself")):
        t = read_csv(run.vlm.root / "edit_checks" / f"{measure}_by_group.csv")
        rows = t.set_index("group") if t is not None and "group" in t else pd.DataFrame()
        if {"all edits", calibration} <= set(rows.index) and math.isfinite(num(rows.loc["all edits", "mean"])):
            e, c = rows.loc["all edits"], rows.loc[calibration]
            parts.append(f"{measure}: all edits {ci(e['mean'], e['low'], e['high'])}, {calibration} {fmt(c['mean'])}")
        else:
            why = str(rows["reason"].iloc[0]) if "reason" in rows and len(rows) else \
                f"no reports/vlm/edit_checks/{measure}_by_group.csv (validate_edits has not run)"
            parts.append(f"{measure}: {NOT_COMPUTED}: {why}")
    out.append({"element": "Method B: the rebuttal's human study, raters' photorealism and perceived identity "
                           "consistency of the edited images (1–5; docs/raters.md)",
                "source": "reports/vlm/edit_checks/realism_by_group.csv, identity_by_group.csv", "value": "; ".join(parts)})
    return out


def replication_table(published: pd.DataFrame, run: Run, stand_ins: Sequence[str] = (),
                      referee: bool = False) -> pd.DataFrame:
    """One row per published row: this run's value, interval, difference, covered and a note (`referee`:
    the referee run's comparison with its planted truth, see compare)."""
    rows = []
    for row in published.to_dict("records"):
        lookup = LOOKUPS.get(str(row["statistic"]))
        try:
            try:
                rv = lookup(run, row) if lookup else not_computed(f"no reader for the statistic {row['statistic']}")
            except NotComputed as exc:
                rv = not_computed(exc.why, exc.source)
        except (KeyError, ValueError, TypeError, OSError) as exc:  # a table read back wrong becomes a reason
            rv = not_computed(f"{type(exc).__name__}: {exc}")
        rows.append(compare(row, rv, bool(stand_ins), referee))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def allowed_misses(n: int, level: float, quantile: float = 0.99) -> int:
    """The misses n independent intervals at `level` make at most, with probability `quantile` (binomial)."""
    from scipy.stats import binom

    return int(binom.ppf(quantile, n, 1.0 - level)) if n else 0


def referee_check(table: pd.DataFrame, level: float = 0.95, planted: Mapping[str, str] | None = None
                  ) -> tuple[pd.DataFrame, list[str]]:
    """The referee run's verdict: each row whose interval misses its published (= planted) value is a named chance
    miss while the misses stay within what `level` allows (allowed_misses), and so is a claim of no significance
    (a p-value above 1 − `level`), whose planted null falls below it with probability 1 − `level`. Every other row
    not covered fails: a claimed direction (`<`, `>`) whose interval does not lie on the claimed side (it misses
    with probability 1 − the power of its planting, not 1 − `level`: the referee world plants each claim beyond its
    bound with power, docs/referee.md), an interval of width 0 (a count), and a row whose planted world misses its
    target (`planted`'s note starts with PLANTING_MISSED). `planted`: row id → what the referee world planted, or
    "not planted: why". Returns the table with the verdicts in its notes, and the ids that fail."""
    table = table.copy()
    planted = dict(planted or {})
    cov = table["covered"].astype(str).str.lower()
    column = {c: (table[c] if c in table else pd.Series("", index=table.index)).astype(str)
              for c in ("statistic", "relation", "published")}
    null = (column["statistic"].str.endswith("_p") & (column["relation"] == ">")
            & (column["published"].map(num) == round(1.0 - level, 10)))
    low, high = table["low"].map(num), table["high"].map(num)
    interval = (low.notna() & (high > low) & ~column["relation"].isin(["<", ">"])) | null
    n_interval = int((interval & cov.isin(["true", "false"])).sum())
    misses = table.index[interval & (cov == "false")].tolist()
    allowed = allowed_misses(n_interval, level)
    verdicts = {}
    for i in table.index:
        rid = str(table.at[i, "id"])
        extra = [planted[rid]] if rid in planted else []
        if any(str(x).startswith(CANNOT_PLANT) for x in extra):
            verdicts[rid] = CANNOT_PLANT
        elif cov[i] == "true":
            verdicts[rid] = RECOVERED
        elif i in misses and len(misses) <= allowed and not str(planted.get(rid, "")).startswith(PLANTING_MISSED):
            verdicts[rid] = CHANCE_MISS
            extra.append(f"{CHANCE_MISS}: {len(misses)} of {n_interval} intervals at {level:.0%} (or planted nulls at "
                         f"p > {1 - level:.2g}) miss their planted value, at most {allowed} expected by chance "
                         "(binomial 99%)")
        else:
            verdicts[rid] = NOT_RECOVERED
            extra.append("NOT RECOVERED in the referee run")
        if extra:
            table.at[i, "note"] = "; ".join([str(table.at[i, "note"]), *extra])
    table.attrs["verdicts"] = verdicts  # row id → RECOVERED | CHANCE_MISS | CANNOT_PLANT | NOT_RECOVERED
    return table, [rid for rid, v in verdicts.items() if v == NOT_RECOVERED]


# -------------------------------------------------------------------------------------- the page

PAGE = """<h1>Replication: the published numbers beside this run's</h1><p><a href="index.html">← front page</a></p>
{% if referee %}<div class="standin" role="alert">REFEREE RUN — a comparison with PLANTED truth<small>Every model
of this run is planted, its truth set to the published values (biasaudit/referee.py): the table checks that each
reader recovers its number; it replicates no real model. Parts that ran: {{ stand_ins|join('; ') }}.</small></div>
{% elif stand_ins %}<div class="standin" role="alert">NO COMPARISON — a stand-in run<small>This table claims no
comparison with the papers: {{ stand_ins|join('; ') }}. The published values are listed with this run's values for
inspection only; the difference and covered columns are empty.</small></div>{% endif %}
<p class="note">{{ summary }}</p>
<p class="note">One row per number the papers report (data/reference/published/, each with its sentence quoted).
result: difference = this run − published, covered = this run's {{ level }} interval contains the published value;
claim: a bound the paper states, covered = the whole interval lies on the claimed side; design: a setting of the
published study. "not computed" says why. Source: the table and column this run's value is read from.</p>
<div class="scroll"><table class="t"><tr><th>id</th><th>statistic</th><th>published</th><th>this run [interval]</th>
<th>difference</th><th>covered</th><th>source</th><th>note</th></tr>
{% for r in rows %}<tr id="{{ r.id }}"><td>{{ r.id }}<br><small>{{ r.kind }}</small></td>
<td>{{ r.statistic }}<br><small>{{ r.what }}</small><br><small><i>“{{ r.sentence }}”</i></small></td>
<td>{{ r.relation_shown }}{{ r.published_shown }}<br><small>{{ r.unit }}</small></td><td>{{ r.run_shown }}</td>
<td>{{ r.difference_shown }}</td><td>{{ r.covered_shown }}</td><td><small>{{ r.source }}</small></td>
<td><small>{{ r.note }}</small></td></tr>{% endfor %}</table></div>
{% if elements %}<h2 id="seed-elements">Seed elements without a published number</h2>
<p class="note">What the papers describe or promise without a number to compare: computed by this run, shown here.</p>
<table class="t"><tr><th>element</th><th>source</th><th>this run</th></tr>
{% for e in elements %}<tr><td>{{ e.element }}</td><td><small>{{ e.source }}</small></td><td><small>{{ e.value }}</small></td></tr>{% endfor %}</table>{% endif %}
<p class="trail">made by <code>biasaudit.report.replication.replication_table</code> · <a href="replication.csv" download>replication.csv</a></p>
</body></html>
"""


def _shown(r: Mapping[str, Any]) -> dict[str, Any]:
    what = ", ".join(x for x in (str(r["model"]), str(r["category"]), str(r["group"]), str(r["subset"]))
                     if x and x != "nan")
    digits = 1 if str(r["statistic"]) == "L_mean" else 3
    run = fmt(r["this_run"], digits) if not math.isnan(num(r["this_run"])) else "—"
    if not math.isnan(num(r["low"])):
        run += f" [{fmt(r['low'], digits)}, {fmt(r['high'], digits)}]"
    cov = str(r["covered"]).lower()
    return {**r, "what": what, "run_shown": run, "published_shown": fmt(r["published"], digits),
            "relation_shown": "" if r["relation"] == "=" else f"{r['relation']} ",
            "difference_shown": "" if math.isnan(num(r["difference"])) else f"{num(r['difference']):+.{digits}f}",
            "covered_shown": {"true": "yes", "false": "NO"}.get(cov, "")}


def write_replication(reports: Path, table: pd.DataFrame, profile: str, stand_ins: Sequence[str],
                      level: float = 0.95, title: str = "biasaudit report",
                      elements: Sequence[Mapping[str, str]] = ()) -> tuple[Path, Path]:
    """Write `<reports>/replication.csv` and `<reports>/pages/replication.html`; return both paths."""
    reports = Path(reports)
    referee = is_referee(profile, stand_ins)
    csv = atomic_write_table(table, reports / C.REPLICATION_CSV.relative_to(C.REPORTS))
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    text = env.from_string(HEAD + PAGE).render(
        title=f"Replication · {title}", base="../", profile=profile, stand_in=bool(stand_ins), style=STYLE,
        stand_ins=list(stand_ins), referee=referee, level=f"{level:.0%}",
        summary=("referee run (PLANTED truth): " if referee else "") + replication_summary(table, bool(stand_ins) and not referee),
        rows=[_shown(r) for r in table.to_dict("records")], elements=list(elements))
    page = atomic_write_text(reports / PAGES / C.REPLICATION_PAGE, text)
    return csv, page


def build_replication(reports: Path, published_dir: Path, profile: str, stand_ins: Sequence[str],
                      groups: tuple[str, ...] = C.GROUPS, design: Mapping[str, Any] | None = None,
                      options: Mapping[str, Mapping[str, Any]] | None = None, root: Path = Path("."),
                      level: float = 0.95, title: str = "biasaudit report",
                      planted: Mapping[str, str] | None = None) -> pd.DataFrame:
    """Read the published numbers and this run's tables, write the CSV and the page, return the table. In the
    referee profile the table compares with the planted truth and carries referee_check's verdicts
    (`planted`: what the referee world planted per row id)."""
    run = Run.load(Path(reports), Path(root), groups=tuple(groups), design=dict(design or {}),
                   options=dict(options or {}), level=level)
    referee = is_referee(profile, stand_ins)
    table = replication_table(load_published(Path(root) / published_dir), run, stand_ins, referee)
    if referee:
        table, _ = referee_check(table, level, planted)
    write_replication(Path(reports), table, profile, stand_ins, level, title, seed_elements(run))
    return table


__all__ = ["COLUMNS", "LOOKUPS", "READINGS", "Run", "RunValue", "allowed_misses", "alternative_readings",
           "build_replication", "compare", "covers", "load_published", "pooled_tvd", "referee_check",
           "replication_table", "seed_elements", "write_replication"]
