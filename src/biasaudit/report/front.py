"""The report's headline content: per block a small table, the findings it supports and the `src/`
function + notebook cell that made the numbers (each block is a page of its own; the front page
gives it one line), and the few front-page findings, each led by its validated estimate.

Inputs are read by their contract (`biasaudit.contracts`, the declaration the writers are checked
against): a table another stage has not written renders as "no data: reason", a declared column that
is missing as "contract broken: …" (tests fail on it), never as a guessed column.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.report import statistics as S
from biasaudit.report.load import Loaded, Outputs, ci, fmt, num, pval, read_json, truthy
from biasaudit.report.trail import trail

ALPHA = 0.05


@dataclass
class Block:
    id: str
    title: str
    html: str = ""
    note: str = ""
    findings: list[str] = field(default_factory=list)
    function: str = ""  # dotted src/ function
    trail_href: str = ""
    notebook: str = ""
    downloads: list[tuple[str, str]] = field(default_factory=list)
    extra: str = ""  # more HTML (a figure, a long table)
    group: str = ""  # the front page's heading for its one line (Method A, Method B, checks)
    # per statistic shown under its own name (report.statistics): (name, function, notebook, href of the cell)
    credits: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def page(self) -> str:
        """Its own page, relative to reports/."""
        return f"pages/{self.id}.html"

    @property
    def summary(self) -> str:
        """The front page's one line: its first finding, else why there is none."""
        return self.findings[0] if self.findings else (f"no data: {self.note}" if self.note and not self.html else "")


def _table(df: pd.DataFrame, escape: bool = True) -> str:
    return df.to_html(index=False, na_rep="—", border=0, escape=escape, classes="t")


def _rel(reports: Path, path: Path | None) -> str:
    try:
        return path.relative_to(reports).as_posix() if path else ""
    except ValueError:
        return ""


def _with_trail(block: Block, reports: Path, notebook: str, function: str, *loaded: Loaded) -> Block:
    t = trail(reports, notebook, function)
    block.function, block.notebook, block.trail_href = function, notebook, t.href
    block.downloads += [(x.path.name, _rel(reports, x.path)) for x in loaded if x.path is not None]
    return block


def _credit(block: Block, reports: Path, *stats: S.Statistic) -> None:
    """Credit each statistic the block shows to the function and notebook cell that made it."""
    for st in stats:
        block.credits.append((st.name, st.function, st.notebook, trail(reports, st.notebook, st.function).href))


def _missing(block: Block, *loaded: Loaded) -> Block:
    block.note = "; ".join(x.reason for x in loaded if not x.ok and x.reason) or "no rows"
    return block


def _models_order(df: pd.DataFrame, model_col: str = "model") -> list[str]:
    return list(dict.fromkeys(df[model_col].astype(str)))


# ------------------------------------------------------------------------------------- Method A

RAW_CI, HONEST = S.RAW_CI, S.HONEST


def tvd_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """TVD per model × category: raw with its CI, the null floor, and the TVD corrected for classifier
    error and finite n with its honest interval (one interval per statistic: each is read from the one
    table that computes it)."""
    b = Block("tvd", "Distance from the benchmark (mean per-prompt TVD; 0 = identical, 1 = no overlap)")
    tvd = t2i.table(C.TVD_SUMMARY)
    deb = t2i.table(C.TVD_CORRECTED_SUMMARY)
    _with_trail(b, reports, S.RAW_TVD.notebook, S.RAW_TVD.function, tvd, deb)
    _credit(b, reports, *([S.RAW_TVD, S.CORRECTED_TVD] if deb.ok else [S.RAW_TVD]))
    if not tvd.ok:
        return _missing(b, tvd)
    df = tvd.df
    cats = [c for c in ("occupation", "geography", "surname", "all") if c in set(df["category"])]
    cats += [c for c in dict.fromkeys(df["category"]) if c not in cats]
    rows = []
    for model in _models_order(df):
        row = {"model": html.escape(model)}
        for cat in cats:
            r = df[(df["model"].astype(str) == model) & (df["category"] == cat)]
            if r.empty:
                row[cat] = "—"
                continue
            r = r.iloc[0]
            extra = [f"null floor {fmt(r['null_floor'])}"] if "null_floor" in df else []
            if deb.ok:
                d = deb.df[(deb.df["model"].astype(str) == model) & (deb.df["category"] == cat)]
                if len(d):
                    d = d.iloc[0]
                    point, source = d.get("tvd_point", d["tvd_debiased"]), str(d.get("tvd_point_source", "corrected"))
                    extra.append(f"{S.CORRECTED_TVD.name} " + ci(point, d["tvd_debiased_low"], d["tvd_debiased_high"])
                                 + ("" if source == "corrected" else f" (point {source.split(',')[0].split(' (')[0]})"))
                    if "tvd_lower_bound" in d and not math.isnan(num(d["tvd_lower_bound"])):
                        extra.append(f"lower bound {fmt(d['tvd_lower_bound'])}, p(above floor) "
                                     f"{pval(d.get('tvd_above_floor_p'))}")
            row[cat] = html.escape(ci(r["mean_tvd"], r["mean_tvd_low"], r["mean_tvd_high"])) + (
                f"<br><small>{html.escape(' · '.join(extra))}</small>" if extra else "")
        rows.append(row)
    b.html = _table(pd.DataFrame(rows).rename(columns={c: f"{c}: {S.RAW_TVD.name} [{level} CI]" for c in cats}),
                    escape=False)
    b.html += (f"<p class='note'>{S.RAW_TVD.name}: the classified labels' mean per-prompt TVD, {level} {RAW_CI}; "
               f"null floor: the TVD expected from sampling alone at each prompt's n; {S.CORRECTED_TVD.name}: for the "
               "classifier's confusion matrix "
               f"(reliability sample) and finite n, with its {level} {HONEST} "
               "(stats.correction.debiased_tvd); its point is the MSE-weighted mix of raw and empirical-Bayes "
               "estimates (raw with fewer than 10 prompts: stats.correction.point_rule); lower bound: one-sided "
               f"{level} bound; p(above floor): p-value of a TVD above what sampling and classifier error give.</p>")
    if not deb.ok:
        b.note = f"corrected TVD: no data ({deb.reason})"
    b.findings += [x for x in [tvd_headline(t2i, level)] if x] + tvd_findings(df)
    return b


def tvd_findings(df: pd.DataFrame) -> list[str]:
    """The raw TVD's spread over categories (its page; the front page leads with tvd_headline)."""
    per = df[df["category"] != "all"].dropna(subset=["mean_tvd"])
    if not len(per):
        return []
    top = per.sort_values("mean_tvd").iloc[-1]
    return [f"The largest raw distance is for {top['category']} prompts in {top['model']} "
            f"(TVD {ci(top['mean_tvd'], top['mean_tvd_low'], top['mean_tvd_high'])})."]


def tvd_headline(t2i: Outputs, level: str) -> str:
    """The TVD finding, led by the validated estimate: the TVD corrected for classifier error and finite n
    where the correction is identifiable and (in a planted run) covers the planted values; else the raw
    TVD with the reason. Planted values are named where the run has them."""
    tvd, deb, val = t2i.table(C.TVD_SUMMARY), t2i.table(C.TVD_CORRECTED_SUMMARY), t2i.table(C.VALIDATION)
    if not tvd.ok:
        return ""
    raw = tvd.df[tvd.df["category"] == "all"].dropna(subset=["mean_tvd"])
    d = deb.df[deb.df["category"] == "all"].set_index("model") if deb.ok else pd.DataFrame()
    v = val.df if val.ok else pd.DataFrame(columns=C.VALIDATION.columns)
    vt = v[(v["category_or_group"] == "all") & v["quantity"].isin(["debiased_mean_tvd", "mean_tvd"])]
    parts, planted, why_raw, raw_missed = [], [], "", 0
    use_corrected = len(d) > 0 and all(
        m in d.index and truthy(d.loc[m, "identifiable"]) and not math.isnan(num(d.loc[m, "tvd_debiased"]))
        for m in raw["model"].astype(str))
    if use_corrected and len(vt):
        checked = vt[vt["quantity"] == "debiased_mean_tvd"]
        if len(checked) and not checked["covered"].map(truthy).all():
            use_corrected, why_raw = False, "the planted check finds the corrected TVD outside its interval"
    elif not use_corrected:
        why_raw = ("no reliability sample to correct with" if not len(d) else
                   "the correction is not identifiable (confusion matrix too ill-conditioned)")
    for _, r in raw.iterrows():
        m = str(r["model"])
        if use_corrected:
            x = d.loc[m]
            parts.append(f"{m} {ci(x.get('tvd_point', x['tvd_debiased']), x['tvd_debiased_low'], x['tvd_debiased_high'])}")
        else:
            parts.append(f"{m} {ci(r['mean_tvd'], r['mean_tvd_low'], r['mean_tvd_high'])}")
        p = vt[(vt["model"].astype(str) == m) & (vt["quantity"] == "mean_tvd")]
        if len(p):
            planted.append((m, num(p["planted"].iloc[0])))
            raw_missed += int(not truthy(p["covered"].iloc[0]))
    what = (f"{S.CORRECTED_TVD.name}: mean per-prompt TVD corrected for classifier error and finite n, {level} "
            f"{HONEST}" if use_corrected else f"{S.RAW_TVD.name}: mean per-prompt TVD, {level} {RAW_CI}")
    out = f"Distance from the benchmark over all prompts ({what}): {'; '.join(parts)}."
    if planted:
        most = max(planted, key=lambda x: x[1])[0]
        out += (" Planted: " + ", ".join(f"{m} {fmt(x)}" for m, x in planted)
                + (f" ({most} planted as the most biased)" if len(planted) > 1 else "") + ".")
    if use_corrected:
        raw_text = ", ".join(f"{r['model']} {fmt(r['mean_tvd'])}" for _, r in raw.iterrows())
        out += (f" The {S.RAW_TVD.name} ({raw_text}) is biased upward by classifier error and finite n"
                + (f"; the planted check finds it outside its interval in {raw_missed} of {len(planted)} models."
                   if planted else "."))
    elif why_raw:
        out += f" Raw, because {why_raw}."
    return out


def paired_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Paired differences in raw TVD between models (same prompts), with adjusted p-values."""
    b = Block("paired", "Paired differences between models (raw TVD of A − raw TVD of B, same prompts)")
    t = t2i.table(C.TVD_PAIRED)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.representation.compute", t)
    if not t.ok:
        return _missing(b, t)
    df = t.df
    show = pd.DataFrame({"A − B": df["model_a"].astype(str) + " − " + df["model_b"].astype(str),
                         "category": df["category"],
                         f"difference in TVD [{level} paired {RAW_CI}]": [ci(r["diff"], r["low"], r["high"])
                                                                          for _, r in df.iterrows()],
                         "p": df["p_value"].map(pval), "p adjusted (Holm)": df["p_adjusted"].map(pval)})
    b.html = _table(show)
    sig = df[df["p_adjusted"].map(num) < ALPHA]
    if len(sig):
        b.findings += [f"{r['model_a']} is {'farther from' if num(r['diff']) > 0 else 'closer to'} the benchmark than "
                       f"{r['model_b']} on {r['category']} prompts: difference in raw TVD "
                       f"{ci(r['diff'], r['low'], r['high'])}, p after adjustment {pval(r['p_adjusted'])}."
                       for _, r in sig.head(4).iterrows()]
    else:
        b.findings.append(f"No paired model difference in TVD is significant after adjustment "
                          f"({len(df)} comparisons, α = {ALPHA}).")
    return b


def skin_block(t2i: Outputs, reports: Path, level: str, labels: tuple[str, ...]) -> Block:
    """Mean L* by classified race per model (with CI), skin-tone diversity (ΔE2000), and the share of very
    dark faces (below the stated L* threshold) classified as the dark group."""
    b = Block("skin", "Skin lightness L* (CIELAB, 0 = black, 100 = white) by classified race, and skin-tone diversity")
    s = t2i.table(C.SKIN_SUMMARY_BY_LABEL)
    dark = t2i.table(C.SKIN_DARK_SHARE)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.skin.compute", s, dark)
    if not s.ok:
        return _missing(b, s)
    df = s.df
    labels = [x for x in labels if x in set(df["label"])]
    rows = []
    for model in _models_order(df):
        sub = df[df["model"].astype(str) == model].set_index("label")
        row: dict[str, Any] = {"model": model}
        for lab in labels:
            if lab in sub.index:
                r = sub.loc[lab]
                row[f"L* {lab} [{level} CI] (n faces)"] = ci(r["L_mean"], r["L_mean_lo"], r["L_mean_hi"], 1) + (
                    f" (n={int(r['n'])})" if not math.isnan(num(r["n"])) else "")
            else:
                row[f"L* {lab} [{level} CI] (n faces)"] = "—"
        if "diversity_de2000" in sub:
            w = sub["diversity_pairs"].map(num) if "diversity_pairs" in sub else pd.Series(1.0, index=sub.index)
            v = sub["diversity_de2000"].map(num)
            ok = v.notna() & (w > 0)
            row["diversity: mean pairwise ΔE00 within label"] = fmt((v[ok] * w[ok]).sum() / w[ok].sum(), 1) if ok.any() else "—"
        rows.append(row)
    b.html = _table(pd.DataFrame(rows))
    for model in _models_order(df):
        sub = df[(df["model"].astype(str) == model)].dropna(subset=["L_mean"])
        sub = sub[sub["n"].map(num) >= 2]
        if len(sub) >= 2:
            lo, hi = sub.sort_values("L_mean").iloc[0], sub.sort_values("L_mean").iloc[-1]
            b.findings.append(f"In {model}, faces classified {lo['label']} are the darkest (mean skin L* "
                              f"{ci(lo['L_mean'], lo['L_mean_lo'], lo['L_mean_hi'], 1)}, {level} CI) and those "
                              f"classified {hi['label']} the lightest "
                              f"({ci(hi['L_mean'], hi['L_mean_lo'], hi['L_mean_hi'], 1)}).")
    if dark.ok:
        d = dark.df
        thr = fmt(d["L_threshold"].iloc[0], 0)
        group = str(d["group"].iloc[0])
        b.extra = f"<h4>Very dark faces (L* &lt; {html.escape(thr)})</h4>" + _table(pd.DataFrame({
            "model": d["model"], "faces measured": d["n_measured"], f"very dark (L* < {thr})": d["n_dark"],
            f"share of very dark classified {group} [{level} CI]":
                [ci(r["share"], r["share_low"], r["share_high"]) for _, r in d.iterrows()]}))
        b.findings += [f"{r['model']}: {ci(r['share'], r['share_low'], r['share_high'])} of the {int(num(r['n_dark']))} "
                       f"very dark faces (L* < {thr}) are classified {group}." for _, r in d.iterrows()
                       if num(r["n_dark"]) > 0]
    return b


def homogeneity_block(t2i: Outputs, reports: Path, level: str, labels: tuple[str, ...]) -> Block:
    """Homogeneity per model × group (CLIP and face embeddings): the within-prompt gap (headline, with its
    CI and adjusted p-value) and the paper's unstratified gap beside it."""
    b = Block("homogeneity", "Homogeneity gap within prompts (intra- minus inter-group cosine over pairs that share "
                             "a prompt; + = more alike), the paper's unstratified gap beside it")
    h = t2i.table(C.HOMOGENEITY_BY_RACE)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.homogeneity.compute", h)
    if not h.ok:
        return _missing(b, h)
    df = h.df
    padj = "p_adjusted" if "p_adjusted" in df else ("p_value" if "p_value" in df else None)
    seen = list(dict.fromkeys(df["group"].astype(str)))
    groups = [g for g in labels if g in seen] + [g for g in seen if g not in labels]
    rows = []
    for key, sub in df.groupby(["model", "space"], sort=False):
        row = {"model": key[0], "space": key[1]}
        sub = sub.set_index(sub["group"].astype(str))
        for g in groups:
            if g in sub.index and not math.isnan(num(sub.loc[g, "wp_gap"])):
                r = sub.loc[g]
                row[g] = (ci(r["wp_gap"], r["wp_gap_lo"], r["wp_gap_hi"]) + (" †" if truthy(r.get("few_prompts")) else "")
                          + (" FLAGGED" if truthy(r.get("flagged")) else "")
                          + (f" · exploratory p={pval(r[padj])}" if padj else "") + f" · paper (unstratified) {fmt(r['gap'])}")
            else:
                row[g] = "—"
        rows.append(row)
    b.html = _table(pd.DataFrame(rows)) + (
        f"<p class='note'>cell: within-prompt gap [{level} prompt-cluster bootstrap CI]" + (
            f"; FLAGGED = the verdict, the localising test: {LOCALISING}" if "flagged" in df else "") + (
            f"; exploratory p = {EXPLORATORY_PERM}" if padj else "") + "; paper (unstratified): the paper's gap over all pairs, shown for replication; it also reads a "
        "group's prompt concentration as homogeneity." + (
            f" †: the group has pairs in fewer than {C.MIN_PROMPTS_CI} prompts; an interval over so few prompts "
            "under-covers, and over one there is none." if "few_prompts" in df and df["few_prompts"].map(truthy).any() else "") + "</p>")
    b.findings += homogeneity_findings(df, padj, level)
    if "near_dup_rate" in df and df["near_dup_rate"].map(num).notna().any():
        worst = df.loc[df["near_dup_rate"].map(num).idxmax()]
        b.findings.append(f"Near-duplicates (another image of the same prompt at cosine ≥ "
                          f"{fmt(num(worst.get('near_dup_cosine')))}): at most {fmt(num(worst['near_dup_rate']))} of a "
                          f"group's images ({worst['group']} in {worst['model']}, {worst['space']} embeddings).")
    base = t2i.table(C.HOMOGENEITY_VS_BASELINE)
    if base.ok:
        b.downloads.append((base.path.name, _rel(reports, base.path)))
    return b


def _permutation_floor(df: pd.DataFrame, key: str, n: int) -> str:
    """Why no adjusted p can pass α: Holm's smallest adjusted p is n × the smallest raw p, and a permutation
    p-value cannot fall below 1/(permutations + 1)."""
    p = df["p_value"].map(num).dropna() if "p_value" in df else pd.Series(dtype=float)
    if key != "p_adjusted" or not len(p) or n * float(p.min()) < ALPHA:
        return ""
    return (f" The smallest permutation p-value here is {pval(float(p.min()))}, so after adjustment over {n} gaps "
            f"none can fall below {pval(min(1.0, n * float(p.min())))}: at this number of permutations "
            f"(analyze.n_permutations) no gap can reach α = {ALPHA}; read the intervals, and raise it to test.")


# the one homogeneity verdict (stats.homogeneity.localise) and what the older per-group test answers instead
LOCALISING = ("a group is flagged only when it is tighter than every other group (each of its pairwise "
              "within-prompt gaps and tightness contrasts above 0, intersection-union rule)")
EXPLORATORY_PERM = ("the per-group permutation test of the within-prompt gap above 0, Holm-adjusted over the table "
                    "(p_perm, exploratory): it asks whether a group is displaced from the others, and a group beside "
                    "one with a look of its own is displaced from it too, so it does not say which group is homogeneous")


def homogeneity_findings(df: pd.DataFrame, key: str | None, level: str = "95%") -> list[str]:
    """The headline: the groups the localising test flags (tighter than every other group), the paper's gap
    beside; without a `flagged` column (an older table), the per-group permutation test as before."""
    if "flagged" in df:
        return localised_findings(df, key, level)
    if not key:
        return []
    sig = df[df[key].map(num) < ALPHA].dropna(subset=["wp_gap"])
    what = "after adjustment" if key == "p_adjusted" else "(permutation test, unadjusted)"
    n = int(df["wp_gap"].notna().sum())
    out = []
    pool = sig if len(sig) else df.dropna(subset=["wp_gap"])
    # the largest within-prompt gap, with the paper's gap of the same group beside it
    largest = _largest(_top_gap(pool), level) if len(pool) else ""
    if len(sig):
        out.append(f"{len(sig)} of {n} within-prompt homogeneity gaps are significant {what}; the largest: {largest}.")
    else:
        out.append(f"No within-prompt homogeneity gap is significant {what} ({n} gaps)"
                   + (f"; the largest: {largest}." if largest else ".") + _permutation_floor(df, key, n))
    return out + _unstratified(df)


def _top_gap(rows: pd.DataFrame) -> pd.Series:
    """The row of the largest |within-prompt gap|."""
    return rows.reindex(rows["wp_gap"].map(num).abs().sort_values(ascending=False).index).iloc[0]


def _unstratified(df: pd.DataFrame) -> list[str]:
    """How far the paper's unstratified gap lies from the within-prompt gap (nothing without both)."""
    both = df[["wp_gap", "gap"]].map(num).dropna()
    if not len(both):
        return []
    return [f"The paper's unstratified gap, which also counts pairs across prompts (and so reads a group's "
            f"prompt concentration as homogeneity), differs from the within-prompt gap by up to "
            f"{fmt(float((both['gap'] - both['wp_gap']).abs().max()))}."]


def _largest(top: pd.Series, level: str) -> str:
    caveat = ""
    if truthy(top.get("few_prompts")):  # the caveat belongs to the within-prompt interval, so it follows it
        k = int(num(top.get("n_prompts")))
        caveat = (f"; pairs in only {k} prompts, so that interval under-covers (fewer than {C.MIN_PROMPTS_CI})"
                  if math.isfinite(num(top.get("wp_gap_lo"))) else f"; pairs in only {k} prompt, so no interval")
    return (f"{top['group']} in {top['model']} ({top['space']} embeddings), within-prompt gap "
            f"{ci(top['wp_gap'], top['wp_gap_lo'], top['wp_gap_hi'])} ({level} prompt-cluster bootstrap CI"
            f"{caveat}); beside it the paper's unstratified gap (replication) {fmt(top['gap'])}")


def localised_findings(df: pd.DataFrame, key: str | None, level: str) -> list[str]:
    """Findings from the localising test alone: a group is named only when it is flagged; the per-group
    permutation test is counted as exploratory and names no group (beside a displaced group it would name
    the unaffected ones)."""
    rows = df.dropna(subset=["wp_gap"])
    flagged = rows[rows["flagged"].map(truthy)]
    n = len(rows)
    if len(flagged):
        top = _top_gap(flagged)
        out = [f"{len(flagged)} of {n} groups are flagged by the localising homogeneity test (tighter than every "
               f"other group: {LOCALISING}); the largest: {_largest(top, level)}."]
    else:
        out = [f"No group is flagged by the localising homogeneity test ({n} model × space × group gaps): none is "
               "tighter than every other group."]
    if key:
        n_old = int((rows[key].map(num) < ALPHA).sum())
        if n_old:
            out[0] += (f" Exploratory: the per-group permutation test finds {n_old} gaps above 0 after adjustment; "
                       "it reads a group displaced from the others, and every group beside a displaced one, as "
                       "separate, so it names no homogeneous group.")
    return out + _unstratified(df)


def kappa_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Classifier reliability: Cohen's κ human–classifier vs human–human, Fleiss κ overall and per group."""
    b = Block("kappa", "Classifier reliability (agreement with raters; κ: 0 = chance, 1 = perfect)")
    mean = t2i.table(C.MEAN_KAPPA, where="reliability")
    fleiss = t2i.table(C.FLEISS_KAPPA, where="reliability")
    _with_trail(b, reports, "t2i_reliability", "biasaudit.t2i.reliability.agreement", mean, fleiss)
    if not mean.ok and not fleiss.ok:
        return _missing(b, mean, fleiss)
    rows = []
    source = ""
    if mean.ok:
        m = mean.df
        rows += [{"agreement": f"mean Cohen's κ, {r['kind']}", f"κ [{level} CI]": fmt(r["mean_cohen_kappa"])}
                 for _, r in m.iterrows()]
        source = str(m["raters_source"].iloc[0]) if "raters_source" in m else ""
    if fleiss.ok:
        f = fleiss.df
        rows += [{"agreement": f"Fleiss κ (all raters), {r['group']}",
                  f"κ [{level} CI]": ci(r["fleiss_kappa"], r["ci_low"], r["ci_high"])}
                 for _, r in f[f["raters"] == "all"].iterrows()]
    b.html = _table(pd.DataFrame(rows))
    if source:
        b.note = source
    if mean.ok and fleiss.ok:
        m, f = mean.df, fleiss.df
        kc = m.set_index("kind")["mean_cohen_kappa"]
        groups = f[(f["raters"] == "all") & (f["group"] != "overall")]
        sentence = (f"The classifier agrees with raters at mean κ = {fmt(kc.get('human-classifier'))} "
                    f"(raters with each other: {fmt(kc.get('human-human'))})")
        if len(groups):
            worst = groups.sort_values("fleiss_kappa").iloc[0]
            sentence += (f"; the least reliable label is {worst['group']} (Fleiss κ "
                         f"{ci(worst['fleiss_kappa'], worst['ci_low'], worst['ci_high'])})")
        b.findings.append(sentence + (" — SIMULATED raters." if "SIMULATED" in source else "."))
    return b


# ------------------------------------------------------------------------------------- Method B

def _vlm_tag(vlm: Outputs, name: str) -> str:
    """The VLM's name as findings print it, with what it is when it is not a model under audit."""
    summary = read_json(vlm.root / "summary.json")
    info = (summary.get("vlms") or {}).get(name, {}) if isinstance(summary, dict) else {}
    if registry.trait("vlm", info.get("backend", ""), "planted", False):
        return f"{name} (PLANTED: SIMULATED answers from declared effects)"
    return f"{name} (STAND-IN)" if info.get("stand_in") else name


def _no_vlm(vlm: Outputs, what: str) -> str:
    return f"no {what} tables in reports/vlm/tables" + (
        "" if (vlm.root / "manifest.json").exists() else " (reflect_analysis has not run)")


def winrate_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Race win rates within gender per 2AFC task (0.5 = chosen as often as not)."""
    b = Block("winrates", "Method B: 2AFC race win rates within gender, per task (share of pairs won; 0.5 = as often as not)")
    tables = vlm.tables_of(C.RACE_WINRATE)
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.two_afc.compute",
                *(t for _, t in tables))
    if not tables:
        b.note = _no_vlm(vlm, "<vlm>_race_winrate_<task>")
        return b
    frames = [t.df.assign(vlm=k["vlm"], task=k["task"]) for k, t in tables if t.ok]
    if not frames:
        b.note = "; ".join(t.reason for _, t in tables if t.reason) or "no retained 2AFC answers"
        return b
    df = pd.concat(frames, ignore_index=True)
    df["cell"] = [ci(r["rate"], r["low"], r["high"], 2) + (f" (n={int(r['n'])})" if not math.isnan(num(r["n"])) else "")
                  for _, r in df.iterrows()]
    wide = df.pivot_table(index=["vlm", "race"], columns=["task", "gender"], values="cell", aggfunc="first")
    wide.columns = [f"{t} · {g}" for t, g in wide.columns]
    b.html = _table(wide.reset_index()) + f"<p class='note'>cell: win rate [{level} CI] (n pairs).</p>"
    for (v, task), sub in df.groupby(["vlm", "task"]):
        rates = sub.dropna(subset=["rate"])
        why = sub["degenerate"].dropna().astype(str) if "degenerate" in sub else pd.Series(dtype=str)
        why = why[why.str.len() > 0]
        if len(why):
            b.findings.append(f"{_vlm_tag(vlm, v)}, {task}: {why.iloc[0]}.")
        elif len(rates):
            hi, lo = rates.sort_values("rate").iloc[-1], rates.sort_values("rate").iloc[0]
            b.findings.append(f"{_vlm_tag(vlm, v)}, {task}: race win rates within gender range from "
                              f"{ci(lo['rate'], lo['low'], lo['high'], 2)} ({lo['race']} {lo['gender']}) to "
                              f"{ci(hi['rate'], hi['low'], hi['high'], 2)} ({hi['race']} {hi['gender']}).")
    return b


def delta_g_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Δg (percentage gap to the reference group, within source photo) per group and task, with CI and adjusted p."""
    b = Block("delta_g", "Method B: Δg per group and task (% difference from the reference group)")
    tables = vlm.tables_of(C.DELTA_G)
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.gaps.compute", *(t for _, t in tables))
    frames = [t.df.assign(vlm=k["vlm"]) for k, t in tables if t.ok]
    if not frames:
        b.note = "; ".join(t.reason for _, t in tables if t.reason) or _no_vlm(vlm, "<vlm>_delta_g")
        return b
    df = pd.concat(frames, ignore_index=True)
    df["group"] = df["dimension"].astype(str) + ":" + df["level"].astype(str)
    df["cell"] = [ci(r["delta_pct"], r["low"], r["high"], 1) + (" *" if num(r["p_adjusted"]) < ALPHA else "")
                  for _, r in df.iterrows()]
    cav = _caveats_of(vlm)
    df["caveats"] = [cav.get((r["vlm"], str(r["measure"]), r["group"]), "") for _, r in df.iterrows()]
    df["cell"] = [c + (f" ({x})" if x else "") for c, x in zip(df["cell"], df["caveats"])]
    wide = df.pivot_table(index=["vlm", "group"], columns="measure", values="cell", aggfunc="first")
    wide.columns.name = None
    b.html = _table(wide.reset_index()) + (f"<p class='note'>cell: Δg in % [{level} CI]; * = significant after "
                                           f"adjustment (α = {ALPHA}); in brackets its caveats: a refusal gap, the "
                                           "refusal bounds and whether it is robust to refusals (only when they "
                                           "exclude 0), the null-edit floor, the placebo verdict.</p>")
    sig = df[df["p_adjusted"].map(num) < ALPHA]
    if len(sig):
        top = sig.reindex(sig["delta_pct"].abs().sort_values(ascending=False).index).iloc[0]
        b.findings.append(f"{len(sig)} of {df['delta_pct'].notna().sum()} Δg effects are significant after adjustment; "
                          f"the largest is {top['group']} on {top['measure']} ({_vlm_tag(vlm, top['vlm'])}): "
                          f"{ci(top['delta_pct'], top['low'], top['high'], 1)}% ({level} CI)"
                          + (f"; {top['caveats']}." if top["caveats"] else "."))
    else:
        b.findings.append(f"No Δg effect is significant after adjustment over this table "
                          f"({df['delta_pct'].notna().sum()} effects); a {level} CI is per effect and unadjusted, so "
                          "one can exclude 0 while the adjusted p stays above α. The regression terms and sign-flip "
                          "tests below are a separate family, adjusted on their own.")
    return b


def _caveats_of(vlm: Outputs) -> dict[tuple[str, str, str], str]:
    """(vlm, measure, group) → the caveats sentence of that finding (`<vlm>_caveats`, vlm/analysis/caveats.py)."""
    out = {}
    for k, t in vlm.tables_of(C.CAVEATS):
        if t.ok:
            out |= {(k["vlm"], str(r.measure), str(r.group)): str(r.caveats) if pd.notna(r.caveats) else ""
                    for r in t.df.itertuples()}
    return out


def _endpoint_text(r: pd.Series) -> str:
    return (f"{r['endpoint']} {ci(r['estimate'], r['low'], r['high'])}, p after Holm {pval(r['p_holm'])}"
            + (f" ({r['caveats']})" if str(r.get("caveats") or "") not in ("", "nan") else ""))


def primary_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """The declared primary endpoints (Holm over them: the one family whose error rate the report states), each
    with its caveats in its row: refusal gap, refusal bounds and whether it is robust to refusals, the null-edit
    floor, the placebo verdict."""
    b = Block("primary", "Method B: primary endpoints (Holm), each with its caveats")
    tables = [(k, t) for k, t in vlm.tables_of(C.PRIMARY_ENDPOINTS)]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.endpoints.primary_endpoints",
                *(t for _, t in tables))
    frames = [t.df.assign(vlm=k["vlm"]) for k, t in tables if t.ok]
    if not frames:
        b.note = "; ".join(t.reason for _, t in tables if t.reason) or _no_vlm(vlm, "<vlm>_primary_endpoints")
        return b
    df = pd.concat(frames, ignore_index=True)
    yes = df["reject"].map(truthy)
    b.html = _table(pd.DataFrame({
        "vlm": df["vlm"], "endpoint": df["endpoint"],
        f"estimate [{level} CI]": [ci(r["estimate"], r["low"], r["high"]) for _, r in df.iterrows()],
        "p": df["p"].map(pval), "p Holm": df["p_holm"].map(pval), "rejected": yes.map({True: "yes", False: ""}),
        "refusal gap": df["refusal_gap"].map(lambda v: "REFUSAL GAP" if truthy(v) else ""),
        "refusal bounds [CI]": [f"[{fmt(r.get('bounds_low'))}, {fmt(r.get('bounds_high'))}]"
                                if not math.isnan(num(r.get("bounds_low"))) else "—" for _, r in df.iterrows()],
        "robust to refusals": df["robust_to_refusals"].fillna(""),
        "caveats": df["caveats"].fillna("")})) + (
        f"<p class='note'>Holm over each VLM's primary endpoints bounds its family-wise error at α = {ALPHA} when the "
        "refused questions are missing at random. Refusals that depend on the answer can make the complete-case "
        "estimate reject with no effect: an endpoint is robust to refusals only when the interval of its worst-case "
        "bounds (each refused question counted as each answer it could have had) excludes no effect; a REFUSAL GAP "
        "says the groups are refused at different rates.</p>")
    parts = []
    for v, sub in df.groupby("vlm", sort=False):
        rej = sub[sub["reject"].map(truthy)]
        text = (f"{_vlm_tag(vlm, v)}: {len(rej)} of {len(sub)} primary endpoints rejected after Holm"
                + (": " + "; ".join(_endpoint_text(r) for _, r in rej.iterrows()) if len(rej) else ""))
        gap = sub[sub["refusal_gap"].map(truthy) & ~sub["reject"].map(truthy)]
        if len(gap):
            text += "; not rejected, with a refusal gap beside them: " + "; ".join(_endpoint_text(r) for _, r in gap.iterrows())
        parts.append(text + ".")
    b.findings.append(" ".join(parts))
    return b


def _references(vlm: Outputs) -> dict[str, str]:
    """The reference group of each dimension, as the Δg tables name it (`reference`), else ''."""
    out: dict[str, str] = {}
    for _, t in vlm.tables_of(C.SIGN_FLIP):
        if t.ok and "reference" in t.df:
            out |= {str(r.dimension): str(r.reference) for r in t.df.itertuples() if pd.notna(r.reference)}
    return out


def significance_block(vlm: Outputs, reports: Path, level: str, units: dict[str, str] | None = None) -> Block:
    """Effects significant after adjustment: cluster-robust OLS terms and sign-flip tests. `units`: what one unit
    of each measure's difference is (vlm.declared.task_units: the declared tasks' `unit`; None: the default tasks')."""
    from biasaudit.params.vlm import Reflect
    from biasaudit.vlm.declared import task_units

    units = task_units(Reflect()) if units is None else units
    b = Block("significant", "Method B: significant effects (cluster-robust OLS, sign-flip tests)")
    ols, flips = vlm.tables_of(C.OLS), vlm.tables_of(C.SIGN_FLIP)
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.significance.compute", *(t for _, t in ols + flips))
    if not ols and not flips:
        b.note = _no_vlm(vlm, "<vlm>_ols / <vlm>_sign_flip")
        return b
    rows, n_tests, underpowered = [], 0, 0
    cav = _caveats_of(vlm)
    refs = _references(vlm)
    for (k, t), kind in [(x, "OLS") for x in ols] + [(x, "sign-flip") for x in flips]:
        if not t.ok:
            continue
        df = t.df
        n_tests += int(df["p_adjusted"].notna().sum())
        if "reason" in df:
            underpowered += int(df["reason"].astype(str).str.startswith("underpowered").sum())
        for _, r in df[df["p_adjusted"].map(num) < ALPHA].iterrows():
            effect = r["term"] if kind == "OLS" else f"{r['dimension']}:{r['level']}"
            est = ci(r["coef"], r["ci_low"], r["ci_high"]) if kind == "OLS" else fmt(r["mean_diff"])
            ref = str(r.get("reference") or "") if str(r.get("reference") or "") not in ("", "nan") else \
                refs.get(effect.split(":")[0], "")
            rows.append({"vlm": k["vlm"], "test": kind,
                         "effect (vs the reference group)": f"{effect.split(':')[-1]} vs {ref}" if ref else effect,
                         "measure": r["measure"], "unit": units.get(str(r["measure"]), "answer value"),
                         f"difference [{level} CI]": est, "p": pval(r["p"]), "p adjusted": pval(r["p_adjusted"]),
                         "caveats (of this measure and group)": cav.get((k["vlm"], str(r["measure"]), effect), "")})
    sentence = (f"{len(rows)} of {n_tests} tested effects (cluster-robust OLS terms and sign-flip tests, adjusted as "
                f"their own family) are significant after adjustment at α = {ALPHA}.")
    if underpowered:
        sentence += (f" {underpowered} tests are labelled underpowered (too few source photos to hold their "
                     "level) and report no p.")
    for k, t in vlm.tables_of(C.RETENTION):
        if t.ok:
            for r in t.df.itertuples():
                if num(r.retained) < 0.5 * num(r.asked):
                    b.findings.append(f"{_vlm_tag(vlm, k['vlm'])}, {r.kind} {r.task}: only {int(num(r.retained))} of "
                                      f"{int(num(r.asked))} answers retained (most common reason: {r.top_reason or '—'}).")
    b.html = _table(pd.DataFrame(rows)) if rows else f"<p>{html.escape(sentence)}</p>"
    b.findings.insert(0, sentence)
    return b


# ------------------------------------------------------------------------ validation, instruments

def _level_value(level: str) -> float:
    return num(level.rstrip("%")) / 100 if level.endswith("%") else 0.95


def validation_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Planted effects (known truth) vs what the audit estimates: is each inside its interval?"""
    b = Block("validation", "Method A: does the audit recover what was planted?")
    t = t2i.table(C.VALIDATION)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.validation.compute", t)
    if not t.ok:
        return _missing(b, t)
    df = t.df
    show = pd.DataFrame({"model": df["model"], "quantity": df["quantity"], "category / group": df["category_or_group"],
                         "planted": df["planted"].map(fmt),
                         f"estimate [{level} interval]": [ci(r["estimate"], r["low"], r["high"]) for _, r in df.iterrows()]})
    ok = df["covered"].map(truthy)
    show["covered"] = ok.map({True: "yes", False: "NO"})
    is_check = df["check"].map(truthy) if "check" in df else pd.Series(True, index=df.index)
    informative = df["informative"].map(truthy) if "informative" in df else pd.Series(True, index=df.index)
    if "check" in df:
        show["check"] = is_check.map({True: "yes", False: "shown"})
    if "width" in df:
        show["interval width"] = df["width"].map(lambda v: fmt(v, 3))
    if "note" in df:
        show["note"] = df["note"].fillna("")
    uninformative = int((is_check & ~informative).sum())
    is_check = is_check & informative
    hit, checks = ok & is_check, int(is_check.sum())
    missed = show.loc[is_check & ~ok, "quantity"].astype(str).value_counts()
    b.findings.append(f"The audit recovers {int(hit.sum())} of {checks} planted quantities inside their "
                      f"{level} intervals (at {level}, about {(1 - _level_value(level)) * checks:.0f} misses would be "
                      "expected by chance)" + ("." if missed.empty else "; missed (how many rows): "
                                               + ", ".join(f"{q} ({n})" for q, n in missed.items()) + ".")
                      + (f" {uninformative} {'check is' if uninformative == 1 else 'checks are'} uninformative "
                         "(an interval as wide as the quantity's plausible range) and counted apart, not as covered."
                         if uninformative else ""))
    raw = show.loc[~is_check]
    if len(raw):
        b.findings.append(f"The {len(raw)} raw or partly corrected estimates shown beside them cover the planted "
                          f"value in {int(ok[~is_check].sum())}: the gap is the classifier's error and the "
                          "finite-n bias that the checked (corrected) rows remove.")
    b.html = _table(show)
    return b


def _power(info: pd.DataFrame) -> str:
    """How many informative intervals exclude their quantity's no-effect value (column excludes_null)."""
    if "excludes_null" not in info:
        return ""
    known = info["excludes_null"].dropna()
    known = known[known.astype(str) != ""]
    return (f" Power at this size: {int(known.map(truthy).sum())} of {len(known)} intervals exclude the no-effect "
            "value (0.5 for a win rate, 0 for a gap or coefficient)." if len(known) else "")


def method_b_validation_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Method B known truth: the planted VLM's declared effects vs the REFLECT estimates and intervals."""
    b = Block("validation_b", "Method B: does the REFLECT analysis recover what was planted?")
    tables = [(k, t) for k, t in vlm.tables_of(C.VLM_VALIDATION) if t.ok]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.validation.compute", *(t for _, t in tables))
    if not tables:
        b.note = "no <vlm>_validation table (no VLM with backend planted among the vlms)"
        return b
    parts, full = [], []
    for k, t in tables:
        v = k["vlm"]
        df = t.df.assign(check=t.df["check"].map(truthy), informative=t.df["informative"].map(truthy),
                         covered=t.df["covered"].map(truthy))
        checks = df[df["check"]]
        info = checks[checks["informative"]]
        summary = info.groupby("quantity", sort=False).agg(
            checks=("covered", "size"), covered=("covered", "sum"),
            median_width=("width", "median"), plausible_range=("plausible_range", "first")).reset_index()
        parts.append(summary.assign(vlm=v)[["vlm", "quantity", "checks", "covered", "median_width", "plausible_range"]])
        misses = info.loc[~info["covered"], "quantity"].value_counts()
        b.findings.append(
            f"{_vlm_tag(vlm, v)}: {int(info['covered'].sum())} of {len(info)} informative planted "
            f"quantities lie inside their {level} intervals (about {(1 - _level_value(level)) * len(info):.0f} misses "
            "expected by chance)" + ("" if misses.empty else "; missed: " + ", ".join(f"{q} ({n})" for q, n in misses.items()))
            + f". {len(checks) - len(info)} checks without an informative interval (as wide as the quantity's "
            "plausible range, or none) are counted apart." + _power(info))
        full.append(df.assign(vlm=v))
    b.html = _table(_round(pd.concat(parts, ignore_index=True)).rename(
        columns={"median_width": f"median {level} interval width"}))
    rows = pd.concat(full, ignore_index=True)
    show = rows[["vlm", "quantity", "task", "group", "planted"]].assign(
        **{f"estimate [{level} interval]": [ci(r.estimate, r.low, r.high) for r in rows.itertuples()],
           "interval width": rows["width"].map(lambda v: fmt(v, 3)),
           "covered": [("yes" if c else "NO") if i else "uninformative" for c, i in zip(rows["covered"], rows["informative"])],
           "check": rows["check"].map({True: "yes", False: "shown"}),
           "note": rows["note"].fillna("") if "note" in rows else ""})
    show["planted"] = show["planted"].map(fmt)
    b.extra = f"<h4>Every row ({len(show)})</h4>" + _table(show)
    return b


def instruments_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Instrument bias: faces lost per group, detector disagreement, the L* sweep of the instruments."""
    b = Block("instruments", "Instrument bias (does the measuring itself differ by group or skin tone?)")
    loss, cross = t2i.table(C.FACE_LOSS), t2i.table(C.CROSS_DETECTOR)
    sweep = t2i.table(C.INSTRUMENTS_SUMMARY)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.instruments.compute", loss, cross, sweep)
    parts = []
    if loss.ok:
        d = loss.df
        parts.append(f"<h4>Faces lost (no face found) per group, share of images [{level} CI]; flagged above "
                     f"{fmt(d['threshold'].iloc[0], 2)}</h4>" + _table(pd.DataFrame({
                         "model": d["model"], "by": d["by"], "group": d["group"], "images": d["n_images"],
                         f"no-face rate [{level} CI]": [ci(r["no_face_rate"], r["low"], r["high"]) for _, r in d.iterrows()],
                         "flagged": d["flagged"].map(lambda v: "yes" if truthy(v) else "")})))
        s = d[d["by"] == "label"].dropna(subset=["no_face_rate"]).sort_values("no_face_rate")
        if len(s) > 1 and num(s["no_face_rate"].iloc[-1]) == num(s["no_face_rate"].iloc[0]):
            b.findings.append(f"Face loss is the same for every classified label: {fmt(s['no_face_rate'].iloc[0])} of "
                              f"{int(s['n_images'].map(num).sum())} images have no face found.")
        elif len(s) > 1:
            hi, lo = s.iloc[-1], s.iloc[0]
            b.findings.append(f"Face loss is highest for {hi['group']} ({hi['model']}, "
                              f"{ci(hi['no_face_rate'], hi['low'], hi['high'])}) and lowest for {lo['group']} "
                              f"({lo['model']}, {ci(lo['no_face_rate'], lo['low'], lo['high'])}).")
    if cross.ok:
        parts.append("<h4>Cross-detector agreement (share of images with a face found by one detector only)</h4>"
                     + _table(_round(cross.df)))
    if sweep.ok:
        d = sweep.df
        parts.append("<h4>The L* sweep: detection rate and mean |L* error| (L* units) per method, mode and target L*"
                     "</h4>" + _table(_round(d)))
        worst = d.dropna(subset=["detection_rate"]).sort_values("detection_rate")
        if len(worst):
            w = worst.iloc[0]
            b.findings.append(f"The instruments' L* sweep ({len(d)} method × mode × L* rows): the lowest detection "
                              f"rate is {fmt(w['detection_rate'], 2)} ({w['method']}, {w['mode']}, target L* "
                              f"{fmt(w['target_L'], 0)}).")
    png = reports / C.INSTRUMENTS_FIGURE.relative_to(C.REPORTS)
    if png.exists():
        b.extra = f'<figure><img src="{_rel(reports, png)}" alt="instrument bias"><figcaption>Instrument bias over ' \
                  'the L* sweep</figcaption></figure>'
    if not parts:
        b.note = "; ".join(x.reason for x in (loss, cross, sweep) if x.reason) or \
            "the instrument-bias analysis has not run"
        return b
    b.html = "".join(parts)
    return b


def calibration_block(t2i: Outputs, reports: Path) -> Block:
    """Simulation check of every interval method: observed vs nominal coverage."""
    b = Block("calibration", "Calibration: do the intervals cover as often as they claim?")
    t = t2i.table(C.CALIBRATION)  # the analysis copies the committed table of benchmarks/calibration.py
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.calibration.compute", t)
    if not t.ok:
        return _missing(b, t)
    df = t.df
    b.html = _table(_round(df).rename(columns={"nominal": "nominal level", "observed": "observed rate",
                                              "mc_se": "Monte Carlo SE", "mean_width": "mean interval width"}))
    rated = df["kind"].isin(["coverage", "rejection"])
    paper = df["scale"].eq("paper") & rated
    good = df["flag"].eq("ok")
    text = (f"Calibration by simulation: {int((good & paper).sum())} of {int(paper.sum())} "
            f"paper-scale intervals and tests are within their band (coverage {_band(C.COVERAGE_BAND)}, null "
            f"rejection {_band(C.REJECTION_BAND)}); {_n((~good & rated).sum(), 'row is', 'rows are')} labelled (small "
            "scale, another estimand, a documented limit, or conservative by design) in the table, "
            f"{int(below_band(df).sum())} of them below the band (under-covering or over-rejecting).")
    grid = df[df["kind"].eq("share") & df["scale"].eq("paper") & df["method"].str.contains("random grid", regex=False)]
    for _, r in grid.iterrows():
        reps = f" of {int(num(r['replications']))}" if "replications" in grid and num(r["replications"]) > 0 else ""
        text += (f" Over the random grid of distortions and confusion matrices ({r['setting']}), the corrected TVD is "
                 f"closer to the truth than the raw TVD in {num(r['observed']):.0%}{reps} simulated audits"
                 f"; {r['flag']}.")
    b.findings.append(text)
    return b


def _band(band: tuple[float, float]) -> str:
    return f"{band[0]:.2f}–{band[1]:.2f}"


def below_band(table: pd.DataFrame) -> pd.Series:
    """Calibration rows on the unsafe side of their band: coverage below it (under-covers) or null
    rejection above it (over-rejects). Power rows and shares of replications have no band."""
    observed = table["observed"].map(num)
    return ((table["kind"].eq("coverage") & (observed < C.COVERAGE_BAND[0]))
            | (table["kind"].eq("rejection") & (observed > C.REJECTION_BAND[1])))


def _n(k: Any, one: str, many: str) -> str:
    return f"{int(k)} {one if int(k) == 1 else many}"


def _round(df: pd.DataFrame) -> pd.DataFrame:
    return df.map(lambda v: round(v, 4) if isinstance(v, float) else v)


def gender_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Apparent gender (beyond the paper): per model, the gender TVD on the occupational prompts against BLS Table
    11's share of women and on all prompts (parity where no benchmark), raw with its CI and corrected for
    classifier error with its honest interval."""
    b = Block("gender", "Apparent gender against BLS Table 11's share of women (TVD; beyond the paper)")
    t = t2i.table(C.GENDER_SUMMARY)
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.gender.compute", t)
    if not t.ok:
        return _missing(b, t)
    d = t.df
    show = pd.DataFrame({
        "model": d["model"], "prompts": d["category"], "benchmark": d["benchmark"],
        f"gender TVD [{level} CI]": [ci(r["mean_tvd"], r["mean_tvd_low"], r["mean_tvd_high"]) for _, r in d.iterrows()],
        f"corrected gender TVD [{level} honest interval]": [
            ci(r["tvd_corrected"], r["tvd_corrected_low"], r["tvd_corrected_high"])
            if not math.isnan(num(r["tvd_corrected"])) else "— (" + str(r.get("reason", "") or "not corrected") + ")"
            for _, r in d.iterrows()],
        "women: model − benchmark (mean)": [fmt(num(r["mean_deviation"])) if r["deviation_group"] == "woman" else "—"
                                            for _, r in d.iterrows()]})
    b.html = _table(show) + ("<p class='note'>Occupational prompts are compared with BLS CPS 2025 Table 11's share "
                             "of women; geography and surname prompts have no sex benchmark, so parity is their only "
                             "reference. Race × gender has no benchmark at all: its table on the section page is "
                             "against parity only.</p>")
    occ = d[d["category"] == "occupation"].dropna(subset=["mean_tvd"])
    for _, r in occ.iterrows():
        corr = "" if math.isnan(num(r["tvd_corrected"])) else \
            f"; corrected for classifier error {ci(r['tvd_corrected'], r['tvd_corrected_low'], r['tvd_corrected_high'])}"
        b.findings.append(f"{r['model']}: apparent-gender TVD from BLS's share of women on the occupational prompts "
                          f"{ci(r['mean_tvd'], r['mean_tvd_low'], r['mean_tvd_high'])}{corr}; women "
                          f"{'under' if num(r['mean_deviation']) < 0 else 'over'}-represented by "
                          f"{abs(num(r['mean_deviation'])):.2f} on average.")
    return b


def build_blocks(reports: Path, level: str, labels: tuple[str, ...], units: dict[str, str] | None = None
                 ) -> dict[str, list[Block]]:
    """Every block of the front page; `labels` are the active group set's (Params.groups), in table order;
    `units` each Method B measure's (vlm.declared.task_units)."""
    t2i, vlm = Outputs.load(reports / "t2i"), Outputs.load(reports / "vlm")
    groups = {
        "method_a": [tvd_block(t2i, reports, level), paired_block(t2i, reports, level), skin_block(t2i, reports, level, labels),
                     gender_block(t2i, reports, level),
                     homogeneity_block(t2i, reports, level, labels), kappa_block(t2i, reports, level)],
        "method_b": [primary_block(vlm, reports, level), winrate_block(vlm, reports, level),
                     delta_g_block(vlm, reports, level), significance_block(vlm, reports, level, units)],
        "checks": [validation_block(t2i, reports, level), method_b_validation_block(vlm, reports, level),
                   instruments_block(t2i, reports, level), calibration_block(t2i, reports)],
    }
    for name, blocks in groups.items():
        for b in blocks:
            b.group = name
    return groups


def headline_findings(blocks: dict[str, list[Block]]) -> list[str]:
    """The front page's findings (at most 6), each led by its validated estimate and its interval: the
    TVD (tvd_headline), skin tone, homogeneity (the localising test), Method B's primary endpoints with their
    caveats (Δg where none were computed), its significant effects, and the two known-truth checks."""
    by_id = {b.id: b for group in blocks.values() for b in group}

    def first(block_id: str) -> str:
        b = by_id.get(block_id)
        return b.findings[0] if b is not None and b.findings else ""

    checks = " ".join(x for x in (first("validation"), first("validation_b")) if x)
    out = [first("tvd"), first("skin"), first("homogeneity"), first("primary") or first("delta_g"),
           first("significant"), checks]
    return [x for x in out if x][:6]
