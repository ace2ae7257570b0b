"""The validation and face-loss sections against brute-force values on synthetic PLANTED inputs."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit import GROUPS
from biasaudit.backends.generators.planted import planted_distribution
from biasaudit.stats.tvd import tvd
from biasaudit.t2i.analysis import face_loss
from biasaudit.t2i.analysis import validation as va
from biasaudit.t2i.analysis.inputs import Inputs

from .fixtures_t2i import analysis_config

# a classifier without a declared confusion matrix (the real case); the SIMULATED one is set where it matters
CFG = analysis_config(n_boot=200, ci_level=0.95, classifier={"backend": "tiny", "model_id": "tiny-open-clip"})


def confusion_mapping(M: np.ndarray) -> dict[str, dict[str, float]]:
    """A G×G array as the nested `classify.vlm.sim_confusion` mapping."""
    return {t: {c: float(M[i, j]) for j, c in enumerate(GROUPS)} for i, t in enumerate(GROUPS)}


def write_ratings(root: Path, labels: pd.DataFrame, n: int = 300, seed: int = 0) -> None:
    """The reliability stage's ratings.csv (its own ratings_table) for n of the labelled images: two
    raters who agree with the (perfect) classifier, so M is the identity (its smoothing prior sits on the diagonal)."""
    from biasaudit import contracts as C
    from biasaudit.t2i import reliability as rel

    sample = labels.sample(n=min(n, len(labels)), random_state=seed).set_index("image_id")
    ratings = pd.DataFrame({"rater1": sample["label"], "rater2": sample["label"], rel.CLASSIFIER: sample["label"]})
    out = root / C.RELIABILITY_DIR
    out.mkdir(parents=True, exist_ok=True)
    rel.ratings_table(ratings).to_csv(out / "ratings.csv", index=False)


def synthetic(n_per_prompt=400, seed=0, lose_dark=False, root: Path | None = None):
    """Six prompts in two categories; a perfect classifier; faces measured at exactly the planted L*.
    With `root`, also the reliability stage's ratings there (the corrected rows need them)."""
    rng = np.random.default_rng(seed)
    bench = np.array([[0.6, 0.3, 0.05, 0.03, 0.02], [0.2, 0.7, 0.04, 0.04, 0.02], [0.1, 0.1, 0.6, 0.1, 0.1],
                      [0.8, 0.1, 0.04, 0.04, 0.02], [0.3, 0.5, 0.1, 0.05, 0.05], [0.05, 0.05, 0.1, 0.7, 0.1]])
    ids = [f"p{i}" for i in range(len(bench))]
    prompts = pd.DataFrame({"prompt_id": ids, "category": ["occupation"] * 3 + ["surname"] * 3, "instance": ids,
                            "selected_for": "white", **{g: bench[:, j] for j, g in enumerate(GROUPS)}})
    P = planted_distribution(bench, {"black": 0.5}, "white", GROUPS)
    L_mean = {"white": 66.0, "black": 34.0, "asian": 62.0, "hispanic": 52.0, "other": 48.0}
    man, lab, faces = [], [], []
    for pid, p in zip(ids, P):
        for k in range(n_per_prompt):
            g = GROUPS[rng.choice(5, p=p)]
            L = float(rng.normal(L_mean[g], 4.0))
            iid = f"m-{pid}-{k}"
            man.append({"image_id": iid, "model": "m", "prompt_id": pid, "status": "ok", "planted_label": g,
                        "planted_L": L, "planted_hue": 58.0,
                        "extra": json.dumps({"planted_shares": list(p), "planted_C": 15.0})})
            lab.append({"image_id": iid, "model": "m", "prompt_id": pid, "label": g, "status": "ok"})
            lost = lose_dark and L < 40
            faces.append({"image_id": iid, "model": "m", "prompt_id": pid, "n_faces": 0 if lost else 1,
                          "status": "no_face" if lost else "ok", "L": np.nan if lost else L,
                          "a": 15 * np.cos(np.radians(58)), "b": 15 * np.sin(np.radians(58)), "C": 15.0, "h": 58.0,
                          "face_backend": "dlib-hog", "cross_detector": "dlib-cnn", "cross_n_faces": 1,
                          "cross_L": L if lost else np.nan})
    labels = pd.DataFrame(lab)
    if root is not None:
        write_ratings(root, labels)
    return Inputs(prompts, pd.DataFrame(man), labels, pd.DataFrame(faces), root=root or Path("/nonexistent"), groups=GROUPS), P, bench


def test_validation_recovers_planted_values_with_a_perfect_instrument(tmp_path):
    inputs, P, bench = synthetic(root=tmp_path)
    res = va.compute(inputs, CFG)
    t = res.tables["validation"].set_index(["quantity", "category_or_group"])
    assert list(res.tables["validation"].columns) == va.COLUMNS
    # planted values from the definition (brute force over the declared shares)
    np.testing.assert_allclose(t.loc[("mean_tvd", "occupation"), "planted"], tvd(P[:3], bench[:3]).mean())
    np.testing.assert_allclose(t.loc[("mean_tvd", "all"), "planted"], tvd(P, bench).mean())
    np.testing.assert_allclose(t.loc[("debiased_mean_tvd", "all"), "planted"], tvd(P, bench).mean())
    np.testing.assert_allclose(t.loc[("mean_deviation", "all/black"), "planted"], (P[:, 1] - bench[:, 1]).mean())
    for cat in ("occupation", "surname", "all"):  # 400 images per prompt: plug-in bias is small
        assert t.loc[("mean_tvd", cat), "covered"], cat
        assert t.loc[("pooled_tvd", cat), "covered"], cat
        row = t.loc[("debiased_mean_tvd", cat)]
        assert row["covered"] and row["check"], cat
        assert row["estimate"] == pytest.approx(row["planted"], abs=0.02), cat
        dev = t.loc[("mean_deviation", f"{cat}/black")]  # its coverage rate: tests/test_debiased_tvd.py
        assert dev["check"] and dev["estimate"] == pytest.approx(dev["planted"], abs=0.03), cat
    assert not t.loc[("mean_tvd", "all"), "check"] and t.loc[("mean_tvd_expected_at_n", "all"), "check"] \
        if ("mean_tvd_expected_at_n", "all") in t.index else not t.loc[("mean_tvd", "all"), "check"]
    assert res.metrics["checks"] == int(res.tables["validation"]["check"].sum())
    # faces measured at the planted L*: the estimate equals the planted mean exactly
    for g in ("white", "black"):
        assert t.loc[("mean_L", g), "estimate"] == pytest.approx(t.loc[("mean_L", g), "planted"])
    assert t.loc[("dark_share_black", "L*<40"), "estimate"] == pytest.approx(t.loc[("dark_share_black", "L*<40"), "planted"])
    assert res.metrics["mean_L_within_tolerance_for_L_ge_30"] is True


def test_validation_shows_the_lean_when_dark_faces_are_lost():
    inputs, _, _ = synthetic(n_per_prompt=60, lose_dark=True)
    t = va.compute(inputs, CFG).tables["validation"].set_index(["quantity", "category_or_group"])
    black = t.loc[("mean_L", "black")]
    assert black["estimate"] > black["planted"] + 3 and "OUTSIDE" in black["note"]


def test_face_loss_flags_lost_dark_faces_by_bin_and_label():
    inputs, _, _ = synthetic(n_per_prompt=60, lose_dark=True)
    res = face_loss.compute(inputs, analysis_config(n_boot=200, face_loss_threshold=0.10))
    loss = res.tables["face_loss"].set_index(["by", "group"])
    f = inputs.faces.merge(inputs.manifests[["image_id", "planted_L", "planted_label"]], on="image_id")
    dark = f[f["planted_L"] < 40]
    assert loss.loc[("L_bin", "<40"), "n_images"] == len(dark)
    assert loss.loc[("L_bin", "<40"), "no_face_rate"] == pytest.approx(1.0) and loss.loc[("L_bin", "<40"), "flagged"]
    assert not loss.loc[("L_bin", "[55,70)"), "flagged"]
    black = f[f["planted_label"] == "black"]
    assert loss.loc[("label", "black"), "no_face_rate"] == pytest.approx((black["n_faces"] == 0).mean())
    cross = res.tables["cross_detector"].set_index(["by", "group"])
    assert cross.loc[("L_bin", "<40"), "cross_only"] == len(dark)  # the second detector found every lost face
    assert any("FLAG" in n for n in res.notes)


def test_sections_without_planted_images_say_so():
    inputs, _, _ = synthetic(n_per_prompt=5)
    inputs.manifests = inputs.manifests.drop(columns=["planted_label"])
    assert va.compute(inputs, CFG).status == "no data"
    empty = Inputs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), root=Path("."), groups=GROUPS)
    assert face_loss.compute(empty, CFG).status == "no data"


@pytest.mark.slow
def test_expected_raw_tvd_row_is_the_brute_force_mean_through_the_declared_confusion():
    """The `mean_tvd_expected_at_n` planted value is E[TVD] when each image's label is drawn from the
    planted p and then reported through M[true, said]: checked against a two-step Monte Carlo draw."""
    inputs, P, bench = synthetic(n_per_prompt=8, seed=3)
    rng = np.random.default_rng(7)
    M = np.full((5, 5), 0.05) + np.diag([0.75] * 5)
    M[3] = [0.3, 0.0, 0.2, 0.5, 0.0]  # hispanic confused with white and asian, as in the paper
    M = M / M.sum(axis=1, keepdims=True)
    table = va.compute(inputs, analysis_config(n_boot=200, classifier={"backend": "simulated",
                                                                        "sim_confusion": confusion_mapping(M)})).tables["validation"]
    rows = table[table["quantity"] == "mean_tvd_expected_at_n"].set_index("category_or_group")
    reps = 20000
    for cat, idx in (("occupation", [0, 1, 2]), ("surname", [3, 4, 5])):
        tv = []
        for i in idx:
            true = np.array([rng.choice(5, size=8, p=P[i]) for _ in range(reps)])
            said = (rng.random((reps, 8, 1)) > np.cumsum(M[true], axis=2)).sum(axis=2)
            shares = np.stack([(said == g).mean(axis=1) for g in range(5)], axis=1)
            tv.append(0.5 * np.abs(shares - bench[i]).sum(axis=1))
        mc = np.mean(tv, axis=0)
        assert rows.loc[cat, "planted"] == pytest.approx(mc.mean(), abs=4 * mc.std() / np.sqrt(reps))
    # without a declared confusion (a real classifier) the row is absent
    assert "mean_tvd_expected_at_n" not in set(va.compute(inputs, CFG).tables["validation"]["quantity"])
