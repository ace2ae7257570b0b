"""Human rating sheets (vlm/realism.py), realism and identity consistency: the blinded sheets (an identity
pair's sides recovered from the key), reading raters' copies back, quadratic-weighted κ against a hand
computation from its definition, per-group means against hand means, and the 'no sheets yet' path (a
status, not an error; `check` lists the sheets where a profile needs them)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.vlm import realism as R


def weighted_kappa_by_hand(a, b, k=5):
    """Cohen's κ_w with quadratic weights w_ij = (i − j)² / (k − 1)²: 1 − Σ w·O / Σ w·E."""
    O = np.zeros((k, k))
    for x, y in zip(a, b):
        O[x - 1, y - 1] += 1
    O /= O.sum()
    E = np.outer(O.sum(axis=1), O.sum(axis=0))
    i, j = np.indices((k, k))
    W = (i - j) ** 2 / (k - 1) ** 2
    return 1 - (W * O).sum() / (W * E).sum()


def write_sheet(path, ids, ratings):
    pd.DataFrame({"item": range(1, len(ids) + 1), "rating_id": ids, "image": "", "realism": ratings}).to_csv(path, index=False)


def test_weighted_kappa_matches_the_definition(tmp_path):
    a, b = [1, 2, 3, 4, 5, 3, 2], [1, 3, 3, 5, 4, 2, 2]
    ids = [f"R{i}" for i in range(len(a))]
    write_sheet(tmp_path / "r1.csv", ids + ["Rx"], [str(x) for x in a] + [""])
    write_sheet(tmp_path / "r2.csv", ids + ["Rx"], [str(x) for x in b] + ["6"])
    wide, problems = R.read_sheets({"r1": tmp_path / "r1.csv", "r2": tmp_path / "r2.csv"})
    assert set(problems["reason"].str.split(":").str[0]) == {"blank", "outside the 1–5 scale"} and len(problems) == 2
    agree = R.pair_agreement(wide).iloc[0]
    assert agree["n"] == 7  # Rx has no valid pair
    assert agree["exact_agreement"] == pytest.approx(3 / 7)
    assert agree["weighted_kappa"] == pytest.approx(weighted_kappa_by_hand(a, b), abs=1e-12)
    assert 0 < agree["weighted_kappa"] < 1


def test_kappa_is_one_for_identical_and_undefined_for_constant_raters():
    wide = pd.DataFrame({"a": [1.0, 3, 5, 2], "b": [1.0, 3, 5, 2], "c": [4.0, 4, 4, 4], "d": [4.0, 4, 4, 4]})
    t = R.pair_agreement(wide).set_index(["rater_a", "rater_b"])
    assert t.loc[("a", "b"), "weighted_kappa"] == pytest.approx(1.0)
    assert np.isnan(t.loc[("c", "d"), "weighted_kappa"]) and "single value" in t.loc[("c", "d"), "reason"]


def test_parse_rating():
    assert R.parse_rating(" 4 ") == (4, "") and R.parse_rating("4.0") == (4, "")
    assert R.parse_rating("4.5")[0] is None and R.parse_rating("0")[0] is None and R.parse_rating("good")[0] is None


def scores_frame():
    """Two photos, each: an original and two edits (WM, BF). Scores chosen by hand."""
    rows = []
    for photo, orig, wm, bf in (("p1", 5.0, 4.0, 2.0), ("p2", 4.0, 4.5, 3.0), ("p3", 5.0, 3.5, 1.0)):
        rows += [{"photo": photo, "kind": "original", "group": "original", "score": orig},
                 {"photo": photo, "kind": "edit", "group": "WM", "score": wm},
                 {"photo": photo, "kind": "edit", "group": "BF", "score": bf}]
    return pd.DataFrame(rows)


def test_realism_by_group_means_and_intervals():
    t = R.by_group(scores_frame(), n_boot=400, seed=0).set_index("group")
    assert t.loc["original", "mean"] == pytest.approx(14 / 3)
    assert t.loc["WM", "mean"] == pytest.approx(12 / 3) and t.loc["BF", "mean"] == pytest.approx(2.0)
    assert t.loc[R.ALL_EDITS, "mean"] == pytest.approx(18 / 6)
    assert t.loc[R.DIFFERENCE, "mean"] == pytest.approx(18 / 6 - 14 / 3)
    assert (t["n_photos"] == 3).all() and t.loc[R.ALL_EDITS, "n_images"] == 6
    for g in ("WM", "BF", R.DIFFERENCE):
        assert t.loc[g, "low"] <= t.loc[g, "mean"] <= t.loc[g, "high"]


def test_one_photo_gives_no_interval_with_its_reason():
    one = scores_frame().query("photo == 'p1'")
    t = R.by_group(one, n_boot=100, seed=0)
    assert t["low"].isna().all() and t["reason"].str.contains("one cluster").all()


def edit_colour(colour, group):
    return tuple(c // (2 if group == "WM" else 3) for c in colour)


@pytest.fixture
def checks(tmp_path):
    rows = []
    for base, colour in (("b1", (200, 150, 120)), ("b2", (90, 60, 40))):
        src = tmp_path / "src" / f"{base}.jpg"
        src.parent.mkdir(exist_ok=True)
        Image.new("RGB", (40, 40), colour).save(src)
        for group, race, gender in (("WM", "White", "man"), ("BF", "Black", "woman")):
            edit = tmp_path / "focus" / "nurse" / base / f"{race}_{gender}.jpg"
            edit.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (40, 40), edit_colour(colour, group)).save(edit)
            rows.append({"edit_id": f"nurse/{base}/{race}_{gender}", "occupation": "nurse", "base_id": base,
                         "race": race, "gender": gender, "group": group, "path": str(edit), "source_path": str(src),
                         "status": "ok"})
    rows.append(rows[0] | {"edit_id": "nurse/b1/Asian_man", "group": "AM", "status": "failed"})  # not rated
    rows.append(rows[0] | {"edit_id": "nurse/b1/null", "group": "null_edit", "race": "", "gender": ""})
    rows.append(rows[0] | {"edit_id": "nurse/b1/original", "group": "original", "race": "", "gender": "",
                           "path": rows[0]["source_path"]})  # the control arm: the source photo again
    return pd.DataFrame(rows)


def test_exported_sheet_is_blinded_shuffled_and_complete(checks, tmp_path):
    info = R.export_sheets(checks, tmp_path / "realism", seed=3)["realism"]
    sheet = pd.read_csv(tmp_path / "realism" / R.SHEET, dtype=str, keep_default_na=False)
    key = pd.read_csv(tmp_path / "realism" / R.KEY, dtype=str, keep_default_na=False)
    assert info["edit"] == 4 and info["original"] == 2 and len(sheet) == 7 and not info["image_problems"]
    assert (key["kind"] == "null_edit").sum() == 1  # rated as its own kind; the original arm not twice
    assert list(sheet.columns) == ["item", "rating_id", "image", "realism"] and (sheet["realism"] == "").all()
    assert sheet["rating_id"].is_unique and set(sheet["rating_id"]) == set(key["rating_id"])
    for image in sheet["image"]:  # blinded copies: one format, named by the opaque id only
        assert (tmp_path / "realism" / image).is_file() and image.endswith(".png")
    counterfactual = (checks["status"] == "ok") & ~checks["group"].isin(["null_edit", "original"])
    assert sorted(key["edit_id"].loc[key["kind"] == "edit"]) == sorted(checks["edit_id"][counterfactual])
    assert sorted(key.loc[key["kind"] == "original", "path"]) == sorted(checks["source_path"].unique())
    again, _ = R.blank_sheet(R.rating_items(checks).assign(digest="d"), seed=3)
    other, _ = R.blank_sheet(R.rating_items(checks).assign(digest="d"), seed=4)
    assert list(again["rating_id"]) != list(other["rating_id"])  # another seed, another order
    assert sorted(again["rating_id"]) == sorted(other["rating_id"])


def test_no_sheets_is_a_status_and_two_sheets_give_the_tables(checks, tmp_path):
    folder = tmp_path / "realism"
    R.export_sheets(checks, folder, seed=0)
    none = R.rating_results(folder, ["rater1", "rater2"], n_boot=50, seed=0)
    assert none["status"] == "no ratings" and len(none["missing_sheets"]) == 2 and none["tables"] == {}
    assert "rater1.csv" in none["reason"]
    sheet = pd.read_csv(folder / R.SHEET, dtype=str, keep_default_na=False)
    key = pd.read_csv(folder / R.KEY, dtype=str, keep_default_na=False).set_index("rating_id")
    for rater, shift in (("rater1", 0), ("rater2", 1)):
        ratings = [5 if key.loc[r, "kind"] == "original" else 2 + shift for r in sheet["rating_id"]]
        sheet.assign(realism=ratings).to_csv(folder / f"{rater}.csv", index=False)
    done = R.rating_results(folder, ["rater1", "rater2"], n_boot=50, seed=0)
    assert done["status"] == "ok" and done["missing_sheets"] == []
    by_group = done["tables"]["realism_by_group"].set_index("group")
    assert by_group.loc["original", "mean"] == 5 and by_group.loc[R.ALL_EDITS, "mean"] == 2.5
    assert by_group.loc[R.DIFFERENCE, "mean"] == -2.5 and by_group.loc["null_edit", "n_images"] == 1


def test_side_by_side_scales_to_the_smaller_height():
    pair = R.side_by_side(np.zeros((20, 10, 3), np.uint8), np.full((40, 30, 3), 200, np.uint8))
    assert pair.shape == (20, 10 + R.GAP + 15, 3) and (pair[:, 10 + R.GAP:] == 200).all()


def test_check_lists_missing_rating_sheets_only_where_needed():
    import yaml

    from biasaudit.params import Params
    from biasaudit.weights import sheet_needs

    from .conftest import ROOT

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg = Params.model_validate(raw)
    assert [n for n in sheet_needs(cfg) if n.stage == "validate_edits"] == []
    raw["validate_edits"] = raw["validate_edits"] | {"realism_needed": True, "realism_sheets_dir": "nowhere/realism"}
    needs = [n for n in sheet_needs(Params.model_validate(raw)) if n.stage == "validate_edits"]
    assert [n.what for n in needs] == ["nowhere/realism/rater1.csv", "nowhere/realism/rater2.csv",
                                       "nowhere/realism/identity/rater1.csv", "nowhere/realism/identity/rater2.csv"]
    assert "identity/identity_sheet.csv" in needs[2].fix and "identity consistency 1–5" in needs[3].fix
    assert all(n.kind == "input" and n.stage == "validate_edits" for n in needs)


def test_identity_sheet_is_blinded_and_each_pair_is_where_the_key_says(checks, tmp_path):
    info = R.export_sheets(checks, tmp_path / "ratings", seed=3)
    folder = tmp_path / "ratings" / "identity"
    text = (folder / "identity_sheet.csv").read_text()
    sheet = pd.read_csv(folder / "identity_sheet.csv", dtype=str, keep_default_na=False)
    key = pd.read_csv(folder / "identity_key.csv", dtype=str, keep_default_na=False)
    realism = pd.read_csv(tmp_path / "ratings" / R.SHEET, dtype=str, keep_default_na=False)
    assert list(sheet.columns) == ["item", "rating_id", "image", "identity"] and (sheet["identity"] == "").all()
    for leak in ("WM", "BF", "null", "original", "White", "Black", "nurse", "b1", "b2", ".jpg", "left", "right"):
        assert leak not in text, leak  # neither group, arm, photo nor side in what the raters get
    assert not set(sheet["rating_id"]) & set(realism["rating_id"])  # its own ids: no realism image shown in a pair
    assert info["identity"] == {"sheet": (folder / "identity_sheet.csv").as_posix(), "items": 7, "edit": 4,
                                "null_edit": 1, "original": 2, "image_problems": []}
    sources = {"b1": (200, 150, 120), "b2": (90, 60, 40)}
    colour = {row.path: edit_colour(sources[row.base_id], row.group) for row in checks.itertuples()
              if row.group in ("WM", "BF")}  # the fixture's null edit is b1's WM file
    for row in key.merge(sheet, on="rating_id").itertuples():
        base = row.photo.split("/")[1]
        assert Path(row.source_path) == tmp_path / "src" / f"{base}.jpg"
        original = sources[base]
        other = original if row.kind == "original" else colour[row.path]
        rgb = np.asarray(Image.open(folder / row.image).convert("RGB")).astype(int)
        assert rgb.shape == (40, 40 + R.GAP + 40, 3) and (rgb[:, 40:40 + R.GAP] == 255).all()
        left, right = (original, other) if row.original_side == "left" else (other, original)
        assert np.abs(rgb[20, 20] - left).max() <= 3 and np.abs(rgb[20, 60 + R.GAP] - right).max() <= 3
    assert set(key.loc[key["kind"] == "original", "group"]) == {R.SELF}


def test_identity_sides_and_order_follow_the_seed():
    items = pd.DataFrame({"kind": "edit", "photo": [f"p{i // 4}" for i in range(400)], "group": "WM", "race": "White",
                          "gender": "man", "edit_id": [f"e{i}" for i in range(400)], "path": "x",
                          "digest": [f"d{i}" for i in range(400)], "source_path": "y", "source_digest": "s"})
    keys = [R.blank_sheet(items, seed, "identity")[1].set_index("edit_id") for seed in range(12)]
    left = np.array([(k.loc[items["edit_id"], "original_side"] == "left").to_numpy() for k in keys])
    assert 0.4 < left.mean(axis=1).min() and left.mean(axis=1).max() < 0.6  # about half on each side per seed
    assert left.any(axis=0).all() and (~left).any(axis=0).all()  # each pair's side changes with the seed
    again = R.blank_sheet(items, 5, "identity")[1]
    assert list(again["rating_id"]) == list(keys[5]["rating_id"])  # the same seed: the same sides, ids and order
    assert list(keys[4]["rating_id"]) != list(keys[5]["rating_id"])
    assert all(k["rating_id"].str.startswith("I").all() for k in keys)


def test_identity_ratings_against_brute_force(checks, tmp_path):
    folder = tmp_path / "ratings"
    R.export_sheets(checks, folder, seed=1)
    sheet = pd.read_csv(folder / "identity" / "identity_sheet.csv", dtype=str, keep_default_na=False)
    key = pd.read_csv(folder / "identity" / "identity_key.csv", dtype=str, keep_default_na=False)
    rng = np.random.default_rng(7)
    given = {r: dict(zip(sheet["rating_id"], rng.integers(1, 6, len(sheet)).tolist())) for r in ("rater1", "rater2")}
    bad = sheet["rating_id"].iloc[2]
    for rater, ratings in given.items():
        answers = [("four" if rater == "rater2" and rid == bad else str(ratings[rid])) for rid in sheet["rating_id"]]
        sheet.assign(identity=answers).to_csv(folder / "identity" / f"{rater}.csv", index=False)
    del given["rater2"][bad]
    res = R.rating_results(folder, ["rater1", "rater2"], n_boot=200, seed=0, measure="identity")
    assert res["status"] == "ok" and set(res["tables"]) == {"identity_agreement", "identity_by_group", "identity_problems"}
    problems = res["tables"]["identity_problems"]
    assert problems[["rater", "rating_id", "answer"]].values.tolist() == [["rater2", bad, "four"]]
    assert problems["reason"].iloc[0].startswith("not a number")
    both = [rid for rid in sheet["rating_id"] if rid != bad]
    a, b = [given["rater1"][r] for r in both], [given["rater2"][r] for r in both]
    agree = res["tables"]["identity_agreement"].iloc[0]
    assert agree["n"] == 6 and agree["weighted_kappa"] == pytest.approx(weighted_kappa_by_hand(a, b), abs=1e-12)
    score = {rid: np.mean([g[rid] for g in given.values() if rid in g]) for rid in sheet["rating_id"]}
    groups = {}
    for row in key.itertuples():
        groups.setdefault(row.group, []).append(score[row.rating_id])
        if row.kind == "edit":
            groups.setdefault(R.ALL_EDITS, []).append(score[row.rating_id])
    t = res["tables"]["identity_by_group"].set_index("group")
    assert set(t.index) == set(groups) | {"all edits − original beside itself"}
    for g, values in groups.items():
        assert t.loc[g, "mean"] == pytest.approx(np.mean(values)), g
    assert t.loc["all edits − original beside itself", "mean"] == pytest.approx(
        np.mean(groups[R.ALL_EDITS]) - np.mean(groups[R.SELF]))
    assert res["calibration_mean"] == pytest.approx(np.mean(groups[R.SELF] + groups["null_edit"]))
    none = R.rating_results(folder, ["rater1", "rater3"], n_boot=50, seed=0, measure="identity")
    assert none["status"] == "no ratings" and none["missing_sheets"] == [(folder / "identity" / "rater3.csv").as_posix()]
    assert set(R.empty_tables(none["reason"], "identity")) == {"identity_agreement", "identity_by_group"}


def test_an_unreadable_original_is_a_problem_of_each_of_its_pairs(checks, tmp_path):
    (tmp_path / "src" / "b2.jpg").write_bytes(b"not an image")
    info = R.export_sheets(checks, tmp_path / "ratings", seed=0)
    assert len(info["realism"]["image_problems"]) == 1  # the original itself
    assert len(info["identity"]["image_problems"]) == 3  # its two edits' pairs and its self pair (source counted once)
    assert all("b2.jpg" in p for p in info["identity"]["image_problems"])
