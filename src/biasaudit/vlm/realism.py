"""Human realism ratings of the FOCUS edits (validate_edits; beyond the paper; docs/raters.md).

1. `rating_items` + `realism_sheet`: every edit and, as a calibration, every unedited source photo, in a
   seeded random order under opaque ids (R + 10 hex digits of a hash of the image's content and role, so a
   regenerated edit gets a new id and an old rating never lands on another image); `write_blinded_images`
   re-encodes each as
   `<sheets_dir>/images/<rating_id>.png`, so neither the file name, the format nor the folder tells an
   edit from an original. The blank sheet (item, rating_id, image, realism) goes to raters; the key
   (rating_id → kind, photo, group, edit_id, path) stays beside it.
2. `read_realism_sheets`: each rater's filled copy; `realism` must be an integer 1–5 (5 = a real,
   unedited photo; 1 = obviously edited or synthetic); a blank or other value is left missing and listed.
3. `pair_agreement`: per rater pair, on the images both rated, the exact agreement and Cohen's κ with
   quadratic weights (scikit-learn; an ordinal scale: a 4 vs 5 disagreement counts less than 1 vs 5).
4. `realism_by_group`: an image's score is the mean of its raters' ratings; per target group (and for
   the originals, all edits, and edits − originals) the mean score with a cluster-bootstrap interval over
   source photos (stats/resample.py: the edits of one photo are not independent).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import cohen_kappa_score

SCALE = (1, 2, 3, 4, 5)
ORIGINAL = "original"
ALL_EDITS = "all edits"
DIFFERENCE = "all edits − original"
LEVEL = 0.95
SHEET = "realism_sheet.csv"
KEY = "realism_key.csv"
KEY_COLUMNS = ["rating_id", "kind", "photo", "group", "race", "gender", "edit_id", "path"]


def rating_items(checks: pd.DataFrame) -> pd.DataFrame:
    """One row per image to rate: each measured edit (status ok; a null edit of the controls as kind
    `null_edit`) and each source photo once (the control arm `original` is that photo again: left out)."""
    from biasaudit.vlm.groups import NULL_EDIT

    ok = checks[(checks["status"] == "ok") & checks["source_path"].fillna("").astype(bool)
                & (checks["group"] != ORIGINAL)]
    photo = ok["occupation"].astype(str) + "/" + ok["base_id"].astype(str)
    kind = np.where(ok["group"] == NULL_EDIT, NULL_EDIT, "edit")
    edits = pd.DataFrame({"kind": kind, "photo": photo, "group": ok["group"], "race": ok["race"],
                          "gender": ok["gender"], "edit_id": ok["edit_id"], "path": ok["path"]})
    firsts = ok.assign(photo=photo).drop_duplicates("photo")
    originals = pd.DataFrame({"kind": ORIGINAL, "photo": firsts["photo"], "group": ORIGINAL, "race": "",
                              "gender": "", "edit_id": "", "path": firsts["source_path"]})
    return pd.concat([edits, originals], ignore_index=True)


def rating_id(kind: str, photo: str, edit_id: str, digest: str) -> str:
    import hashlib

    return "R" + hashlib.sha256(f"{kind}|{photo}|{edit_id}|{digest}".encode()).hexdigest()[:10]


def realism_sheet(items: pd.DataFrame, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(blank sheet, key): the items (with a `digest` of each image file) in a seeded random order."""
    ids = [rating_id(*row) for row in items[["kind", "photo", "edit_id", "digest"]].astype(str).to_numpy()]
    order = items.assign(rating_id=ids).sort_values("rating_id").sample(frac=1.0, random_state=seed % 2**32)
    key = order[KEY_COLUMNS].reset_index(drop=True)
    sheet = pd.DataFrame({"item": range(1, len(key) + 1), "rating_id": key["rating_id"],
                          "image": [f"images/{r}.png" for r in key["rating_id"]], "realism": ""})
    return sheet, key


def write_blinded_images(key: pd.DataFrame, folder: str | Path) -> list[str]:
    """Each keyed image re-encoded as PNG at <folder>/images/<rating_id>.png; returns why any could not be."""
    from PIL import Image

    from biasaudit.pipeline.images import load_rgb

    out_dir = Path(folder) / "images"
    out_dir.mkdir(parents=True, exist_ok=True)
    problems = []
    for rid, path in zip(key["rating_id"], key["path"]):
        if (out_dir / f"{rid}.png").is_file():  # the id hashes the content: the same image
            continue
        loaded = load_rgb(path)
        if loaded.ok:
            Image.fromarray(loaded.rgb).save(out_dir / f"{rid}.png")
        else:
            problems.append(f"{rid} ({path}): {loaded.reason}")
    return problems


def export_sheet(checks: pd.DataFrame, folder: str | Path, seed: int) -> dict[str, Any]:
    """Write the blank sheet, its key and the blinded images into `folder`; returns counts and problems."""
    from biasaudit.pipeline.engine import file_digest
    from biasaudit.pipeline.io import atomic_write_table

    items = rating_items(checks)
    items["digest"] = [file_digest(p) for p in items["path"]]
    sheet, key = realism_sheet(items, seed)
    folder = Path(folder)
    atomic_write_table(sheet, folder / SHEET)
    atomic_write_table(key, folder / KEY)
    problems = write_blinded_images(key, folder)
    return {"sheet": (folder / SHEET).as_posix(), "images": int(len(key)), "edits": int((key["kind"] == "edit").sum()),
            "originals": int((key["kind"] == ORIGINAL).sum()), "image_problems": problems}


def parse_rating(text: Any) -> tuple[int | None, str]:
    """An integer 1–5 ('4', ' 4 ', '4.0'), or None and why."""
    s = str(text).strip()
    if not s or s.lower() == "nan":
        return None, "blank"
    try:
        value = float(s)
    except ValueError:
        return None, f"not a number: {s!r}"
    if value != int(value) or int(value) not in SCALE:
        return None, f"outside the 1–5 scale: {s!r}"
    return int(value), ""


def read_realism_sheets(sheets: dict[str, str | Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Filled sheets {rater: csv} → (rating_id × rater ratings, NaN where missing; problems table)."""
    cols, problems = [], []
    for rater, path in sheets.items():
        sheet = pd.read_csv(path, dtype=str, keep_default_na=False)
        for col in ("rating_id", "realism"):
            if col not in sheet:
                raise ValueError(f"{path}: column '{col}' missing")
        if sheet["rating_id"].duplicated().any():
            raise ValueError(f"{path}: duplicate rating_id rows")
        parsed = [parse_rating(t) for t in sheet["realism"]]
        problems += [{"rater": rater, "rating_id": rid, "answer": t, "reason": why}
                     for rid, t, (_, why) in zip(sheet["rating_id"], sheet["realism"], parsed) if why]
        cols.append(pd.Series([v for v, _ in parsed], index=sheet["rating_id"], name=rater, dtype=float))
    wide = pd.concat(cols, axis=1) if cols else pd.DataFrame()
    return wide, pd.DataFrame(problems, columns=["rater", "rating_id", "answer", "reason"])


def pair_agreement(wide: pd.DataFrame) -> pd.DataFrame:
    """Per rater pair: images both rated, exact agreement, quadratic-weighted Cohen's κ (NaN + reason
    when undefined: fewer than 2 shared images, or a rater who gave one value only)."""
    rows = []
    for a, b in combinations(wide.columns, 2):
        both = wide[[a, b]].dropna()
        row = {"rater_a": a, "rater_b": b, "n": len(both), "exact_agreement": np.nan, "weighted_kappa": np.nan,
               "reason": ""}
        if len(both) < 2:
            row["reason"] = f"{len(both)} image(s) rated by both"
        elif both[a].nunique() < 2 and both[b].nunique() < 2:
            row["exact_agreement"] = float((both[a] == both[b]).mean())
            row["reason"] = "each rater gave a single value: κ undefined"
        else:
            row["exact_agreement"] = float((both[a] == both[b]).mean())
            row["weighted_kappa"] = float(cohen_kappa_score(both[a].astype(int), both[b].astype(int),
                                                            labels=list(SCALE), weights="quadratic"))
        rows.append(row)
    return pd.DataFrame(rows, columns=["rater_a", "rater_b", "n", "exact_agreement", "weighted_kappa", "reason"])


def image_scores(wide: pd.DataFrame, key: pd.DataFrame) -> pd.DataFrame:
    """The key with each image's mean rating (`score`) and its number of ratings; unrated images dropped."""
    stats = pd.DataFrame({"score": wide.mean(axis=1), "n_ratings": wide.notna().sum(axis=1)})
    out = key.merge(stats, left_on="rating_id", right_index=True, how="inner")
    return out[out["n_ratings"] > 0]


def realism_by_group(scores: pd.DataFrame, n_boot: int, seed: int, level: float = LEVEL) -> pd.DataFrame:
    """Mean realism per target group, the originals, all edits, and all edits − originals, with
    cluster-bootstrap intervals over source photos (percentile, expanded; stats/resample.py)."""
    from biasaudit.stats.resample import cluster_bootstrap

    if not len(scores):
        return pd.DataFrame(columns=["group", "n_images", "n_photos", "mean", "low", "high", "reason"])
    labels = sorted(set(scores["group"]) - {ORIGINAL}) + [ORIGINAL, ALL_EDITS]
    member = {g: (scores["group"] == g) for g in labels[:-1]} | {ALL_EDITS: scores["kind"] == "edit"}
    photos, codes = np.unique(scores["photo"], return_inverse=True)
    G = len(labels)
    totals = np.zeros((len(photos), 2 * G))
    for j, g in enumerate(labels):
        m = member[g].to_numpy()
        np.add.at(totals[:, j], codes[m], scores["score"].to_numpy()[m])
        np.add.at(totals[:, G + j], codes[m], 1.0)

    def statistic(sums: np.ndarray) -> np.ndarray:
        means = np.where(sums[..., G:] > 0, sums[..., :G] / np.where(sums[..., G:] > 0, sums[..., G:], 1), np.nan)
        return np.concatenate([means, means[..., [G - 1]] - means[..., [G - 2]]], axis=-1)

    ivals = cluster_bootstrap(totals, statistic, n_boot=n_boot, level=level, seed=seed)
    rows = []
    for g, iv in zip(labels + [DIFFERENCE], ivals):
        sel = member[g] if g != DIFFERENCE else (member[ALL_EDITS] | member[ORIGINAL])
        reason = iv.reason or ("" if np.isfinite(iv.estimate) else "no rated images")
        rows.append({"group": g, "n_images": int(sel.sum()), "n_photos": int(scores.loc[sel, "photo"].nunique()),
                     "mean": iv.estimate, "low": iv.low, "high": iv.high, "reason": reason})
    return pd.DataFrame(rows)


def empty_tables(reason: str) -> dict[str, pd.DataFrame]:
    """The realism tables of a run without ratings: one row each saying why."""
    return {"realism_agreement": pd.DataFrame([{"rater_a": "", "rater_b": "", "n": 0, "exact_agreement": np.nan,
                                                "weighted_kappa": np.nan, "reason": reason}]),
            "realism_by_group": pd.DataFrame([{"group": "", "n_images": 0, "n_photos": 0, "mean": np.nan,
                                               "low": np.nan, "high": np.nan, "reason": reason}])}


def realism_results(sheets_dir: str | Path, raters: list[str], n_boot: int, seed: int) -> dict[str, Any]:
    """Everything the stage reports about realism: with fewer than two filled sheets a status saying
    which are missing (not an error), else agreement, per-group means and the sheet problems."""
    folder = Path(sheets_dir)
    sheets = {r: folder / f"{r}.csv" for r in raters}
    missing = [p.as_posix() for p in sheets.values() if not p.is_file()]
    present = {r: p for r, p in sheets.items() if p.is_file()}
    key_path = folder / KEY
    if len(present) < 2 or not key_path.is_file():
        why = (f"no realism ratings: {len(present)} of {len(raters)} filled sheets ({', '.join(missing) or '-'} "
               f"missing; fewer than 2 raters or no {key_path.as_posix()}): rate {folder / SHEET} (docs/raters.md)")
        return {"status": "no ratings", "reason": why, "missing_sheets": missing, "tables": {}}
    key = pd.read_csv(key_path, dtype=str, keep_default_na=False)
    wide, problems = read_realism_sheets(present)
    unknown = sorted(set(wide.index) - set(key["rating_id"]))
    wide = wide.loc[wide.index.isin(key["rating_id"])]
    scores = image_scores(wide, key)
    agreement = pair_agreement(wide)
    by_group = realism_by_group(scores, n_boot, seed)
    note = (f"{len(present)} raters ({', '.join(present)}), {len(scores)} of {len(key)} images rated, "
            f"{len(problems)} blank/invalid ratings" + (f", {len(unknown)} rating_ids not in the key ignored" if unknown else ""))
    return {"status": "ok", "reason": "", "missing_sheets": missing, "note": note,
            "mean_weighted_kappa": float(agreement["weighted_kappa"].mean()) if agreement["weighted_kappa"].notna().any()
            else None,
            "tables": {"realism_agreement": agreement, "realism_by_group": by_group, "realism_problems": problems}}
