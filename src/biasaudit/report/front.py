"""The front page's content: headline tables and one sentence per finding, written from the numbers.

Every builder takes the loaded outputs and returns a `Block` (a small HTML table, the findings it
supports, and the `src/` function + notebook cell that made the numbers) or a Block whose `note`
says why there is no data. Inputs are read by table and column name with fallbacks (`load.col`), so a
table another stage has not written yet renders as "no data: reason".
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit.contracts import GROUPS
from biasaudit.report.load import Loaded, Outputs, ci, col, fmt, num, pval, read_csv, read_json, truthy
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
    extra: str = ""  # more HTML (a figure, a collapsed long table)


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


def _missing(block: Block, *loaded: Loaded) -> Block:
    block.note = "; ".join(x.reason for x in loaded if not x.ok and x.reason) or "no rows"
    return block


def _models_order(df: pd.DataFrame, model_col: str = "model") -> list[str]:
    return list(dict.fromkeys(df[model_col].astype(str)))


# ------------------------------------------------------------------------------------- Method A

def tvd_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """TVD per model × category with CI, the null floor and the bias-corrected value."""
    b = Block("tvd", "Distance from the benchmark (mean per-prompt TVD; 0 = identical, 1 = no overlap)")
    tvd = t2i.table("tvd_summary")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.representation.compute", tvd)
    if not tvd.ok:
        return _missing(b, tvd)
    df = tvd.df
    est, lo, hi = col(df, "mean_tvd", "tvd"), col(df, "mean_tvd_low", "tvd_low"), col(df, "mean_tvd_high", "tvd_high")
    floor = col(df, "null_floor", "mean_tvd_null_floor", "tvd_null_floor", "floor")
    cor = col(df, "tvd_corrected", "mean_tvd_corrected", "tvd_bias_corrected", "bias_corrected")
    cor_lo = col(df, "tvd_corrected_low", "mean_tvd_corrected_low", "bias_corrected_low")
    cor_hi = col(df, "tvd_corrected_high", "mean_tvd_corrected_high", "bias_corrected_high")
    if est is None or "category" not in df or "model" not in df:
        b.note = f"tvd_summary lacks the columns model/category/mean_tvd (has: {', '.join(df.columns)})"
        return b
    cats = [c for c in ("occupation", "geography", "surname", "all") if c in set(df["category"])]
    cats += [c for c in dict.fromkeys(df["category"]) if c not in cats]
    debiased = t2i.table("tvd_corrected_summary")  # classifier error and finite n corrected, honest interval
    deb = debiased.df if debiased.ok and col(debiased.df, "tvd_debiased") else None
    rows = []
    for model in _models_order(df):
        row = {"model": html.escape(model)}
        for cat in cats:
            r = df[(df["model"].astype(str) == model) & (df["category"] == cat)]
            if r.empty:
                row[cat] = "—"
                continue
            r = r.iloc[0]
            cell = html.escape(ci(r[est], r[lo] if lo else None, r[hi] if hi else None))
            extra = []
            if floor:
                extra.append(f"floor {fmt(r[floor])}")
            if cor:
                extra.append("corrected " + ci(r[cor], r[cor_lo] if cor_lo else None, r[cor_hi] if cor_hi else None))
            if deb is not None:
                d = deb[(deb["model"].astype(str) == model) & (deb["category"] == cat)]
                if len(d):
                    d = d.iloc[0]
                    extra.append("+ classifier error " + ci(d["tvd_debiased"], d.get("tvd_debiased_low"),
                                                            d.get("tvd_debiased_high")))
            row[cat] = cell + (f"<br><small>{html.escape(' · '.join(extra))}</small>" if extra else "")
        rows.append(row)
    b.html = _table(pd.DataFrame(rows).rename(columns={c: f"{c} [{level} CI]" for c in cats}), escape=False)
    if deb is not None:
        b.html += ("<p><small>corrected: finite-n bias removed; + classifier error: also corrected for the "
                   "classifier's confusion matrix (reliability sample), empirical-Bayes estimate with an honest "
                   "interval that allows for the remaining bias (stats.correction.debiased_tvd).</small></p>")
    if not floor or not cor:
        b.note = ("null floor / bias-corrected TVD: no data (tvd_summary has no "
                  + " or ".join(n for n, c in (("null_floor", floor), ("tvd_corrected", cor)) if not c) + " column)")
    b.findings += tvd_findings(df, est, lo, hi, floor, cor)
    return b


def tvd_findings(df: pd.DataFrame, est: str, lo: str | None, hi: str | None, floor: str | None,
                 cor: str | None) -> list[str]:
    allc = df[df["category"] == "all"] if "all" in set(df["category"]) else None
    out = []
    if allc is not None and len(allc.dropna(subset=[est])):
        a = allc.dropna(subset=[est]).sort_values(est)
        low, high = a.iloc[0], a.iloc[-1]
        span = (f"from {ci(low[est], low.get(lo), low.get(hi))} ({low['model']}) to "
                f"{ci(high[est], high.get(lo), high.get(hi))} ({high['model']})") if len(a) > 1 else \
            f"{ci(low[est], low.get(lo), low.get(hi))} ({low['model']})"
        out.append(f"Over all prompts, the mean per-prompt TVD from the benchmark ranges {span}.")
        if floor and cor:
            above = [r for _, r in a.iterrows() if num(r[est]) > num(r[floor])]
            out.append(f"{len(above)} of {len(a)} models lie above the null floor (the TVD expected from sampling "
                       f"alone); bias-corrected TVD: " + ", ".join(f"{r['model']} {fmt(r[cor])}" for _, r in a.iterrows()) + ".")
    per = df[df["category"] != "all"].dropna(subset=[est])
    if len(per):
        top = per.sort_values(est).iloc[-1]
        out.append(f"The largest distance is for {top['category']} prompts in {top['model']} "
                   f"(TVD {ci(top[est], top.get(lo), top.get(hi))}).")
    return out


def paired_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Paired differences in TVD between models (same prompts), with adjusted p-values."""
    b = Block("paired", "Paired differences between models (TVD of A − TVD of B, same prompts)")
    t = t2i.table("tvd_paired", "paired_tvd", "tvd_pairs")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.representation.compute", t)
    if not t.ok:
        return _missing(b, t)
    df = t.df
    a, bb, d = col(df, "model_a"), col(df, "model_b"), col(df, "diff", "difference", "estimate")
    lo, hi = col(df, "low", "diff_low", "ci_low"), col(df, "high", "diff_high", "ci_high")
    p, padj = col(df, "p_value", "p"), col(df, "p_adjusted", "p_adj", "q_value")
    if not (a and bb and d):
        b.note = f"tvd_paired lacks model_a/model_b/diff (has: {', '.join(df.columns)})"
        return b
    show = pd.DataFrame({"A − B": df[a].astype(str) + " − " + df[bb].astype(str),
                         "category": df[col(df, "category")] if col(df, "category") else "all",
                         f"difference [{level} CI]": [ci(r[d], r[lo] if lo else None, r[hi] if hi else None)
                                                      for _, r in df.iterrows()],
                         "p": df[p].map(pval) if p else "—", "p adjusted": df[padj].map(pval) if padj else "—"})
    b.html = _table(show)
    key = padj or p
    if key:
        sig = df[df[key].map(num) < ALPHA]
        what = "after adjustment" if padj else "(unadjusted)"
        if len(sig):
            b.findings += [f"{r[a]} is {'farther from' if num(r[d]) > 0 else 'closer to'} the benchmark than {r[bb]} on "
                           f"{r.get('category', 'all')} prompts: difference {ci(r[d], r.get(lo), r.get(hi))}, "
                           f"p {what} {pval(r[key])}." for _, r in sig.head(4).iterrows()]
        else:
            b.findings.append(f"No paired model difference in TVD is significant {what} "
                              f"({len(df)} comparisons, α = {ALPHA}).")
    return b


def skin_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Mean L* by classified race per model (with CI), and skin-tone diversity (ΔE2000)."""
    b = Block("skin", "Skin lightness L* by classified race, and skin-tone diversity")
    s = t2i.table("skin_summary_by_label")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.skin.compute", s)
    if not s.ok:
        return _missing(b, s)
    df = s.df
    L, lo, hi = col(df, "L_mean"), col(df, "L_mean_lo", "L_mean_low"), col(df, "L_mean_hi", "L_mean_high")
    div, pairs = col(df, "diversity_de2000", "diversity"), col(df, "diversity_pairs")
    n = col(df, "n")
    if not L or "label" not in df:
        b.note = f"skin_summary_by_label lacks label/L_mean (has: {', '.join(df.columns)})"
        return b
    labels = [x for x in GROUPS if x in set(df["label"])]
    rows = []
    for model in _models_order(df):
        sub = df[df["model"].astype(str) == model].set_index("label")
        row: dict[str, Any] = {"model": model}
        for lab in labels:
            if lab in sub.index:
                r = sub.loc[lab]
                row[f"L* {lab}"] = ci(r[L], r[lo] if lo else None, r[hi] if hi else None, 1) + (
                    f" (n={int(r[n])})" if n and not math.isnan(num(r[n])) else "")
            else:
                row[f"L* {lab}"] = "—"
        if div:
            w = sub[pairs].map(num) if pairs else pd.Series(1.0, index=sub.index)
            v = sub[div].map(num)
            ok = v.notna() & (w > 0)
            row["diversity ΔE00 (mean within label)"] = fmt((v[ok] * w[ok]).sum() / w[ok].sum(), 1) if ok.any() else "—"
        rows.append(row)
    b.html = _table(pd.DataFrame(rows))
    for model in _models_order(df):
        sub = df[(df["model"].astype(str) == model)].dropna(subset=[L])
        if n:
            sub = sub[sub[n].map(num) >= 2]
        if len(sub) >= 2:
            dark, light = sub.sort_values(L).iloc[0], sub.sort_values(L).iloc[-1]
            b.findings.append(f"In {model}, faces classified {dark['label']} are the darkest (mean L* {fmt(dark[L], 1)}) "
                              f"and those classified {light['label']} the lightest ({fmt(light[L], 1)}).")
    dark = t2i.table("skin_dark_share")
    if dark.ok and col(dark.df, "share"):
        d = dark.df
        b.extra = _table(pd.DataFrame({"model": d["model"], "faces measured": d.get("n_measured", "—"),
                                       "very dark (L* below threshold)": d.get("n_dark", "—"),
                                       f"share classified {d['group'].iloc[0] if 'group' in d else ''} [{level} CI]":
                                           [ci(r["share"], r.get("share_low"), r.get("share_high")) for _, r in d.iterrows()]}))
    return b


def homogeneity_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Homogeneity per model × group (CLIP and face embeddings): the within-prompt gap (headline, with its
    CI and adjusted p-value) and the paper's unstratified gap beside it."""
    b = Block("homogeneity", "Homogeneity gap within prompts (intra- minus inter-group cosine over pairs that share "
                             "a prompt; + = more alike), the paper's unstratified gap beside it")
    h = t2i.table("homogeneity_by_race")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.homogeneity.compute", h)
    if not h.ok:
        return _missing(b, h)
    df = h.df
    wp = col(df, "wp_gap")
    gap, lo, hi = (wp, col(df, "wp_gap_lo"), col(df, "wp_gap_hi")) if wp else (
        col(df, "gap"), col(df, "gap_lo", "gap_low"), col(df, "gap_hi", "gap_high"))
    paper = col(df, "gap") if wp else None
    padj, p = col(df, "p_adjusted", "p_adj"), col(df, "p_value", "p_perm", "p")
    if not gap or "group" not in df:
        b.note = f"homogeneity_by_race lacks group/gap (has: {', '.join(df.columns)})"
        return b
    seen = list(dict.fromkeys(df["group"].astype(str)))
    groups = [g for g in GROUPS if g in seen] + \
        [g for g in seen if g not in GROUPS]
    rows = []
    keys = [k for k in ("model", "space") if k in df]
    for key, sub in df.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(keys, key))
        sub = sub.set_index(sub["group"].astype(str))
        for g in groups:
            if g in sub.index and not math.isnan(num(sub.loc[g, gap])):
                r = sub.loc[g]
                pv = r[padj] if padj else (r[p] if p else None)
                row[g] = ci(r[gap], r[lo] if lo else None, r[hi] if hi else None) + (
                    f" p{'adj' if padj else ''}={pval(pv)}" if pv is not None else "") + (
                    f" · paper (unstratified) {fmt(r[paper])}" if paper else "")
            else:
                row[g] = "—"
        rows.append(row)
    b.html = _table(pd.DataFrame(rows))
    what_gap = "within-prompt gaps" if wp else "homogeneity gaps"
    key = padj or p
    if key:
        sig = df[df[key].map(num) < ALPHA].dropna(subset=[gap])
        what = "after adjustment" if padj else "(permutation test, unadjusted)"
        if len(sig):
            top = sig.reindex(sig[gap].abs().sort_values(ascending=False).index).iloc[0]
            b.findings.append(f"{len(sig)} of {df[gap].notna().sum()} {what_gap} are significant {what}; the "
                              f"largest: {top['group']} in {top['model']} ({top.get('space', '')} embeddings), gap "
                              f"{ci(top[gap], top.get(lo), top.get(hi))}"
                              + (f"; paper (unstratified) gap {fmt(top[paper])}." if paper else "."))
        else:
            b.findings.append(f"No {what_gap[:-1]} is significant {what} ({df[gap].notna().sum()} gaps).")
    if paper:
        both = df[[gap, paper]].map(num).dropna()
        if len(both):
            b.findings.append(f"The paper's unstratified gap, which also counts pairs across prompts (and so reads a "
                              f"group's prompt concentration as homogeneity), differs from the within-prompt gap by "
                              f"up to {fmt(float((both[paper] - both[gap]).abs().max()))}.")
    dup = col(df, "near_dup_rate")
    if dup and df[dup].map(num).notna().any():
        worst = df.loc[df[dup].map(num).idxmax()]
        b.findings.append(f"Near-duplicates (another image of the same prompt at cosine ≥ "
                          f"{fmt(num(worst.get('near_dup_cosine')))}): at most {fmt(num(worst[dup]))} of a group's "
                          f"images ({worst['group']} in {worst['model']}, {worst.get('space', '')} embeddings).")
    base = t2i.table("homogeneity_vs_baseline")
    if base.ok and col(base.df, "gap_minus_baseline"):
        b.downloads.append((base.path.name, _rel(reports, base.path)))
    return b


def kappa_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Classifier reliability: Cohen's κ human–classifier vs human–human, Fleiss κ overall and per group."""
    b = Block("kappa", "Classifier reliability (agreement with raters)")
    rel = t2i.root / "reliability"
    mean = Loaded("mean_kappa", read_csv(rel / "mean_kappa.csv"), rel / "mean_kappa.csv")
    fleiss = Loaded("fleiss_kappa", read_csv(rel / "fleiss_kappa.csv"), rel / "fleiss_kappa.csv")
    for x in (mean, fleiss):
        if x.df is None:
            x.path, x.reason = None, f"reports/t2i/reliability/{x.name}.csv not found (the reliability stage)"
    _with_trail(b, reports, "t2i_reliability", "biasaudit.t2i.reliability.agreement", mean, fleiss)
    if not mean.ok and not fleiss.ok:
        return _missing(b, mean, fleiss)
    rows = []
    source = ""
    if mean.ok:
        m = mean.df
        k = col(m, "mean_cohen_kappa", "kappa")
        for _, r in m.iterrows():
            rows.append({"agreement": f"mean Cohen's κ, {r.get('kind', '')}", "κ": fmt(r[k]) if k else "—"})
        source = str(m["raters_source"].iloc[0]) if "raters_source" in m else ""
    if fleiss.ok:
        f = fleiss.df
        k = col(f, "fleiss_kappa", "kappa")
        sub = f[f["raters"] == "all"] if "raters" in f else f
        for _, r in sub.iterrows():
            rows.append({"agreement": f"Fleiss κ (all raters), {r.get('group', '')}",
                         "κ": ci(r[k], r.get("ci_low"), r.get("ci_high")) if k else "—"})
    b.html = _table(pd.DataFrame(rows))
    if source:
        b.note = source
    if mean.ok and fleiss.ok:
        m, f = mean.df, fleiss.df
        kc = m.set_index("kind")[col(m, "mean_cohen_kappa", "kappa")] if "kind" in m else pd.Series(dtype=float)
        groups = f[(f.get("raters", "all") == "all") & (f["group"] != "overall")] if "group" in f else f.iloc[0:0]
        sentence = (f"The classifier agrees with raters at mean κ = {fmt(kc.get('human-classifier'))} "
                    f"(raters with each other: {fmt(kc.get('human-human'))})")
        if len(groups):
            worst = groups.sort_values(col(f, "fleiss_kappa", "kappa")).iloc[0]
            sentence += f"; the least reliable label is {worst['group']} (Fleiss κ {fmt(worst[col(f, 'fleiss_kappa', 'kappa')])})"
        b.findings.append(sentence + (" — SIMULATED raters." if "SIMULATED" in source else "."))
    return b


# ------------------------------------------------------------------------------------- Method B

def _vlm_tag(vlm: Outputs, name: str) -> str:
    """The VLM's name as findings print it, with what it is when it is not a model under audit."""
    summary = read_json(vlm.root / "summary.json")
    info = (summary.get("vlms") or {}).get(name, {}) if isinstance(summary, dict) else {}
    if info.get("backend") == "planted":
        return f"{name} (PLANTED: SIMULATED answers from declared effects)"
    return f"{name} (STAND-IN)" if info.get("stand_in") else name


def winrate_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Race win rates within gender per 2AFC task (0.5 = chosen as often as not)."""
    b = Block("winrates", "Method B: 2AFC race win rates within gender, per task")
    tables = [t for t in vlm.tables_matching("") if "_race_winrate_" in t.name]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.race_win_rates_within_gender", *tables)
    if not tables:
        b.note = "no <vlm>_race_winrate_<task> tables in reports/vlm/tables" + (
            "" if (vlm.root / "manifest.json").exists() else " (reflect_analysis has not run)")
        return b
    frames = []
    for t in tables:
        if not t.ok or not col(t.df, "rate"):
            continue
        v, task = t.name.split("_race_winrate_", 1)
        d = t.df.assign(vlm=v, task=task)
        frames.append(d)
    if not frames:
        b.note = "race win-rate tables are empty (no retained 2AFC answers)"
        return b
    df = pd.concat(frames, ignore_index=True)
    df["cell"] = [f"{fmt(r['rate'], 2)} ({int(r['n'])})" if "n" in df and not math.isnan(num(r["n"])) else fmt(r["rate"], 2)
                  for _, r in df.iterrows()]
    wide = df.pivot_table(index=["vlm", "race"], columns=["task", "gender"], values="cell", aggfunc="first")
    wide.columns = [f"{t} · {g}" for t, g in wide.columns]
    b.html = _table(wide.reset_index())
    for (v, task), sub in df.groupby(["vlm", "task"]):
        rates = sub.dropna(subset=["rate"])
        why = sub["degenerate"].dropna().astype(str) if "degenerate" in sub else pd.Series(dtype=str)
        why = why[why.str.len() > 0]
        if len(why):
            b.findings.append(f"{_vlm_tag(vlm, v)}, {task}: {why.iloc[0]}.")
        elif len(rates):
            hi, lo = rates.sort_values("rate").iloc[-1], rates.sort_values("rate").iloc[0]
            b.findings.append(f"{_vlm_tag(vlm, v)}, {task}: race win rates within gender range from {fmt(lo['rate'], 2)} "
                              f"({lo['race']} {lo['gender']}) to {fmt(hi['rate'], 2)} ({hi['race']} {hi['gender']}).")
    return b


def delta_g_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Δg (percentage gap to the reference group) per group and task, with CI and adjusted p."""
    b = Block("delta_g", "Method B: Δg per group and task (% vs the reference group)")
    tables = [t for t in vlm.tables_matching("") if t.name.endswith(("_delta_g", "_mean_gaps", "_gaps"))
              and "by_occupation" not in t.name]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.mean_gaps", *tables)
    frames = [t.df for t in tables if t.ok]
    if not frames:
        b.note = "no <vlm>_delta_g / <vlm>_mean_gaps table in reports/vlm/tables"
        return b
    df = pd.concat(frames, ignore_index=True)
    d = col(df, "delta_g", "delta_pct", "delta")
    lo, hi = col(df, "delta_low", "delta_pct_low", "low", "ci_low"), col(df, "delta_high", "delta_pct_high", "high", "ci_high")
    padj, p = col(df, "p_adjusted", "p_adj"), col(df, "p_value", "p")
    task = col(df, "measure", "task")
    if not d or not task:
        b.note = f"the gap tables lack delta/measure columns (have: {', '.join(df.columns)})"
        return b
    df["group"] = df.get("dimension", "").astype(str) + ":" + df.get("level", "").astype(str)
    df["cell"] = [ci(r[d], r[lo] if lo else None, r[hi] if hi else None, 1)
                  + (" *" if padj and num(r[padj]) < ALPHA else "") for _, r in df.iterrows()]
    vcol = "vlm" if "vlm" in df else None
    wide = df.pivot_table(index=[c for c in (vcol, "group") if c], columns=task, values="cell", aggfunc="first")
    wide.columns.name = None
    b.html = collapsible(_table(wide.reset_index()), len(wide), label=f"Δg of every group and task ({len(wide)} rows)")
    if not lo:
        b.note = "no CI columns in the gap tables yet (delta_low/delta_high)"
    if padj:
        b.note = (b.note + "; " if b.note else "") + f"* = significant after adjustment (α = {ALPHA})"
    key = padj or p
    if key:
        sig = df[df[key].map(num) < ALPHA]
        what = "after adjustment" if padj else "(unadjusted)"
        if len(sig):
            top = sig.reindex(sig[d].abs().sort_values(ascending=False).index).iloc[0]
            b.findings.append(f"{len(sig)} of {df[d].notna().sum()} Δg effects are significant {what}; the largest is "
                              f"{top['group']} on {top[task]} ({fmt(top[d], 1)}%).")
        else:
            b.findings.append(f"No Δg effect is significant {what} ({df[d].notna().sum()} effects).")
    else:
        nz = df[df[d].map(num).abs() > 0]
        b.findings.append(f"{len(nz)} of {df[d].notna().sum()} Δg values differ from 0; no p-values are available yet.")
    return b


def significance_block(vlm: Outputs, reports: Path, level: str) -> Block:
    """Effects significant after adjustment: cluster-robust OLS terms and sign-flip tests."""
    b = Block("significant", "Method B: significant effects (cluster-robust OLS, sign-flip tests)")
    tables = [t for t in vlm.tables_matching("") if t.name.endswith(("_ols", "_sign_flip"))]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.analysis.ols_cluster", *tables)
    rows = []
    n_tests = 0
    adjusted = True
    for t in tables:
        if not t.ok:
            continue
        df = t.df
        padj, p = col(df, "p_adjusted", "p_adj"), col(df, "p_value", "p")
        key = padj or p
        adjusted &= padj is not None
        if not key:
            continue
        n_tests += int(df[key].notna().sum())
        est = col(df, "coef", "mean_diff", "estimate")
        for _, r in df[df[key].map(num) < ALPHA].iterrows():
            rows.append({"test": t.name, "effect": r.get("term", f"{r.get('dimension', '')}:{r.get('level', '')}"),
                         "measure": r.get("measure", ""), "estimate": ci(r[est], r.get("ci_low"), r.get("ci_high")) if est else "—",
                         "p": pval(r[p]) if p else "—", "p adjusted": pval(r[padj]) if padj else "—"})
    if not tables:
        b.note = "no <vlm>_ols / <vlm>_sign_flip tables in reports/vlm/tables"
        return b
    what = "after adjustment" if adjusted else "(unadjusted p; adjusted p-values not in these tables yet)"
    sentence = f"{len(rows)} of {n_tests} tested effects are significant {what} at α = {ALPHA}."
    for t in vlm.tables_matching("_retention"):
        if t.ok and {"retained", "asked", "kind", "task"} <= set(t.df.columns):
            v = t.name.rsplit("_retention", 1)[0]
            for r in t.df.itertuples():
                if num(r.retained) < 0.5 * num(r.asked):
                    b.findings.append(f"{_vlm_tag(vlm, v)}, {r.kind} {r.task}: only {int(num(r.retained))} of {int(num(r.asked))} "
                                      f"answers retained (most common reason: {getattr(r, 'top_reason', '') or '—'}).")
    underpowered = sum(int(t.df["reason"].astype(str).str.startswith("underpowered").sum())
                       for t in tables if t.ok and "reason" in t.df)
    if underpowered:
        sentence += (f" {underpowered} tests are labelled underpowered (too few source photos to hold their "
                     "level) and report no p.")
    b.html = _table(pd.DataFrame(rows)) if rows else f"<p>{html.escape(sentence)}</p>"
    b.findings.append(sentence)
    return b


# ------------------------------------------------------------------------ validation, instruments

def validation_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Planted effects (known truth) vs what the audit estimates: is each inside its interval?"""
    b = Block("validation", "Does the audit recover what was planted?")
    t = t2i.table("validation")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.validation.compute", t)
    if not t.ok:
        return _missing(b, t)
    df = t.df
    cov = col(df, "covered")
    est = col(df, "estimate")
    show = pd.DataFrame({k: df[c] for k, c in (("model", col(df, "model")), ("quantity", col(df, "quantity")),
                                                ("category / group", col(df, "category_or_group", "group", "category")),
                                                ("planted", col(df, "planted"))) if c})
    if "planted" in show:
        show["planted"] = show["planted"].map(fmt)
    if est:
        show[f"estimate [{level} CI]"] = [ci(r[est], r.get("low"), r.get("high")) for _, r in df.iterrows()]
    if cov:
        show["covered"] = df[cov].map(lambda v: "yes" if truthy(v) else "NO")
    if "note" in df:
        show["note"] = df["note"].fillna("")
    if cov:
        ok = show["covered"].eq("yes")
        is_check = df["check"].map(truthy) if "check" in df \
            else pd.Series(True, index=df.index)
        if "check" in df:
            show.insert(len(show.columns) - ("note" in show), "check", is_check.map({True: "yes", False: "shown"}))
        informative = df["informative"].map(truthy) if "informative" in df else pd.Series(True, index=df.index)
        if "width" in df:
            show.insert(len(show.columns) - ("note" in show), "width", df["width"].map(lambda v: fmt(v, 3)))
        uninformative = int((is_check & ~informative).sum())
        is_check = is_check & informative
        hit, checks = ok & is_check, int(is_check.sum())
        missed = show.loc[is_check & ~ok, "quantity"].astype(str).value_counts()
        level_value = num(level.rstrip("%")) / 100 if level.endswith("%") else 0.95
        b.findings.append(f"The audit recovers {int(hit.sum())} of {checks} planted quantities inside their "
                          f"{level} intervals (at {level}, about {(1 - level_value) * checks:.0f} misses would be expected by chance)"
                          + ("." if missed.empty else "; missed (how many rows): "
                             + ", ".join(f"{q} ({n})" for q, n in missed.items()) + ".")
                          + (f" {uninformative} {'check is' if uninformative == 1 else 'checks are'} uninformative "
                             "(an interval as wide as the quantity's plausible range) and counted apart, not as covered."
                             if uninformative else ""))
        raw = show.loc[~is_check]
        if len(raw):
            b.findings.append(f"The {len(raw)} raw or partly corrected estimates shown beside them cover the planted "
                              f"value in {int(ok[~is_check].sum())}: the gap is the classifier's error and the "
                              "finite-n bias that the checked (corrected) rows remove.")
    # the findings say how many are covered; the table itself stays one click away (the front page is short)
    b.html = collapsible(_table(show), len(show), label=f"every row ({len(show)}): planted, estimate, interval, width")
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
    tables = [t for t in vlm.tables_matching("_validation") if t.ok]
    _with_trail(b, reports, "vlm_reflect_analysis", "biasaudit.vlm.recovery.recovery", *tables)
    if not tables:
        b.note = "no <vlm>_validation table (no VLM with backend planted among the vlms)"
        return b
    parts, full = [], []
    for t in tables:
        v = t.name.rsplit("_validation", 1)[0]
        df = t.df.assign(check=t.df["check"].map(truthy), informative=t.df["informative"].map(truthy),
                         covered=t.df["covered"].map(truthy))
        checks = df[df["check"]]
        info = checks[checks["informative"]]
        summary = info.groupby("quantity", sort=False).agg(
            checks=("covered", "size"), covered=("covered", "sum"),
            median_width=("width", "median"), plausible_range=("plausible_range", "first")).reset_index()
        parts.append(summary.assign(vlm=v)[["vlm", "quantity", "checks", "covered", "median_width", "plausible_range"]])
        misses = info.loc[~info["covered"], "quantity"].value_counts()
        level_value = num(level.rstrip("%")) / 100 if level.endswith("%") else 0.95
        b.findings.append(
            f"{_vlm_tag(vlm, v)}: {int(info['covered'].sum())} of {len(info)} informative planted "
            f"quantities lie inside their {level} intervals (about {(1 - level_value) * len(info):.0f} misses expected "
            "by chance)" + ("" if misses.empty else "; missed: " + ", ".join(f"{q} ({n})" for q, n in misses.items()))
            + f". {len(checks) - len(info)} checks without an informative interval (as wide as the quantity's "
            "plausible range, or none) are counted apart." + _power(info))
        full.append(df.assign(vlm=v))
    b.html = _table(_round(pd.concat(parts, ignore_index=True)))
    rows = pd.concat(full, ignore_index=True)
    show = rows[["vlm", "quantity", "task", "group", "planted"]].assign(
        **{f"estimate [{level} CI]": [ci(r.estimate, r.low, r.high) for r in rows.itertuples()],
           "width": rows["width"].map(lambda v: fmt(v, 3)),
           "covered": [("yes" if c else "NO") if i else "uninformative" for c, i in zip(rows["covered"], rows["informative"])],
           "check": rows["check"].map({True: "yes", False: "shown"}), "note": rows["note"].fillna("")})
    show["planted"] = show["planted"].map(fmt)
    b.extra = collapsible(_table(show), len(show), label=f"every row ({len(show)})")
    return b


def instruments_block(t2i: Outputs, reports: Path, level: str) -> Block:
    """Instrument bias: faces lost per group, detector disagreement, the instruments summary."""
    b = Block("instruments", "Instrument bias (does the measuring itself differ by group?)")
    parts, loaded = [], []
    summary = Loaded("summary", read_csv(t2i.root / "instruments/summary.csv"), t2i.root / "instruments/summary.csv")
    for name, title in (("face_loss", "Faces lost (no face found / unmeasured) per group"),
                        ("cross_detector", "Cross-detector agreement")):
        t = t2i.table(name)
        loaded.append(t)
        if t.ok:
            parts.append(f"<h4>{title}</h4>" + collapsible(_table(_round(t.df)), len(t.df)))
    if summary.df is not None and len(summary.df):
        loaded.append(summary)
        parts.insert(0, "<h4>Summary</h4>" + collapsible(_table(_round(summary.df)), len(summary.df),
                                                         label=f"the L* sweep, every method and level ({len(summary.df)} rows)"))
    else:
        summary.path = None
    png = t2i.root / "instruments/instruments.png"
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.instruments.compute", *loaded)
    if png.exists():
        b.extra = f'<details><summary>Figure</summary><img src="{_rel(reports, png)}" alt="instrument bias"></details>'
    if not parts:
        b.note = ("no data: reports/t2i/instruments/summary.csv and tables face_loss / cross_detector not found "
                  "(the instrument-bias analysis has not run)")
        return b
    b.html = "".join(parts)
    fl = next((t for t in loaded if t.name == "face_loss" and t.ok), None)
    if fl is not None:
        rate = col(fl.df, "loss_rate", "lost_share", "share_lost", "rate")
        grp = col(fl.df, "group", "label", "race")
        if rate and grp:
            s = fl.df.dropna(subset=[rate]).sort_values(rate)
            if len(s) > 1:
                b.findings.append(f"Face loss is highest for {s.iloc[-1][grp]} ({fmt(s.iloc[-1][rate])}) and lowest "
                                  f"for {s.iloc[0][grp]} ({fmt(s.iloc[0][rate])}).")
    return b


def calibration_block(reports: Path, level: str) -> Block:
    """Simulation check of every interval method: observed vs nominal coverage."""
    b = Block("calibration", "Calibration: do the intervals cover as often as they claim?")
    # the analysis copies the committed table (benchmarks/results, written by benchmarks/calibration.py)
    path = next((p for p in (reports / "t2i/tables/calibration.csv", reports / "calibration/calibration.csv")
                 if p.exists()), None)
    df = read_csv(path) if path is not None else None
    t = Loaded("calibration", df, path, "" if df is not None else
               "no calibration table (reports/t2i/tables/calibration.csv: run benchmarks/calibration.py)")
    _with_trail(b, reports, "t2i_analyze", "biasaudit.t2i.analysis.calibration.compute", t)
    if not t.ok:
        return _missing(b, t)
    nom, obs, se = col(df, "nominal"), col(df, "observed"), col(df, "mc_se")
    b.html = collapsible(_table(_round(df)), len(df), label=f"every calibration row ({len(df)})")
    if nom and obs:
        dev = (df[obs].map(num) - df[nom].map(num)).abs()
        tol = 2 * df[se].map(num) if se else pd.Series(0.01, index=df.index)
        ok = dev <= tol.fillna(0.01)
        flag = col(df, "flag")
        if flag:
            rated = df[col(df, "kind")].isin(["coverage", "rejection"]) if col(df, "kind") \
                else pd.Series(True, index=df.index)
            paper = (df[col(df, "scale")].eq("paper") if col(df, "scale") else pd.Series(True, index=df.index)) & rated
            good = df[flag].eq("ok")
            b.findings.append(f"Calibration by simulation: {int((good & paper).sum())} of {int(paper.sum())} "
                              "paper-scale intervals and tests are within their band (coverage 0.93–0.97, null "
                              f"rejection 0.03–0.07); {int((~good & rated).sum())} rows are labelled (small scale, "
                              "another estimand, or conservative by design) in the table.")
        else:
            b.findings.append(f"{int(ok.sum())} of {len(df)} interval settings cover within 2 Monte Carlo SE of "
                              f"their nominal level (observed {fmt(df[obs].min(), 3)}–{fmt(df[obs].max(), 3)}).")
    return b


def _round(df: pd.DataFrame) -> pd.DataFrame:
    return df.map(lambda v: round(v, 4) if isinstance(v, float) else v)


def collapsible(table_html: str, rows: int, limit: int = 12, label: str = "") -> str:
    if rows <= limit:
        return table_html
    return f"<details><summary>{html.escape(label or f'{rows} rows')}</summary>{table_html}</details>"


def build_blocks(reports: Path, level: str) -> dict[str, list[Block]]:
    t2i, vlm = Outputs.load(reports / "t2i"), Outputs.load(reports / "vlm")
    return {
        "method_a": [tvd_block(t2i, reports, level), paired_block(t2i, reports, level), skin_block(t2i, reports, level),
                     homogeneity_block(t2i, reports, level), kappa_block(t2i, reports, level)],
        "method_b": [winrate_block(vlm, reports, level), delta_g_block(vlm, reports, level),
                     significance_block(vlm, reports, level)],
        "checks": [validation_block(t2i, reports, level), method_b_validation_block(vlm, reports, level),
                   instruments_block(t2i, reports, level),
                   calibration_block(reports, level)],
    }
