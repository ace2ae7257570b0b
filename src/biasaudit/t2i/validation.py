"""Does the audit recover what was planted? And what do its own instruments lose?

`validation`: for images of the `planted` generator (PLANTED truth: declared per-prompt label
distributions and per-image skin L*), each headline quantity's planted value beside the audit's
estimate and CI, and whether the CI covers it. The estimates come from the same public functions the
analysis sections use (t2i.analysis: tvd_summary, deviation_summary, corrected_tvd, dark_share;
stats.skin_summary), so the check follows any change to them. Planted values are exact: the planted
per-prompt distribution p is known, so the planted TVD(p, benchmark) needs no sampling.

`face_loss` (every run, real ones included): the no-face rate of the main detector and the
cross-detector disagreement (faces.cross_detector) by classified label and by L* bin. A lost face has no
measured L*, so its bin comes from the second detector's face when it found one, else from the planted
L* (planted images), else it is 'unknown'. Rows above `threshold` are flagged: there the skin and
face-embedding results lean toward the lighter faces that were found.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from biasaudit import GROUPS
from biasaudit import known_truth as K
from biasaudit.faces.colour import l_bin
from biasaudit.outputs import NO_DATA, Figure, Result
from biasaudit.provenance import derive_seed
from biasaudit.stats.correction import debiased_tvd
from biasaudit.stats.skin_summary import skin_summary
from biasaudit.stats.tvd import expected_tvd, tvd
from biasaudit.t2i import analysis as an

COLUMNS = ["model", "category_or_group"] + K.COLUMNS
# check: the interval claims to cover the planted value (an estimator beside its estimand). Rows with
# check False are raw or partly corrected estimates, shown for the size of what the corrections remove.
# An interval as wide as the quantity's plausible range is uninformative (counted apart, never covered).
PLANTED_NOTE = "PLANTED truth: declared distributions, not a generator; the check tests the audit, not a model"
PLAUSIBLE_RANGE = {"mean_L": 100.0, "diversity_de2000": 100.0}  # L* 0–100, ΔE2000 0–100; shares and TVDs: 1


# ---------------------------------------------------------------- planted truth from the manifests

def planted_images(manifests: pd.DataFrame) -> pd.DataFrame:
    """One row per generated planted image: image_id, model, prompt_id, planted label/L*/hue/C* and
    the planted per-prompt shares p_<group> (from the manifest's `extra`)."""
    if manifests.empty or "planted_label" not in manifests:
        return pd.DataFrame()
    m = manifests[manifests["planted_label"].notna() & (manifests["status"] == "ok")].copy()
    if m.empty:
        return pd.DataFrame()
    extra = m["extra"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    shares = np.array([e.get("planted_shares", [np.nan] * len(GROUPS)) for e in extra], dtype=float)
    out = m[["image_id", "model", "prompt_id", "planted_label", "planted_L", "planted_hue"]].reset_index(drop=True)
    out["planted_C"] = [float(e.get("planted_C", np.nan)) for e in extra]
    for j, g in enumerate(GROUPS):
        out[f"p_{g}"] = shares[:, j]
    return out


def _row(model, quantity, group, planted, estimate, low, high, note="", check=True) -> dict:
    return K.row(quantity, planted, estimate, low, high, PLAUSIBLE_RANGE.get(quantity, 1.0), note, check,
                 model=model, category_or_group=group)


# ---------------------------------------------------------------- representation

def planted_per_prompt(truth: pd.DataFrame, pp: pd.DataFrame) -> pd.DataFrame:
    """pp (per_prompt_table rows of planted models) with the planted shares and realised planted shares."""
    per = truth.groupby(["model", "prompt_id"])[[f"p_{g}" for g in GROUPS]].first()
    realised = pd.crosstab([truth["model"], truth["prompt_id"]], truth["planted_label"]).reindex(
        columns=list(GROUPS), fill_value=0)
    realised = realised.div(realised.sum(axis=1), axis=0).add_prefix("r_")
    return pp.join(per.join(realised), on=["model", "prompt_id"], how="inner")


def representation_rows(pp: pd.DataFrame, boot: an.Boot, confusion: np.ndarray | None = None) -> list[dict]:
    """Mean and pooled TVD per category, planted vs the raw estimates. With the declared confusion M of a
    SIMULATED classifier, also the raw mean TVD against its own estimand: each image's label is drawn from
    p and then reported through M, so a prompt's classified counts are exactly Multinomial(n, p·M) and
    E[TVD] at that n is exact (stats.tvd.expected_tvd) — that row checks the interval itself; the raw
    rows beside the planted TVD are shown, not checked (classifier error and finite n both bias them)."""
    rows = []
    summary = an.tvd_summary(pp, boot).set_index(["model", "category"])
    for model, cat, sub in an._by_category(pp):
        sub = sub[sub["n"] > 0]
        if sub.empty:
            continue
        P = sub[[f"p_{g}" for g in GROUPS]].to_numpy(float)
        R = sub[[f"r_{g}" for g in GROUPS]].to_numpy(float)
        Bm = sub[[f"bench_{g}" for g in GROUPS]].to_numpy(float)
        n = sub["n"].to_numpy(float)[:, None]
        planted_mean, realised_mean = float(tvd(P, Bm).mean()), float(tvd(R, Bm).mean())
        planted_pooled = float(tvd((n * P).sum(0) / n.sum(), (n * Bm).sum(0) / n.sum()))
        s = summary.loc[(model, cat)]
        if confusion is not None:
            expected = float(np.nanmean(expected_tvd(n[:, 0].astype(int), P @ confusion, Bm)))
            rows.append(_row(model, "mean_tvd_expected_at_n", cat, expected, s["mean_tvd"], s["mean_tvd_low"],
                             s["mean_tvd_high"], "raw mean TVD vs its exact expectation E[TVD(p̂, q)] with "
                             "p̂ ~ Multinomial(n, planted p · declared confusion): the interval's own estimand"))
        rows.append(_row(model, "mean_tvd", cat, planted_mean, s["mean_tvd"], s["mean_tvd_low"], s["mean_tvd_high"],
                         f"raw classified labels (not a check); TVD of the planted labels actually drawn: "
                         f"{realised_mean:.3f}", check=False))
        rows.append(_row(model, "bias_corrected_mean_tvd", cat, planted_mean, s["tvd_bias_corrected"],
                         s["tvd_bias_corrected_low"], s["tvd_bias_corrected_high"],
                         f"finite-n bias correction only (null floor {s['null_floor']:.3f}); classifier error "
                         "remains (not a check)", check=False))
        rows.append(_row(model, "pooled_tvd", cat, planted_pooled, s["pooled_tvd"], s["pooled_tvd_low"],
                         s["pooled_tvd_high"], "raw classified labels (not a check)", check=False))
    return rows


def corrected_rows(inputs: an.Inputs, boot: an.Boot, pp: pd.DataFrame, method: str,
                   confusion: np.ndarray | None = None) -> tuple[list[dict], list[str]]:
    """The corrected estimates (analysis.corrected_tvd) vs planted: the TVD corrected for classifier error
    and finite n with its honest interval, mean and pooled, noting whether it moved toward the planted
    value; the classifier-corrected deviation per race; the classifier-only (`method`) TVD, shown. With
    the declared confusion of a SIMULATED classifier, the same debiased TVD with M known, which separates
    the estimator from the error of estimating M on the reliability sample."""
    res = an.corrected_tvd(inputs, boot, method)
    if res.status != "ok":
        return [], [f"corrected TVD not checked: {res.reason}"]
    summary = res.tables["tvd_corrected_summary"]
    deviations = res.tables["deviation_corrected"].set_index(["model", "category", "race"])
    truth = {}
    for m, c, s in an._by_category(pp[pp["n"] > 0]):
        P, Bm = s[[f"p_{g}" for g in GROUPS]].to_numpy(float), s[[f"bench_{g}" for g in GROUPS]].to_numpy(float)
        n = s["n"].to_numpy(float)[:, None]
        truth[(m, c)] = (float(tvd(P, Bm).mean()), float(tvd((n * P).sum(0) / n.sum(), (n * Bm).sum(0) / n.sum())),
                         (P - Bm).mean(axis=0), s)
    rows = []
    for r in summary.itertuples():
        if (r.model, r.category) not in truth:
            continue
        p, p_pooled, dev, sub = truth[(r.model, r.category)]
        closer = abs(r.tvd_debiased - p) < abs(r.mean_tvd_raw - p)
        rows.append(_row(r.model, "debiased_mean_tvd", r.category, p, r.tvd_debiased, r.tvd_debiased_low,
                         r.tvd_debiased_high,
                         f"raw {r.mean_tvd_raw:.3f} → corrected {r.tvd_debiased:.3f}: "
                         f"{'closer to' if closer else 'NOT closer to'} planted; classifier error (M from "
                         f"{r.n_annotated_images} annotated images) and finite n corrected; honest interval: "
                         f"plug-in {r.tvd_linear_plug_in:.3f}, bias bound {r.bias_bound:.3f}"))
        rows.append(_row(r.model, "debiased_pooled_tvd", r.category, p_pooled, r.pooled_tvd_debiased,
                         r.pooled_tvd_debiased_low, r.pooled_tvd_debiased_high,
                         "pooled shares, classifier error and finite n corrected (honest interval)"))
        if confusion is not None:
            iv, _ = debiased_tvd(sub[[f"n_{g}" for g in GROUPS]].to_numpy(float),
                                 sub[[f"bench_{g}" for g in GROUPS]].to_numpy(float), None, GROUPS,
                                 n_boot=min(boot.n_boot, 1000), level=boot.level,
                                 seed=derive_seed(boot.seed, "debiased-declared", r.model, r.category), M=confusion)
            rows.append(_row(r.model, "debiased_mean_tvd_declared_M", r.category, p, iv.estimate, iv.low, iv.high,
                             "as debiased_mean_tvd with the SIMULATED classifier's declared confusion taken as "
                             "known: the estimator without the error of estimating M"))
        rows.append(_row(r.model, "corrected_mean_tvd", r.category, p, r.tvd_classifier_corrected,
                         r.tvd_classifier_corrected_low, r.tvd_classifier_corrected_high,
                         f"classifier error only ({method}, clipped to the simplex); finite-n bias remains "
                         "(not a check)", check=False))
        for j, g in enumerate(GROUPS):
            d = deviations.loc[(r.model, r.category, g)]
            rows.append(_row(r.model, "mean_deviation", f"{r.category}/{g}", float(dev[j]),
                             d["mean_deviation_corrected"], d["mean_deviation_corrected_low"],
                             d["mean_deviation_corrected_high"],
                             "classifier-corrected share − benchmark share, mean over prompts"))
    return rows, []


# ---------------------------------------------------------------- skin tone

def _planted_lab(truth: pd.DataFrame) -> pd.DataFrame:
    h = np.radians(truth["planted_hue"].to_numpy(float))
    return truth.assign(L=truth["planted_L"], C=truth["planted_C"], h=truth["planted_hue"],
                        a=truth["planted_C"] * np.cos(h), b=truth["planted_C"] * np.sin(h))


def skin_rows(truth: pd.DataFrame, skin: pd.DataFrame, boot: an.Boot, dark_L: float, tolerance: float = 3.0
              ) -> list[dict]:
    """Mean L* and diversity per planted label (measured by the faces stage vs planted), and the share
    of L* < dark_L classified Black."""
    rows = []
    measured = skin.merge(truth[["image_id", "planted_label", "planted_L"]], on="image_id", how="inner")
    div_planted = skin_summary(_planted_lab(truth), by=["model", "planted_label"], n_boot=0)
    div_planted = div_planted.set_index(["model", "planted_label"])
    div_measured = skin_summary(measured, by=["model", "planted_label"], n_boot=boot.n_boot, ci=boot.level,
                                seed=boot.seed).set_index(["model", "planted_label"])
    for (model, label), t in truth.groupby(["model", "planted_label"], sort=True):
        m = measured[(measured["model"] == model) & (measured["planted_label"] == label)]
        planted = float(t["planted_L"].mean())
        if m.empty:
            rows.append(_row(model, "mean_L", label, planted, np.nan, np.nan, np.nan,
                             f"no measured face among {len(t)} images"))
            continue
        per = m.groupby("prompt_id").agg(s=("L", "sum"), n=("L", "size")).to_numpy(float)
        iv = boot.run(per, lambda s: s[..., 0] / s[..., 1], "validation-L", model, label)[0]
        same = float((m["L"] - m["planted_L"]).mean())
        err = iv.estimate - planted
        rows.append(_row(model, "mean_L", label, planted, iv.estimate, iv.low, iv.high,
                         f"{len(m)}/{len(t)} faces measured; error {err:+.2f} L* "
                         f"({'within' if abs(err) <= tolerance else 'OUTSIDE'} ±{tolerance:g}); "
                         f"measured − planted on the same images {same:+.2f}"))
        if (model, label) in div_measured.index and (model, label) in div_planted.index:
            d, p = div_measured.loc[(model, label)], div_planted.loc[(model, label)]
            rows.append(_row(model, "diversity_de2000", label, p["diversity_de2000"], d["diversity_de2000"],
                             d.get("diversity_de2000_lo", np.nan), d.get("diversity_de2000_hi", np.nan),
                             "mean pairwise ΔE2000 of skin colours; planted: the recoloured skin's colours"))
    dark = an.dark_share(skin, boot, dark_L, "black").set_index("model")
    for model, t in truth.groupby("model", sort=True):
        t_dark = t[t["planted_L"] < dark_L]
        planted = float((t_dark["planted_label"] == "black").mean()) if len(t_dark) else np.nan
        if model not in dark.index:
            continue
        d = dark.loc[model]
        rows.append(_row(model, "dark_share_black", f"L*<{dark_L:g}", planted, d["share"], d["share_low"],
                         d["share_high"], f"planted: {len(t_dark)} images with planted L* < {dark_L:g}; measured: "
                                          f"{int(d['n_dark'])} faces with measured L* < {dark_L:g}, classified label"))
    return rows


# ---------------------------------------------------------------- the section

def plot_validation(table: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    parts = [("TVD (checks: corrected estimates and the raw one's own estimand)",
              table[table["quantity"].str.contains("tvd") & table["check"]]),
             ("mean L* per planted label", table[table["quantity"] == "mean_L"])]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5), squeeze=False)
    for ax, (title, t) in zip(axes[0], parts):
        t = t.reset_index(drop=True)
        x = np.arange(len(t))
        err = np.vstack([t["estimate"] - t["low"], t["high"] - t["estimate"]]).clip(min=0)
        ax.errorbar(x, t["estimate"], yerr=np.nan_to_num(err), fmt="o", capsize=3, label="estimate (95% CI)")
        ax.scatter(x, t["planted"], marker="x", color="#b00", zorder=3, label="PLANTED")
        ax.set_xticks(x, [f"{m} · {q} · {c}" for m, q, c in zip(t["model"], t["quantity"], t["category_or_group"])],
                      fontsize=6, rotation=90)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return Figure(fig, "Does the audit recover what was planted?",
                  "PLANTED values (red ×) beside the audit's estimates and intervals (the debiased TVDs' are "
                  "honest, bias-aware intervals; the rest cluster-bootstrap CIs); only the checks are drawn. "
                  "Planted TVDs are exact (the planted per-prompt distributions are declared).")


def validation(inputs: an.Inputs, boot: an.Boot, dark_L: float = 40.0, correction_method: str = "lsq",
               tolerance: float = 3.0, confusion: np.ndarray | None = None) -> Result:
    """The validation section: table `validation` (COLUMNS), figure, metrics under `validation`."""
    res = Result("validation", "Does the audit recover what was planted?")
    truth = planted_images(inputs.manifests)
    if truth.empty:
        res.status, res.reason = NO_DATA, "no PLANTED images (the planted generator is not among the models)"
        return res
    rows: list[dict] = []
    pp = an.per_prompt_table(inputs.labels, inputs.prompts) if not inputs.labels.empty else pd.DataFrame()
    if not pp.empty:
        pp = planted_per_prompt(truth, pp)
    if pp.empty:
        res.notes.append("no labels for the planted images: representation not checked")
    else:
        rows += representation_rows(pp, boot, confusion)
        more, notes = corrected_rows(inputs, boot, pp, correction_method, confusion)
        rows += more
        res.notes += notes
    skin = an.skin_table(inputs.faces, inputs.labels, inputs.prompts)
    if skin.empty:
        res.notes.append("no measured faces: skin tone not checked")
    else:
        rows += skin_rows(truth, skin, boot, dark_L, tolerance)
    table = pd.DataFrame(rows, columns=COLUMNS)
    res.tables["validation"] = table
    res.notes.append(PLANTED_NOTE)
    if table.empty:
        res.status, res.reason = NO_DATA, "nothing to compare"
        return res
    res.figures["validation"] = plot_validation(table)
    checks = table[table["check"] & table["informative"]]
    deb = table[table["quantity"] == "debiased_mean_tvd"]
    L_rows = table[table["quantity"] == "mean_L"]
    L_ok = L_rows[L_rows["planted"] >= 30]
    res.metrics = {
        "planted": True, **K.summary(table, boot.level),
        **{f"{q}_covered": f"{int(t['covered'].sum())}/{len(t)}" for q, t in checks.groupby("quantity", sort=True)},
        "raw_mean_tvd_covered_not_a_check": f"{int(table.loc[table['quantity'] == 'mean_tvd', 'covered'].sum())}/"
                                            f"{int((table['quantity'] == 'mean_tvd').sum())}",
        "corrected_closer": f"{int(deb['note'].str.contains(': closer to', regex=False).sum())}/{len(deb)}",
        "mean_L_within_tolerance_for_L_ge_30": bool(((L_ok["estimate"] - L_ok["planted"]).abs() <= tolerance).all())
        if len(L_ok) else None,
        "rows_by_key": {f"{r.model}/{r.quantity}/{r.category_or_group}": {
            "planted": r.planted, "estimate": r.estimate, "low": r.low, "high": r.high, "covered": r.covered,
            "check": r.check, "width": r.width, "informative": r.informative}
            for r in table.itertuples()},
    }
    return res


# ---------------------------------------------------------------- instrument bias on the audited images

def face_frame(inputs: an.Inputs) -> pd.DataFrame:
    """Per attempted image (faces rows that were measured or lost): found by the main / cross detector,
    classified label, and an L* for binning with its basis (measured | cross | planted | unknown)."""
    f = inputs.faces
    if f.empty or "n_faces" not in f:
        return pd.DataFrame()
    f = f[f["status"].isin(["ok", "no_face", "multi_face", "no_skin"])].copy()
    if f.empty:
        return f
    f["found"] = f["n_faces"].fillna(0) > 0
    cross = f["cross_n_faces"] if "cross_n_faces" in f else pd.Series(-1, index=f.index)
    f["cross_ran"] = cross.fillna(-1) >= 0
    f["cross_found"] = cross.fillna(-1) > 0
    labels = inputs.labels
    if not labels.empty:
        f = f.merge(labels[["image_id", "label"]].drop_duplicates("image_id"), on="image_id", how="left")
    f["label"] = f.get("label", pd.Series(index=f.index, dtype=object)).where(
        lambda s: s.isin(GROUPS), "unknown")
    truth = planted_images(inputs.manifests)
    if not truth.empty:
        f = f.merge(truth[["image_id", "planted_L"]], on="image_id", how="left")
    L = f["L"].astype(float) if "L" in f else pd.Series(np.nan, index=f.index)
    cross_L = f["cross_L"].astype(float) if "cross_L" in f else pd.Series(np.nan, index=f.index)
    planted_L = f["planted_L"].astype(float) if "planted_L" in f else pd.Series(np.nan, index=f.index)
    f["L_basis"] = np.select([L.notna(), cross_L.notna(), planted_L.notna()], ["measured", "cross", "planted"],
                             "unknown")
    f["L_for_bin"] = L.fillna(cross_L).fillna(planted_L)
    f["L_bin"] = np.where(f["L_for_bin"].notna(), l_bin(f["L_for_bin"].to_numpy(float)), "unknown")
    return f


def _loss_rows(f: pd.DataFrame, boot: an.Boot, threshold: float) -> tuple[list[dict], list[dict]]:
    loss, cross = [], []
    for model, m in f.groupby("model", sort=True):
        for by in ("label", "L_bin"):
            for group, g in m.groupby(by, sort=True):
                per = g.groupby("prompt_id").agg(lost=("found", lambda s: float((~s).sum())),
                                                 n=("found", "size")).to_numpy(float)
                iv = boot.run(per, lambda s: s[..., 0] / s[..., 1], "face-loss", model, by, group)[0]
                basis = g["L_basis"].value_counts().to_dict() if by == "L_bin" else {}
                loss.append({"model": model, "by": by, "group": group, "n_images": len(g),
                             "n_no_face": int((~g["found"]).sum()), "no_face_rate": iv.estimate,
                             "low": iv.low, "high": iv.high, "threshold": threshold,
                             "flagged": bool(iv.estimate > threshold),
                             "L_basis": "; ".join(f"{k} {v}" for k, v in basis.items())})
                ran = g[g["cross_ran"]]
                if ran.empty:
                    continue
                main, other = ran["found"], ran["cross_found"]
                row = {"model": model, "by": by, "group": group, "n_images": len(ran),
                       "main_detector": str(ran["face_backend"].iloc[0]) if "face_backend" in ran else "",
                       "cross_detector": str(ran["cross_detector"].iloc[0]) if "cross_detector" in ran else "",
                       "both": int((main & other).sum()), "main_only": int((main & ~other).sum()),
                       "cross_only": int((~main & other).sum()), "neither": int((~main & ~other).sum())}
                row["share_main_only"] = row["main_only"] / len(ran)
                row["share_cross_only"] = row["cross_only"] / len(ran)
                row["flagged"] = bool(max(row["share_main_only"], row["share_cross_only"]) > threshold)
                cross.append(row)
    return loss, cross


def face_loss(inputs: an.Inputs, boot: an.Boot, threshold: float = 0.10) -> Result:
    """Tables `face_loss` (no-face rate by label and L* bin) and `cross_detector`, per model; flags."""
    res = Result("face_loss", "Instrument bias on the audited images: faces lost by label and skin tone")
    f = face_frame(inputs)
    if f.empty:
        res.status, res.reason = NO_DATA, inputs.notes.get("faces") or "no face measurements"
        return res
    loss, cross = _loss_rows(f, boot, threshold)
    res.tables["face_loss"] = pd.DataFrame(loss)
    res.tables["cross_detector"] = pd.DataFrame(cross, columns=[
        "model", "by", "group", "n_images", "main_detector", "cross_detector", "both", "main_only", "cross_only",
        "neither", "share_main_only", "share_cross_only", "flagged"])
    if not cross:
        res.notes.append("no cross-detector results (faces.cross_detector is none): only the no-face rates")
    for r in [*loss, *cross]:
        if r["flagged"]:
            what = (f"{r['no_face_rate']:.0%} without a face" if "no_face_rate" in r else
                    f"detectors disagree on {max(r['share_main_only'], r['share_cross_only']):.0%}")
            res.notes.append(f"FLAG {r['model']} {r['by']} {r['group']}: {what} (> {threshold:.0%}); its skin and "
                             "face-embedding results lean toward the lighter faces that were found")
    res.metrics = {"threshold": threshold, "flagged": [f"{r['model']}/{r['by']}/{r['group']}" for r in loss if r["flagged"]],
                   "no_face_rate": {f"{r['model']}/{r['by']}/{r['group']}": r["no_face_rate"] for r in loss},
                   "cross_flagged": [f"{r['model']}/{r['by']}/{r['group']}" for r in cross if r["flagged"]]}
    return res


# ---------------------------------------------------------------- the instruments stage, for the report

def instruments_result(directory) -> Result:
    """The `instruments` stage's sweep (reports/t2i/instruments) as a report section."""
    from pathlib import Path

    from biasaudit.t2i.figures import plot_sweep

    res = Result("instruments", "Instrument bias by skin tone (detectors and skin masks on an L* sweep)")
    directory = Path(directory)
    if not (directory / "summary.csv").exists():
        res.status, res.reason = NO_DATA, f"no {directory}/summary.csv (run the instruments stage)"
        return res
    summary = pd.read_csv(directory / "summary.csv")
    res.tables["instruments_summary"] = summary
    if (directory / "dark_rates.csv").exists():
        dark = pd.read_csv(directory / "dark_rates.csv")
        res.tables["instruments_dark_rates"] = dark
        res.metrics = {f"{r.method}/{r.mode}/{r.L_range}": {"detection_rate": r.detection_rate,
                                                            "mean_score": r.mean_score}
                       for r in dark.itertuples()}
    if (directory / "summary.json").exists():
        methods = json.loads((directory / "summary.json").read_text()).get("methods", {})
        res.notes += [f"{k}: {v}" for k, v in methods.items()]
    res.figures["instruments"] = Figure(plot_sweep(summary), "Detectors and skin masks over an L* sweep",
                                        "The packaged photos recoloured to each target L* (solid: skin only, "
                                        "dashed: whole image); detection rate, score, measured − target L*, "
                                        "mask area relative to the true mask.")
    return res
