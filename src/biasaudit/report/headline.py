"""A small headline metrics file (about 20 numbers) for `dvc metrics diff` / `dvc exp show`.

`metrics/headline.json` is tracked in git (outside the gitignored reports/), so every commit carries a
baseline and `dvc exp run -S analyze.n_boot=100 && dvc metrics diff` prints a real before/after.
Keys are short so `dvc exp show --only-changed` fits a terminal: per model the mean per-prompt TVD
(all prompts), its bias-corrected value, the TVD also corrected for classifier error (tvd_debiased), mean skin L*, the largest |homogeneity gap|; one mean CI
width (the number a change of n_boot moves); classifier κ; per VLM the largest |Δg| and the count of
significant effects. A quantity without data is left out (DVC shows "-"), never written as 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit.io import atomic_write_json
from biasaudit.report.load import Outputs, col, num, read_csv, truthy

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
    tvd = t2i.table("tvd_summary")
    if tvd.ok and col(tvd.df, "mean_tvd", "tvd"):
        df = tvd.df
        est = col(df, "mean_tvd", "tvd")
        allc = df[df["category"] == "all"] if "category" in df else df
        for _, r in allc.iterrows():
            _put(out, "tvd", str(r["model"]), r[est])
        cor = col(df, "tvd_corrected", "mean_tvd_corrected")
        if cor:
            for _, r in allc.iterrows():
                _put(out, "tvd_corrected", str(r["model"]), r[cor])
        lo, hi = col(df, "mean_tvd_low"), col(df, "mean_tvd_high")
        if lo and hi:
            width = (df[hi].map(num) - df[lo].map(num)).dropna()
            if len(width):
                out["tvd_ci_width"] = _r(width.mean())
    deb = t2i.table("tvd_corrected_summary")
    if deb.ok and col(deb.df, "tvd_debiased") and "category" in deb.df:
        for _, r in deb.df[deb.df["category"] == "all"].iterrows():
            _put(out, "tvd_debiased", str(r["model"]), r["tvd_debiased"])
    skin = t2i.table("skin_summary_by_label")
    if skin.ok and col(skin.df, "L_mean") and col(skin.df, "n"):
        df = skin.df
        for model, sub in df.groupby("model", sort=False):
            w, L = sub["n"].map(num), sub["L_mean"].map(num)
            ok = w.notna() & L.notna() & (w > 0)
            if ok.any():
                _put(out, "L_mean", str(model), (L[ok] * w[ok]).sum() / w[ok].sum())
    hom = t2i.table("homogeneity_by_race")
    if hom.ok and col(hom.df, "gap"):
        df = hom.df[hom.df.get("space", "clip") == "clip"] if "space" in hom.df else hom.df
        for model, sub in df.groupby("model", sort=False):
            g = sub["gap"].map(num).abs().dropna()
            if len(g):
                _put(out, "gap_max", str(model), g.max())
    mk = read_csv(reports / "t2i/reliability/mean_kappa.csv")
    if mk is not None and "kind" in mk and col(mk, "mean_cohen_kappa"):
        hc = mk[mk["kind"] == "human-classifier"]
        if len(hc):
            out["kappa"] = _r(hc[col(mk, "mean_cohen_kappa")].iloc[0])
    for t in vlm.tables_matching("_mean_gaps") + vlm.tables_matching("_delta_g"):
        if not t.ok:
            continue
        d = col(t.df, "delta_g", "delta_pct", "delta")
        name = t.name.rsplit("_mean_gaps", 1)[0].rsplit("_delta_g", 1)[0]
        if d:
            vals = t.df[d].map(num).abs().dropna()
            if len(vals):
                _put(out, "dg_max", name, vals.max())
    for t in vlm.tables_matching("_sign_flip") + vlm.tables_matching("_ols"):  # NaN p (degenerate, underpowered) never counts
        if not t.ok:
            continue
        key = col(t.df, "p_adjusted", "p_adj", "p_value", "p")
        name = t.name.rsplit("_sign_flip", 1)[0].rsplit("_ols", 1)[0]
        if key:
            n = int((t.df[key].map(num) < ALPHA).sum())
            out.setdefault("n_sig", {})[name] = out.get("n_sig", {}).get(name, 0) + n
    val = t2i.table("validation")
    if val.ok and col(val.df, "covered"):
        cov = val.df[col(val.df, "covered")].map(truthy)
        keep = val.df["check"].map(truthy) if "check" in val.df else pd.Series(True, index=val.df.index)
        if "informative" in val.df:  # an interval as wide as the plausible range is not a pass
            keep &= val.df["informative"].map(truthy)
        out["planted_covered"] = _r(cov[keep].mean())
    for t in vlm.tables_matching("_validation"):
        if t.ok and {"covered", "check", "informative"} <= set(t.df.columns):
            keep = t.df["check"].map(truthy) & t.df["informative"].map(truthy)
            _put(out, "b_planted_covered", t.name.rsplit("_validation", 1)[0], t.df.loc[keep, "covered"].map(truthy).mean())
    return out


def write_headline(reports: Path, path: Path) -> Path:
    return atomic_write_json(path, headline_metrics(reports))


def count(metrics: dict[str, Any]) -> int:
    return sum(len(v) if isinstance(v, dict) else 1 for v in metrics.values())


__all__ = ["headline_metrics", "write_headline", "count"]
