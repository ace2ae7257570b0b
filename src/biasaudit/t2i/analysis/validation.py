"""Does the audit recover what was planted? And what do its own instruments lose?

`validation`: for images of the `planted` generator (PLANTED truth: declared per-prompt label
distributions and per-image skin L*), each headline quantity's planted value beside the audit's
estimate and CI, and whether the CI covers it. The estimates come from the same public functions the
analysis sections use (t2i.analysis: tvd_summary, deviation_summary, corrected_tvd, dark_share;
stats.skin_summary), so the check follows any change to them. Planted values are exact: the planted
per-prompt distribution p is known, so the planted TVD(p, benchmark) needs no sampling.

Its companions: `face_loss.py` (every run, real ones included): the no-face rate of the main detector and the
cross-detector disagreement (faces.cross_detector) by classified label and by L* bin. A lost face has no
measured L*, so its bin comes from the second detector's face when it found one, else from the planted
L* (planted images), else it is 'unknown'. Rows above `threshold` are flagged: there the skin and
face-embedding results lean toward the lighter faces that were found.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import known_truth as K
from biasaudit import registry
from biasaudit.pipeline.io import stable_float
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.correction import debiased_tvd
from biasaudit.stats.skin_summary import skin_summary
from biasaudit.stats.tvd import expected_tvd, tvd
from biasaudit.t2i.analysis import corrected, gender, skin
from biasaudit.t2i.analysis.inputs import Boot, Inputs
from biasaudit.t2i.analysis.representation import _by_category, per_prompt_table, tvd_summary
from biasaudit.t2i.figures import plot_validation

COLUMNS = ["model", "category_or_group"] + K.COLUMNS
# check: the interval claims to cover the planted value (an estimator beside its estimand). Rows with
# check False are raw or partly corrected estimates, shown for the size of what the corrections remove.
# An interval as wide as the quantity's plausible range is uninformative (counted apart, never covered).
PLANTED_NOTE = "PLANTED truth: declared distributions, not a generator; the check tests the audit, not a model"
L_TOLERANCE = 3.0  # a measured mean L* within this of the planted value counts as recovered (docs/validation.md)
PLAUSIBLE_RANGE = {"mean_L": 100.0, "diversity_de2000": 100.0}  # L* 0–100, ΔE2000 0–100; shares and TVDs: 1


# ---------------------------------------------------------------- planted truth from the manifests

def planted_images(manifests: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """One row per generated planted image: image_id, model, prompt_id, planted label/L*/hue/C* and
    the planted per-prompt shares p_<group> (from the manifest's `extra`)."""
    if manifests.empty or "planted_label" not in manifests:
        return pd.DataFrame()
    m = manifests[manifests["planted_label"].notna() & (manifests["status"] == "ok")].copy()
    if m.empty:
        return pd.DataFrame()
    extra = m["extra"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
    shares = np.array([e.get("planted_shares", [np.nan] * len(groups)) for e in extra], dtype=float)
    out = m[["image_id", "model", "prompt_id", "planted_label", "planted_L", "planted_hue"]].reset_index(drop=True)
    out["planted_C"] = [float(e.get("planted_C", np.nan)) for e in extra]
    for j, g in enumerate(groups):
        out[f"p_{g}"] = shares[:, j]
    return out


def _row(model, quantity, group, planted, estimate, low, high, note="", check=True) -> dict:
    return K.row(quantity, planted, estimate, low, high, PLAUSIBLE_RANGE.get(quantity, 1.0), note, check,
                 model=model, category_or_group=group)


# ---------------------------------------------------------------- representation

def planted_per_prompt(truth: pd.DataFrame, pp: pd.DataFrame, groups: tuple[str, ...]) -> pd.DataFrame:
    """pp (per_prompt_table rows of planted models) with the planted shares and realised planted shares."""
    per = truth.groupby(["model", "prompt_id"])[[f"p_{g}" for g in groups]].first()
    realised = pd.crosstab([truth["model"], truth["prompt_id"]], truth["planted_label"]).reindex(
        columns=list(groups), fill_value=0)
    realised = realised.div(realised.sum(axis=1), axis=0).add_prefix("r_")
    return pp.join(per.join(realised), on=["model", "prompt_id"], how="inner")


def representation_rows(pp: pd.DataFrame, boot: Boot, groups: tuple[str, ...],
                        confusion: np.ndarray | None = None) -> list[dict]:
    """Mean and pooled TVD per category, planted vs the raw estimates. With the declared confusion M of a
    SIMULATED classifier, also the raw mean TVD against its own estimand: each image's label is drawn from
    p and then reported through M, so a prompt's classified counts are exactly Multinomial(n, p·M) and
    E[TVD] at that n is exact (stats.tvd.expected_tvd) — that row checks the interval itself; the raw
    rows beside the planted TVD are shown, not checked (classifier error and finite n both bias them)."""
    rows = []
    summary = tvd_summary(pp, boot, groups).set_index(["model", "category"])
    for model, cat, sub in _by_category(pp):
        sub = sub[sub["n"] > 0]
        if sub.empty:
            continue
        P = sub[[f"p_{g}" for g in groups]].to_numpy(float)
        R = sub[[f"r_{g}" for g in groups]].to_numpy(float)
        Bm = sub[[f"bench_{g}" for g in groups]].to_numpy(float)
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


def corrected_rows(inputs: Inputs, cfg: Any, pp: pd.DataFrame, confusion: np.ndarray | None
                   ) -> tuple[list[dict], list[str]]:
    """The corrected estimates (analysis.corrected_tvd) vs planted: the TVD corrected for classifier error
    and finite n with its honest interval, mean and pooled, noting whether it moved toward the planted
    value; the classifier-corrected deviation per race; the classifier-only (`method`) TVD, shown. With
    the declared confusion of a SIMULATED classifier, the same debiased TVD with M known, which separates
    the estimator from the error of estimating M on the reliability sample."""
    boot, method, groups = Boot.of(cfg), cfg.reliability.correction_method, inputs.groups
    res = corrected.compute(inputs, cfg)
    if res.status != "ok":
        return [], [f"corrected TVD not checked: {res.reason}"]
    summary = res.tables[C.TVD_CORRECTED_SUMMARY.name]
    deviations = res.tables["deviation_corrected"].set_index(["model", "category", "race"])
    truth = {}
    for m, c, s in _by_category(pp[pp["n"] > 0]):
        P, Bm = s[[f"p_{g}" for g in groups]].to_numpy(float), s[[f"bench_{g}" for g in groups]].to_numpy(float)
        n = s["n"].to_numpy(float)[:, None]
        truth[(m, c)] = (float(tvd(P, Bm).mean()), float(tvd((n * P).sum(0) / n.sum(), (n * Bm).sum(0) / n.sum())),
                         (P - Bm).mean(axis=0), s)
    rows = []
    for r in summary.itertuples():
        if (r.model, r.category) not in truth:
            continue
        p, p_pooled, dev, sub = truth[(r.model, r.category)]
        # compared at the writer's precision: a tie in exact arithmetic (the point *is* the raw TVD) stays a tie
        # on every CPU, whatever the last bits of the two sums
        closer = stable_float(abs(r.tvd_debiased - p)) < stable_float(abs(r.mean_tvd_raw - p))
        rows.append(_row(r.model, "debiased_mean_tvd", r.category, p, r.tvd_debiased, r.tvd_debiased_low,
                         r.tvd_debiased_high,
                         f"raw {r.mean_tvd_raw:.3f} → corrected {r.tvd_debiased:.3f}: "
                         f"{'closer to' if closer else 'NOT closer to'} planted; classifier error (M from "
                         f"{r.n_annotated_images} annotated images) and finite n corrected; honest interval: "
                         f"plug-in {r.tvd_linear_plug_in:.3f}, bias bound {r.bias_bound:.3f}"))
        point_closer = stable_float(abs(r.tvd_point - p)) < stable_float(abs(r.mean_tvd_raw - p))
        rows.append(_row(r.model, "tvd_point", r.category, p, r.tvd_point, r.tvd_lower_bound, 1.0,
                         f"the point the report reads ({r.tvd_point_source}): "
                         f"{'closer to' if point_closer else 'NOT closer to'} planted than raw; interval: the "
                         f"one-sided lower bound {r.tvd_lower_bound:.3f} (p above floor {r.tvd_above_floor_p:.3g})"))
        rows.append(_row(r.model, "debiased_pooled_tvd", r.category, p_pooled, r.pooled_tvd_debiased,
                         r.pooled_tvd_debiased_low, r.pooled_tvd_debiased_high,
                         "pooled shares, classifier error and finite n corrected (honest interval)"))
        if confusion is not None:
            iv, _ = debiased_tvd(sub[[f"n_{g}" for g in groups]].to_numpy(float),
                                 sub[[f"bench_{g}" for g in groups]].to_numpy(float), None, groups,
                                 n_boot=min(boot.n_boot, 1000), level=boot.level,
                                 seed=derive_seed(boot.seed, "debiased-declared", r.model, r.category), M=confusion)
            rows.append(_row(r.model, "debiased_mean_tvd_declared_M", r.category, p, iv.estimate, iv.low, iv.high,
                             "as debiased_mean_tvd with the SIMULATED classifier's declared confusion taken as "
                             "known: the estimator without the error of estimating M"))
        rows.append(_row(r.model, "corrected_mean_tvd", r.category, p, r.tvd_classifier_corrected,
                         r.tvd_classifier_corrected_low, r.tvd_classifier_corrected_high,
                         f"classifier error only ({method}, clipped to the simplex); finite-n bias remains "
                         "(not a check)", check=False))
        for j, g in enumerate(groups):
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


def skin_rows(truth: pd.DataFrame, measured_skin: pd.DataFrame, boot: Boot, analyze: Any) -> list[dict]:
    """Mean L* and diversity per planted label (measured by the faces stage vs planted), and the share
    of very dark faces classified as the dark group (skin.dark_share reads both), planted vs measured."""
    skin_ = measured_skin
    rows = []
    measured = skin_.merge(truth[["image_id", "planted_label", "planted_L"]], on="image_id", how="inner")
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
                         f"({'within' if abs(err) <= L_TOLERANCE else 'OUTSIDE'} ±{L_TOLERANCE:g}); "
                         f"measured − planted on the same images {same:+.2f}"))
        if (model, label) in div_measured.index and (model, label) in div_planted.index:
            d, p = div_measured.loc[(model, label)], div_planted.loc[(model, label)]
            rows.append(_row(model, "diversity_de2000", label, p["diversity_de2000"], d["diversity_de2000"],
                             d.get("diversity_de2000_lo", np.nan), d.get("diversity_de2000_hi", np.nan),
                             "mean pairwise ΔE2000 of skin colours; planted: the recoloured skin's colours"))
    dark = skin.dark_share(skin_, boot, analyze).set_index("model")
    for model, t in truth.groupby("model", sort=True):
        if model not in dark.index:
            continue
        d = dark.loc[model]
        dark_L, group = float(d["L_threshold"]), str(d["group"])
        t_dark = t[t["planted_L"] < dark_L]
        planted = float((t_dark["planted_label"] == group).mean()) if len(t_dark) else np.nan
        rows.append(_row(model, f"dark_share_{group}", f"L*<{dark_L:g}", planted, d["share"], d["share_low"],
                         d["share_high"], f"planted: {len(t_dark)} images with planted L* < {dark_L:g}; measured: "
                                          f"{int(d['n_dark'])} faces with measured L* < {dark_L:g}, classified label"))
    return rows


# ---------------------------------------------------------------- the section

def compute(inputs: Inputs, cfg: Any) -> Result:
    """The validation section: table `validation` (COLUMNS), figure, metrics under `validation`. With a
    SIMULATED classifier its declared confusion matrix gives the raw TVD's exact estimand."""
    boot, groups = Boot.of(cfg), inputs.groups
    spec = cfg.classify.vlm
    confusion = (K.confusion_array(spec.sim_confusion, groups)
                 if registry.trait("vlm", spec.backend, "answers_from_confusion", False) else None)
    res = Result("validation", "Does the audit recover what was planted?")
    truth = planted_images(inputs.manifests, groups)
    gender_rows = gender.validation_rows(inputs, cfg, cfg.genders) if cfg.genders and not inputs.labels.empty else []
    if truth.empty and not gender_rows:
        res.status, res.reason = NO_DATA, "no PLANTED images (the planted generator is not among the models)"
        return res
    rows: list[dict] = []
    pp = per_prompt_table(inputs.labels, inputs.prompts, groups) if not (inputs.labels.empty or truth.empty) \
        else pd.DataFrame()
    if not pp.empty:
        pp = planted_per_prompt(truth, pp, groups)
    if pp.empty:
        res.notes.append("no labels for the planted images: representation not checked")
    else:
        rows += representation_rows(pp, boot, groups, confusion)
        more, notes = corrected_rows(inputs, cfg, pp, confusion)
        rows += more
        res.notes += notes
    rows += gender_rows
    measured = skin.skin_table(inputs.faces, inputs.labels, inputs.prompts, groups) if not truth.empty \
        else pd.DataFrame()
    if measured.empty:
        res.notes.append("no measured faces: skin tone not checked")
    else:
        rows += skin_rows(truth, measured, boot, cfg.analyze)
    table = pd.DataFrame(rows, columns=COLUMNS)
    res.tables[C.VALIDATION.name] = table
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
        "mean_L_within_tolerance_for_L_ge_30": bool(((L_ok["estimate"] - L_ok["planted"]).abs() <= L_TOLERANCE).all())
        if len(L_ok) else None,
        "rows_by_key": {f"{r.model}/{r.quantity}/{r.category_or_group}": {
            "planted": r.planted, "estimate": r.estimate, "low": r.low, "high": r.high, "covered": r.covered,
            "check": r.check, "width": r.width, "informative": r.informative}
            for r in table.itertuples()},
    }
    return res


