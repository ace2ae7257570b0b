"""Human ratings of the FOCUS edits (validate_edits; docs/raters.md): realism (beyond the paper) and identity
consistency (the seed's rebuttal: "raters evaluate photorealism and perceived identity consistency").

Two measures, each a blinded sheet of its own folder (contracts.rating_folder) read back the same way:
- `realism`: every edit and, as a calibration, every unedited source photo, one image per item;
- `identity`: every edit beside its source photo's original (left or right by a hash of the seed and the
  pair), and as calibrations each original beside itself and the null edit (if on) beside its original.

1. `rating_items` (+ `identity_items`) + `blank_sheet`: the items in a seeded random order under opaque ids
   (R or I + 10 hex digits of a hash of the images' content and role, and the side, so a regenerated edit
   gets a new id and an old rating never lands on another image); `write_blinded_images` re-encodes each
   as `<folder>/images/<rating_id>.png` (a pair as one side-by-side image), so neither the file name, the
   format nor the folder tells an edit from an original. The blank sheet (item, rating_id, image, <measure>)
   goes to raters; the key (rating_id → kind, photo, group, edit_id, path; for pairs the source and the
   original's side) stays beside it.
2. `read_sheets`: each rater's filled copy; the measure's column must be an integer 1–5; a blank or other
   value is left missing and listed.
3. `pair_agreement`: per rater pair, on the items both rated, the exact agreement and Cohen's κ with
   quadratic weights (scikit-learn; an ordinal scale: a 4 vs 5 disagreement counts less than 1 vs 5).
4. `by_group`: an item's score is the mean of its raters' ratings; per target group (and for the
   calibration, all edits, and edits − calibration) the mean score with a cluster-bootstrap interval over
   source photos (stats/resample.py: the edits of one photo are not independent).
"""

from __future__ import annotations

import hashlib
import os
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import cohen_kappa_score

from biasaudit import contracts as C

SCALE = (1, 2, 3, 4, 5)
ORIGINAL = "original"
SELF = "original beside itself"  # identity's calibration: the same photo twice reads 5
ALL_EDITS = "all edits"
DIFFERENCE = "all edits − original"
LEVEL = 0.95
SHEET = "realism_sheet.csv"
KEY = "realism_key.csv"
KEY_COLUMNS = ["rating_id", "kind", "photo", "group", "race", "gender", "edit_id", "path"]
PAIR_COLUMNS = ["source_path", "original_side"]
GAP = 16  # white pixels between the two photos of a pair
# zlib level of the blinded PNGs: 1 (Pillow's default is 6) takes about a third of the CPU for files 7.6% larger
# (the demo's 288), the same pixels (a rater's copy, read by no code; the ratings key hashes the edits' own files)
PNG_COMPRESS_LEVEL = 1


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


def identity_items(items: pd.DataFrame) -> pd.DataFrame:
    """Realism's items (with `digest`) as pairs: each edit and null edit beside its photo's original, and
    each original beside itself (group SELF)."""
    originals = items[items["kind"] == ORIGINAL].set_index("photo")
    out = items.assign(source_path=items["photo"].map(originals["path"]),
                       source_digest=items["photo"].map(originals["digest"]))
    return out.assign(group=out["group"].where(out["kind"] != ORIGINAL, SELF))


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def blank_sheet(items: pd.DataFrame, seed: int, measure: str = "realism") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(blank sheet, key): the items (with a `digest` of each image file; pairs also `source_path` and
    `source_digest`) in a seeded random order; a pair's original goes left or right by a hash of the seed
    and the pair, so the side of one pair does not hang on which others exist."""
    paired = "source_digest" in items
    base = items[["kind", "photo", "edit_id", "digest"] + (["source_digest"] if paired else [])].astype(str)
    text = base.agg("|".join, axis=1) if len(items) else pd.Series([], dtype=str)
    columns = KEY_COLUMNS + (PAIR_COLUMNS if paired else [])
    if paired:
        side = np.array(["left" if int(_hex(f"{seed}|{t}")[:8], 16) % 2 else "right" for t in text], dtype=object)
        items = items.assign(original_side=side)
        text = text + "|" + side
    ids = [measure[0].upper() + _hex(t)[:10] for t in text]
    order = items.assign(rating_id=ids).sort_values("rating_id").sample(frac=1.0, random_state=seed % 2**32)
    key = order[columns].reset_index(drop=True)
    sheet = pd.DataFrame({"item": range(1, len(key) + 1), "rating_id": key["rating_id"],
                          "image": [f"images/{r}.png" for r in key["rating_id"]], measure: ""})
    return sheet, key


def side_by_side(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Two RGB images at the smaller one's height (aspect kept), GAP white columns between them."""
    from PIL import Image

    h = min(left.shape[0], right.shape[0])
    scaled = [a if a.shape[0] == h else np.asarray(Image.fromarray(a).resize(
        (max(1, round(a.shape[1] * h / a.shape[0])), h), Image.Resampling.LANCZOS)) for a in (left, right)]
    return np.concatenate([scaled[0], np.full((h, GAP, 3), 255, np.uint8), scaled[1]], axis=1)


def write_blinded_images(key: pd.DataFrame, folder: str | Path) -> list[str]:
    """Each keyed item re-encoded as PNG at <folder>/images/<rating_id>.png (a pair side by side, the
    original on its `original_side`); returns why any could not be. Each source photo is decoded once; the
    images are encoded in threads (PNG encoding releases the GIL), each file as it would be alone."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from biasaudit.pipeline.images import load_rgb

    out_dir = Path(folder) / "images"
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = key["source_path"] if "source_path" in key else [None] * len(key)
    sides = key["original_side"] if "original_side" in key else [""] * len(key)
    todo = [(rid, path, source, side) for rid, path, source, side in zip(key["rating_id"], key["path"], sources, sides)
            if not (out_dir / f"{rid}.png").is_file()]  # the id hashes the content: the same image
    originals = {source: load_rgb(source) for _, _, source, _ in todo if source is not None}

    def write(rid: str, path: str, source: str | None, side: str) -> list[str]:
        # a self pair (path == source) is one file
        loaded = {p: originals.get(p) or load_rgb(p) for p in (path, source) if p is not None}
        bad = [f"{rid} ({p}): {x.reason}" for p, x in loaded.items() if not x.ok]
        if bad:
            return bad
        rgb = loaded[path].rgb if source is None else side_by_side(
            *(loaded[p].rgb for p in ((source, path) if side == "left" else (path, source))))
        Image.fromarray(rgb).save(out_dir / f"{rid}.png", compress_level=PNG_COMPRESS_LEVEL)
        return []

    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        return [problem for bad in pool.map(lambda row: write(*row), todo) for problem in bad]


def export_sheets(checks: pd.DataFrame, sheets_dir: str | Path, seed: int) -> dict[str, dict[str, Any]]:
    """Each measure's blank sheet, key and blinded images into its contracts.rating_folder; counts and problems."""
    from biasaudit.pipeline.engine import file_digest
    from biasaudit.pipeline.io import atomic_write_table

    items = rating_items(checks)
    items["digest"] = [file_digest(p) for p in items["path"]]
    out = {}
    for measure in C.RATING_MEASURES:
        sheet, key = blank_sheet(identity_items(items) if measure == "identity" else items, seed, measure)
        folder = C.rating_folder(sheets_dir, measure)
        atomic_write_table(sheet, folder / f"{measure}_sheet.csv")
        atomic_write_table(key, folder / f"{measure}_key.csv")
        problems = write_blinded_images(key, folder)
        out[measure] = {"sheet": (folder / f"{measure}_sheet.csv").as_posix(), "items": int(len(key)),
                        **{kind: int((key["kind"] == kind).sum()) for kind in ("edit", "null_edit", ORIGINAL)},
                        "image_problems": problems}
    return out


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


def read_sheets(sheets: dict[str, str | Path], measure: str = "realism") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Filled sheets {rater: csv} → (rating_id × rater ratings of the `measure` column, NaN where missing;
    problems table)."""
    cols, problems = [], []
    for rater, path in sheets.items():
        sheet = pd.read_csv(path, dtype=str, keep_default_na=False)
        for col in ("rating_id", measure):
            if col not in sheet:
                raise ValueError(f"{path}: column '{col}' missing")
        if sheet["rating_id"].duplicated().any():
            raise ValueError(f"{path}: duplicate rating_id rows")
        parsed = [parse_rating(t) for t in sheet[measure]]
        problems += [{"rater": rater, "rating_id": rid, "answer": t, "reason": why}
                     for rid, t, (_, why) in zip(sheet["rating_id"], sheet[measure], parsed) if why]
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


def by_group(scores: pd.DataFrame, n_boot: int, seed: int, level: float = LEVEL,
             reference: str = ORIGINAL) -> pd.DataFrame:
    """Mean score per target group, the calibration group `reference` (realism: the originals; identity:
    each original beside itself), all edits, and all edits − `reference`, with cluster-bootstrap intervals
    over source photos (percentile, expanded; stats/resample.py)."""
    from biasaudit.stats.resample import cluster_bootstrap

    if not len(scores):
        return pd.DataFrame(columns=["group", "n_images", "n_photos", "mean", "low", "high", "reason"])
    difference = DIFFERENCE.replace(ORIGINAL, reference)
    labels = sorted(set(scores["group"]) - {reference}) + [reference, ALL_EDITS]
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
    for g, iv in zip(labels + [difference], ivals):
        sel = member[g] if g != difference else (member[ALL_EDITS] | member[reference])
        reason = iv.reason or ("" if np.isfinite(iv.estimate) else "no rated images")
        rows.append({"group": g, "n_images": int(sel.sum()), "n_photos": int(scores.loc[sel, "photo"].nunique()),
                     "mean": iv.estimate, "low": iv.low, "high": iv.high, "reason": reason})
    return pd.DataFrame(rows)


def empty_tables(reason: str, measure: str = "realism") -> dict[str, pd.DataFrame]:
    """A measure's tables in a run without ratings: one row each saying why."""
    return {f"{measure}_agreement": pd.DataFrame([{"rater_a": "", "rater_b": "", "n": 0, "exact_agreement": np.nan,
                                                   "weighted_kappa": np.nan, "reason": reason}]),
            f"{measure}_by_group": pd.DataFrame([{"group": "", "n_images": 0, "n_photos": 0, "mean": np.nan,
                                                  "low": np.nan, "high": np.nan, "reason": reason}])}


def rating_results(sheets_dir: str | Path, raters: list[str], n_boot: int, seed: int,
                   measure: str = "realism") -> dict[str, Any]:
    """Everything the stage reports about a measure: with fewer than two filled sheets a status saying
    which are missing (not an error), else agreement, per-group means, the calibration items' mean (the
    originals, or the pairs that show one person twice: the original beside itself or its null edit) and the
    sheet problems."""
    folder = C.rating_folder(sheets_dir, measure)
    sheets = {r: folder / f"{r}.csv" for r in raters}
    missing = [p.as_posix() for p in sheets.values() if not p.is_file()]
    present = {r: p for r, p in sheets.items() if p.is_file()}
    key_path = folder / f"{measure}_key.csv"
    if len(present) < 2 or not key_path.is_file():
        why = (f"no {measure} ratings: {len(present)} of {len(raters)} filled sheets ({', '.join(missing) or '-'} "
               f"missing; fewer than 2 raters or no {key_path.as_posix()}): rate {folder / f'{measure}_sheet.csv'} "
               "(docs/raters.md)")
        return {"status": "no ratings", "reason": why, "missing_sheets": missing, "tables": {}}
    key = pd.read_csv(key_path, dtype=str, keep_default_na=False)
    wide, problems = read_sheets(present, measure)
    unknown = sorted(set(wide.index) - set(key["rating_id"]))
    wide = wide.loc[wide.index.isin(key["rating_id"])]
    scores = image_scores(wide, key)
    agreement = pair_agreement(wide)
    table = by_group(scores, n_boot, seed, reference=SELF if measure == "identity" else ORIGINAL)
    calibration = scores["kind"].isin([ORIGINAL] + (["null_edit"] if measure == "identity" else []))
    note = (f"{len(present)} raters ({', '.join(present)}), {len(scores)} of {len(key)} items rated, "
            f"{len(problems)} blank/invalid ratings" + (f", {len(unknown)} rating_ids not in the key ignored" if unknown else ""))
    return {"status": "ok", "reason": "", "missing_sheets": missing, "note": note,
            "mean_weighted_kappa": float(agreement["weighted_kappa"].mean()) if agreement["weighted_kappa"].notna().any()
            else None,
            "calibration_mean": float(scores.loc[calibration, "score"].mean()) if calibration.any() else None,
            "tables": {f"{measure}_agreement": agreement, f"{measure}_by_group": table, f"{measure}_problems": problems}}
