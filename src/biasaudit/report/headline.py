"""A small headline metrics file (about 20 numbers) for `dvc metrics diff` / `dvc exp show`.

`metrics/headline.json` is tracked in git (outside the gitignored reports/), so every commit carries a
baseline and `dvc exp run -S analyze.n_boot=100 && dvc metrics diff` prints a real before/after.
Keys are short so `dvc exp show --only-changed` fits a terminal: per model the mean per-prompt TVD
(all prompts), its bias-corrected value, the TVD also corrected for classifier error (tvd_debiased), mean skin L*,
the largest |within-prompt homogeneity gap| in CLIP space (wp_gap_max, the headline: pairs that share a prompt)
and beside it, for replication, the largest |paper's unstratified gap| (paper_gap_max: pairs across prompts
too); one mean CI width (the number a change of n_boot moves); classifier κ; per VLM the largest |Δg| and the
count of significant effects. A quantity without data is left out (DVC shows "-"), never written as 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.io import atomic_write_json
from biasaudit.report.load import Outputs, num, truthy

ALPHA = 0.05


def _r(v: Any, digits: int = 4) -> float | None:
    x = num(v)
    return None if math.isnan(x) else round(x, digits)


def _put(out: dict[str, Any], key: str, sub: str, value: Any) -> None:
    v = _r(value)
    if v is not None:
        out.setdefault(key, {})[sub] = v


def headline_metrics(reports: Path) -> dict[str, Any]:
    t2i, vlm = Outputs.load(reports / "t2i"), Outputs.load(reports / "vlm")
    out: dict[str, Any] = {}
    tvd = t2i.table(C.TVD_SUMMARY)
    if tvd.ok:
        df = tvd.df
        allc = df[df["category"] == "all"]
        for _, r in allc.iterrows():
            _put(out, "tvd", str(r["model"]), r["mean_tvd"])
        if "tvd_corrected" in df:
            for _, r in allc.iterrows():
                _put(out, "tvd_corrected", str(r["model"]), r["tvd_corrected"])
        width = (df["mean_tvd_high"].map(num) - df["mean_tvd_low"].map(num)).dropna()
        if len(width):
            out["tvd_ci_width"] = _r(width.mean())
    deb = t2i.table(C.TVD_CORRECTED_SUMMARY)
    if deb.ok:
        for _, r in deb.df[deb.df["category"] == "all"].iterrows():
            _put(out, "tvd_debiased", str(r["model"]), r["tvd_debiased"])
    skin = t2i.table(C.SKIN_SUMMARY_BY_LABEL)
    if skin.ok:
        for model, sub in skin.df.groupby("model", sort=False):
            w, L = sub["n"].map(num), sub["L_mean"].map(num)
            ok = w.notna() & L.notna() & (w > 0)
            if ok.any():
                _put(out, "L_mean", str(model), (L[ok] * w[ok]).sum() / w[ok].sum())
    hom = t2i.table(C.HOMOGENEITY_BY_RACE)
    if hom.ok:
        df = hom.df[hom.df["space"] == "clip"]
        for model, sub in df.groupby("model", sort=False):
            for key, column in (("wp_gap_max", "wp_gap"), ("paper_gap_max", "gap")):  # headline, then replication
                g = sub[column].map(num).abs().dropna()
                if len(g):
                    _put(out, key, str(model), g.max())
    mk = t2i.table(C.MEAN_KAPPA, where="reliability")
    if mk.ok:
        hc = mk.df[mk.df["kind"] == "human-classifier"]
        if len(hc):
            out["kappa"] = _r(hc["mean_cohen_kappa"].iloc[0])
    for k, t in vlm.tables_of(C.DELTA_G):
        if t.ok:
            vals = t.df["delta_pct"].map(num).abs().dropna()
            if len(vals):
                _put(out, "dg_max", k["vlm"], vals.max())
    for k, t in vlm.tables_of(C.SIGN_FLIP) + vlm.tables_of(C.OLS):  # NaN p (degenerate, underpowered) never counts
        if t.ok:
            n = int((t.df["p_adjusted"].map(num) < ALPHA).sum())
            out.setdefault("n_sig", {})[k["vlm"]] = out.get("n_sig", {}).get(k["vlm"], 0) + n
    val = t2i.table(C.VALIDATION)
    if val.ok:
        cov = val.df["covered"].map(truthy)
        keep = val.df["check"].map(truthy) if "check" in val.df else pd.Series(True, index=val.df.index)
        if "informative" in val.df:  # an interval as wide as the plausible range is not a pass
            keep &= val.df["informative"].map(truthy)
        out["planted_covered"] = _r(cov[keep].mean())
    for k, t in vlm.tables_of(C.VLM_VALIDATION):
        if t.ok:
            keep = t.df["check"].map(truthy) & t.df["informative"].map(truthy)
            _put(out, "b_planted_covered", k["vlm"], t.df.loc[keep, "covered"].map(truthy).mean())
    return out


def write_headline(reports: Path, path: Path) -> Path:
    return atomic_write_json(path, headline_metrics(reports))


def count(metrics: dict[str, Any]) -> int:
    return sum(len(v) if isinstance(v, dict) else 1 for v in metrics.values())


__all__ = ["headline_metrics", "write_headline", "count"]
