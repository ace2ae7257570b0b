"""Section `corrected`: TVD and per-race deviations corrected for classifier error (stats.correction)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.stats.correction import (
    ConfusionDraws,
    classifier_corrected_tvd,
    confusion_draws,
    corrected_deviation,
    corrected_per_prompt,
    debiased_tvd,
    image_confusions,
    linear_draws,
    matrix_from_counts,
    point_rule,
    reference_labels,
)
from biasaudit.t2i.analysis.inputs import Boot, Inputs
from biasaudit.t2i.analysis.representation import _by_category, per_prompt_table

CONFUSION_FILES = ("confusion_matrix.csv", "confusion.csv")


def confusion_pairs(path: Path, groups: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(human, classifier) label pairs from a confusion-matrix CSV (rows human, columns classifier,
    first column the human label): each cell's count becomes that many pairs."""
    cm = pd.read_csv(path)
    cm = cm.set_index(cm.columns[0])
    true, pred = [], []
    for t, row in cm.iterrows():
        for c, k in row.items():
            if str(t) in groups and str(c) in groups and int(k) > 0:
                true += [str(t)] * int(k)
                pred += [str(c)] * int(k)
    return np.array(true, dtype=str), np.array(pred, dtype=str)


def annotated_images(rel: Path, groups: tuple[str, ...], reference: str = "consensus") -> tuple[np.ndarray, str, str]:
    """(per-image confusion counts E (images × K·K), source file, note) from the reliability stage:
    ratings.csv (one row per annotated image: every rater and the classifier; the human labels M is
    estimated against by `reference`, stats.correction.reference_labels) — or, from an older run, a
    confusion-matrix CSV whose pairs then stand in for images."""
    path = rel / "ratings.csv"
    if path.exists():
        r = pd.read_csv(path, dtype=str, keep_default_na=False)
        raters = [c for c in r.columns if c not in ("image_id", "classifier", "raters_source", "")]
        humans = reference_labels([[v for v in row if v in groups] for row in r[raters].to_numpy(object)], reference)
        used = sum(1 for h in humans if h)
        return image_confusions(humans, list(r.get("classifier", [])), groups), path.name, \
            (f"bootstrap resamples the {len(r)} annotated images (all their labels together); M against "
             f"{reference} labels ({used} of {len(r)} images)")
    path = next((rel / n for n in CONFUSION_FILES if (rel / n).exists()), None)
    if path is None:
        return np.zeros((0, len(groups) ** 2)), "", ""
    true, pred = confusion_pairs(path, groups)
    return image_confusions([[t] for t in true], list(pred), groups), path.name, (
        "no ratings.csv: each (human, classifier) pair of the confusion matrix is resampled as if it were an image")


def _recorded_correction(rel) -> dict:
    """What the reliability stage recorded about the correction (summary.json's "correction"), or {}."""
    try:
        return json.loads((rel / "summary.json").read_text()).get("correction") or {}
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _per_prompt_corrected(pp: pd.DataFrame, M: np.ndarray, groups: tuple[str, ...], method: str
                          ) -> tuple[pd.DataFrame, str]:
    """Per prompt: the raw and corrected shares and TVDs, and a note on prompts left uncorrected."""
    counts = pp[[f"n_{g}" for g in groups]].to_numpy(float)
    bench = pp[[f"bench_{g}" for g in groups]].to_numpy(float)
    shares, tvd_corr, why = corrected_per_prompt(counts, bench, M, method)
    per = pp[["model", "category", "prompt_id", "n", "tvd"]].rename(columns={"tvd": "tvd_raw"}).assign(
        tvd_classifier_corrected=tvd_corr)
    for j, g in enumerate(groups):
        per[f"raw_{g}"] = pp[f"share_{g}"].to_numpy()
        per[f"corrected_{g}"] = shares[:, j]
    per["correction_method"] = method
    return per, why


def _category_rows(model: str, cat: str, sub: pd.DataFrame, E: np.ndarray, groups: tuple[str, ...], method: str,
                   boot: Boot, md: ConfusionDraws) -> tuple[dict, list[dict]]:
    """One model × category: the summary row (raw, classifier-corrected, debiased, the point the report reads,
    its bound and floor test, the pooled TVD) and the corrected mean deviation per group. `md`: the section's
    one set of M* replicates (resamples of the annotated images), shared by the debiased TVD, the corrected
    deviations (the same bootstrap as the debiased TVD) and the pooled TVD."""
    counts = sub[[f"n_{g}" for g in groups]].to_numpy(float)
    bench = sub[[f"bench_{g}" for g in groups]].to_numpy(float)
    n_boot = min(boot.n_boot, 1000)
    raw, corr, info = classifier_corrected_tvd(
        counts, bench, E, groups, method=method, n_boot=n_boot, level=boot.level,
        seed=derive_seed(boot.seed, "corrected", model, cat), boot_method=boot.method)
    linear = linear_draws(counts, bench, E, len(groups), n_boot, derive_seed(boot.seed, "debiased", model, cat),
                          m_draws=md)
    deb, dinfo = debiased_tvd(counts, bench, E, groups, n_boot=n_boot, level=boot.level, linear=linear)
    devs = [{"model": model, "category": cat, "race": g, "mean_deviation_corrected": d.estimate,
             "mean_deviation_corrected_low": d.low, "mean_deviation_corrected_high": d.high, "reason": d.reason}
            for g, d in zip(groups, corrected_deviation(counts, bench, E, groups, n_boot=n_boot, level=boot.level,
                                                         linear=linear))]
    n_p = counts.sum(axis=1, keepdims=True)
    pooled, _ = debiased_tvd(counts.sum(axis=0, keepdims=True), (n_p * bench).sum(axis=0, keepdims=True) / n_p.sum(),
                             E, groups, n_boot=n_boot, level=boot.level,
                             seed=derive_seed(boot.seed, "debiased-pooled", model, cat), m_draws=md)
    point, point_source = point_rule(len(sub), dinfo["mse_weighted"], dinfo["raw"], dinfo["weight"],
                                     dinfo["rmse_raw"], dinfo["rmse_corrected"])
    # the raw TVD's interval is tvd_summary's (representation): one interval per statistic, so this
    # table keeps only its estimate for comparison (this bootstrap also resamples the annotated images)
    row = {"model": model, "category": cat, "n_prompts": len(sub), "mean_tvd_raw": raw.estimate,
           "tvd_classifier_corrected": corr.estimate, "tvd_classifier_corrected_low": corr.low,
           "tvd_classifier_corrected_high": corr.high, "correction_method": method,
           "tvd_debiased": deb.estimate, "tvd_debiased_low": deb.low, "tvd_debiased_high": deb.high,
           "tvd_debiased_width": deb.high - deb.low, "tvd_point": point, "tvd_point_source": point_source,
           "tvd_mse_weighted": dinfo["mse_weighted"], "tvd_point_weight": dinfo["weight"],
           "tvd_rmse_raw": dinfo["rmse_raw"], "tvd_rmse_corrected": dinfo["rmse_corrected"],
           "tvd_lower_bound": dinfo["lower_bound"], "tvd_above_floor_p": dinfo["above_floor_p"],
           "tvd_linear_plug_in": dinfo["plug_in"], "bias_bound": dinfo["bias_bound"],
           "pooled_tvd_debiased": pooled.estimate, "pooled_tvd_debiased_low": pooled.low,
           "pooled_tvd_debiased_high": pooled.high,
           "condition_number": info["condition_number"], "identifiable": info["identifiable"],
           "n_annotated_images": info["n_annotated_images"],
           "reason": "; ".join(dict.fromkeys(r for r in (corr.reason, deb.reason) if r))}
    return row, devs


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Mean TVD raw and corrected for classifier error (biasaudit.stats.correction), per model ×
    category, with one bootstrap over prompts and annotated images. This is the only place the
    correction is computed, with `reliability.correction_method`.
    `tvd_debiased*` is corrected for classifier error and finite n together, with the honest interval
    (stats.correction.debiased_tvd) and its width. `tvd_point` is the point estimate the report reads:
    with at least stats.correction.MIN_PROMPTS_POINT prompts `tvd_mse_weighted`, (1 − w)·raw + w·corrected
    with w (`tvd_point_weight`) from the bootstrap MSEs (`tvd_rmse_raw`, `tvd_rmse_corrected`, M
    re-estimated in every replicate), else the raw TVD (`tvd_point_source` says which and why;
    stats.correction.point_rule). `tvd_lower_bound`: one-sided lower confidence bound (stats.correction.
    tvd_lower_bound); `tvd_above_floor_p`: p-value of "TVD above what sampling and classifier error
    alone give" (parametric bootstrap under the benchmark with M̂)."""
    res = Result("corrected_tvd", "TVD corrected for classifier error")
    rel = inputs.root / C.RELIABILITY_DIR
    recorded = _recorded_correction(rel)
    groups = inputs.groups
    E, source, note = annotated_images(rel, groups, recorded.get("confusion_reference") or "consensus")
    if not source:
        res.status, res.reason = NO_DATA, ("no ratings.csv or confusion matrix in reports/t2i/reliability/ "
                                           f"({' or '.join(CONFUSION_FILES)})")
        return res
    if inputs.labels.empty or inputs.prompts.empty:
        res.status, res.reason = NO_DATA, "no labels"
        return res
    if E.sum() == 0:
        res.status, res.reason = NO_DATA, f"{source} has no (human, classifier) labels of the active set's groups"
        return res
    recorded = recorded.get("correction_method")
    boot, method = Boot.of(cfg), cfg.reliability.correction_method
    pp = per_prompt_table(inputs.labels, inputs.prompts, groups)
    pp = pp[pp["n"] > 0]
    per, why = _per_prompt_corrected(pp, matrix_from_counts(E.sum(axis=0), len(groups)), groups, method)
    rows, dev_rows = [], []
    md = confusion_draws(E, len(groups), min(boot.n_boot, 1000), derive_seed(boot.seed, "corrected-M"))
    for model, cat, sub in _by_category(pp):
        row, devs = _category_rows(model, cat, sub, E, groups, method, boot, md)
        rows.append(row)
        dev_rows += devs
    summary = pd.DataFrame(rows)
    res.tables = {C.TVD_CORRECTED_SUMMARY.name: summary, "tvd_corrected_per_prompt": per,
                  "deviation_corrected": pd.DataFrame(dev_rows)}
    res.notes.append(f"{source}: {note}; correction_method {method}"
                     + (" (recorded by the reliability stage)" if recorded == method else ""))
    if why:
        res.notes.append(why)
    res.metrics = {f"{r.model}/{r.category}": {"raw": r.mean_tvd_raw, "classifier_corrected": r.tvd_classifier_corrected,
                                               "low": r.tvd_classifier_corrected_low,
                                               "high": r.tvd_classifier_corrected_high,
                                               "debiased": r.tvd_debiased, "debiased_low": r.tvd_debiased_low,
                                               "debiased_high": r.tvd_debiased_high,
                                               "point": r.tvd_point, "point_source": r.tvd_point_source,
                                               "lower_bound": r.tvd_lower_bound, "above_floor_p": r.tvd_above_floor_p,
                                               "identifiable": bool(r.identifiable)}
                   for r in summary.itertuples()}
    return res
