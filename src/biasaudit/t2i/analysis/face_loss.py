"""Section `face_loss`: instrument bias on the audited images. The no-face rate of the main detector and
the cross-detector disagreement (faces.cross_detector) by classified label, by L* bin and by ITA category and Monk
tone. A lost face has no measured L*, so its bin comes from the second detector's face when it found one, else
from the planted L* (planted images), else it is 'unknown'; its ITA category and Monk tone need a* and b* as well,
so they come from the planted colour (the cross detector records L* only), else 'unknown'. Rows above `analyze.face_loss_threshold` are flagged: there the skin
and face-embedding results lean toward the lighter faces that were found."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from biasaudit import contracts as C
from biasaudit import known_truth as K
from biasaudit.faces import skin_scales
from biasaudit.faces.colour import l_bin
from biasaudit.pipeline.outputs import NO_DATA, Result
from biasaudit.t2i.analysis.inputs import Boot, Inputs
from biasaudit.t2i.analysis.validation import planted_images

COLUMNS = ["model", "category_or_group"] + K.COLUMNS
# check: the interval claims to cover the planted value (an estimator beside its estimand). Rows with
# check False are raw or partly corrected estimates, shown for the size of what the corrections remove.
# An interval as wide as the quantity's plausible range is uninformative (counted apart, never covered).
PLANTED_NOTE = "PLANTED truth: declared distributions, not a generator; the check tests the audit, not a model"
PLAUSIBLE_RANGE = {"mean_L": 100.0, "diversity_de2000": 100.0}  # L* 0–100, ΔE2000 0–100; shares and TVDs: 1
# the face-loss rows: by classified label, by L* bin, and by the two skin-tone scales (faces/skin_scales.py)
BY = ("label", "L_bin", "ita_category", "monk_tone")


# ---------------------------------------------------------------- instrument bias on the audited images

def face_frame(inputs: Inputs) -> pd.DataFrame:
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
        lambda s: s.isin(inputs.groups), "unknown")
    truth = planted_images(inputs.manifests, inputs.groups)
    if not truth.empty:
        f = f.merge(truth[["image_id", "planted_L", "planted_C", "planted_hue"]], on="image_id", how="left")
    L = f["L"].astype(float) if "L" in f else pd.Series(np.nan, index=f.index)
    cross_L = f["cross_L"].astype(float) if "cross_L" in f else pd.Series(np.nan, index=f.index)
    planted_L = f["planted_L"].astype(float) if "planted_L" in f else pd.Series(np.nan, index=f.index)
    f["L_basis"] = np.select([L.notna(), cross_L.notna(), planted_L.notna()], ["measured", "cross", "planted"],
                             "unknown")
    f["L_for_bin"] = L.fillna(cross_L).fillna(planted_L)
    f["L_bin"] = np.where(f["L_for_bin"].notna(), l_bin(f["L_for_bin"].to_numpy(float)), "unknown")
    # the skin-tone scales need a* and b* too: the measured colour, else the planted one (the cross detector
    # records L* only), else no tone
    lab = np.full((len(f), 3), np.nan)
    if {"L", "a", "b"} <= set(f.columns):
        lab = f[["L", "a", "b"]].to_numpy(float)
    measured = ~np.isnan(lab).any(axis=1)
    if "planted_hue" in f:
        h = np.radians(f["planted_hue"].to_numpy(float))
        C_ = f["planted_C"].to_numpy(float)
        planted = np.column_stack([planted_L.to_numpy(float), C_ * np.cos(h), C_ * np.sin(h)])
        lab = np.where(np.isnan(lab).any(axis=1)[:, None], planted, lab)
    f["scale_basis"] = np.select([measured, ~np.isnan(lab).any(axis=1)], ["measured", "planted"], "unknown")
    toned = skin_scales.annotate(pd.DataFrame(lab, columns=["L", "a", "b"]))
    f["ita_category"] = toned["ita_category"].replace(skin_scales.NO_TONE, "unknown").to_numpy()
    f["monk_tone"] = toned["monk_tone"].replace(skin_scales.NO_TONE, "unknown").to_numpy()
    return f


def _loss_rows(f: pd.DataFrame, boot: Boot, threshold: float) -> tuple[list[dict], list[dict]]:
    loss, cross = [], []
    for model, m in f.groupby("model", sort=True):
        for by in BY:
            for group, g in m.groupby(by, sort=True):
                per = pd.DataFrame({"lost": ~g["found"].to_numpy(bool), "n": 1}).groupby(
                    g["prompt_id"].to_numpy()).sum().to_numpy(float)  # per prompt: lost, n
                iv = boot.run(per, lambda s: s[..., 0] / s[..., 1], "face-loss", model, by, group)[0]
                basis = {} if by == "label" else g["L_basis" if by == "L_bin" else "scale_basis"].value_counts().to_dict()
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


def compute(inputs: Inputs, cfg: Any) -> Result:
    """Tables `face_loss` (no-face rate by label and L* bin) and `cross_detector`, per model; flags above
    `analyze.face_loss_threshold`."""
    boot, threshold = Boot.of(cfg), cfg.analyze.face_loss_threshold
    res = Result("face_loss", "Instrument bias on the audited images: faces lost by label and skin tone")
    f = face_frame(inputs)
    if f.empty:
        res.status, res.reason = NO_DATA, inputs.notes.get("faces") or "no face measurements"
        return res
    loss, cross = _loss_rows(f, boot, threshold)
    res.tables[C.FACE_LOSS.name] = pd.DataFrame(loss)
    res.tables[C.CROSS_DETECTOR.name] = pd.DataFrame(cross, columns=[
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


