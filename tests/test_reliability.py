"""Reliability statistics against textbook values computed by hand, and the error correction."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from biasaudit import GROUPS
from biasaudit.stats.correction import em_correct, lsq_correct, misclassification_matrix
from biasaudit.t2i import reliability as rel

from .conftest import ROOT

FIX = ROOT / "tests" / "fixtures" / "reliability"


def test_cohen_kappa_textbook():
    # Wikipedia's example: 50 items, yes/yes 20, yes/no 5, no/yes 10, no/no 15 → p_o 0.7, p_e 0.5, κ 0.4
    a = np.array(["y"] * 25 + ["n"] * 25)
    b = np.array(["y"] * 20 + ["n"] * 5 + ["y"] * 10 + ["n"] * 15)
    assert rel.cohen_kappa(a, b, ["y", "n"]) == pytest.approx(0.4)


def test_fleiss_kappa_textbook():
    # Fleiss (1971) / Wikipedia: 10 subjects, 14 raters, 5 categories → κ = 0.210
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    ratings = np.array([[c for c, n in zip("abcde", row) for _ in range(n)] for row in table])
    assert rel.fleiss(ratings, list("abcde")) == pytest.approx(0.20993, abs=5e-5)


def test_fixture_sheets_reproduce_hand_computed_kappas():
    wide, problems = rel.read_sheets({"rater1": FIX / "rater1.csv", "rater2": FIX / "rater2.csv"}, GROUPS)
    assert problems.empty
    clf = pd.read_csv(FIX / "classifier.csv").set_index("image_id")["label"].rename(rel.CLASSIFIER)
    ratings = wide.join(clf)
    tables = rel.agreement(ratings, ["rater1", "rater2"], GROUPS, n_boot=50, seed=1)
    k = tables["pairwise_kappa"].set_index(["rater_a", "rater_b"])["cohen_kappa"]
    # rater1 vs rater2: p_o = 8/10; marginals w 4/3, b 3/4, a 2/1, h 1/2 → p_e = 28/100
    assert k["rater1", "rater2"] == pytest.approx((0.8 - 0.28) / (1 - 0.28))
    # rater1 vs classifier: p_o = 7/10; marginals w 4/3, b 3/4, a 2/2, h 1/1 → p_e = 29/100
    assert k["rater1", "classifier"] == pytest.approx((0.7 - 0.29) / (1 - 0.29))
    pair = tables["pairwise_kappa"].iloc[0]
    assert pair["ci_low"] <= pair["cohen_kappa"] <= pair["ci_high"]
    conf = tables["confusion"]
    assert conf.to_numpy().sum() == 20 and conf.loc["white", "white"] == 4  # r1: items 1,2; r2: items 1,2
    dis = tables["disagreements"]
    # hispanic disagreements: r1-r2 item 9 (a/h), r1-clf item 3 (w/h), item 10 (h/w), r2-clf items 3 (w/h),
    # 9 (h/a), 10 (h/w) → 6 in all: 4 against white, 2 against asian
    assert dis.loc["hispanic", "n_disagreements"] == 6
    assert dis.loc["hispanic", "white"] == pytest.approx(4 / 6) and dis.loc["hispanic", "asian"] == pytest.approx(2 / 6)


def test_simulated_raters_follow_their_confusion():
    conf = rel.simulated_confusion(GROUPS, 0.9, {"hispanic": 0.5})
    assert conf.loc["hispanic", "hispanic"] == 0.5 and conf.sum(axis=1).to_numpy() == pytest.approx(1.0)
    clf = pd.Series(["white"] * 4000 + ["hispanic"] * 4000)
    sim = rel.simulate_raters(clf, conf, ["r"], seed=3)["r"]
    assert (sim[:4000] == "white").mean() == pytest.approx(0.9, abs=0.02)
    assert (sim[4000:] == "hispanic").mean() == pytest.approx(0.5, abs=0.03)


def test_correction_recovers_true_shares():
    M = np.array([[0.8, 0.2, 0.0], [0.1, 0.7, 0.2], [0.0, 0.3, 0.7]])
    p = np.array([0.5, 0.3, 0.2])
    q = M.T @ p  # expected classifier shares
    assert lsq_correct(q, M)[0] == pytest.approx(p, abs=1e-6)
    assert em_correct(q * 1000, M)[0] == pytest.approx(p, abs=1e-5)
    assert lsq_correct(q, np.eye(3))[0] == pytest.approx(q)  # a perfect classifier changes nothing


def test_em_two_class_by_hand():
    # M = [[.9,.1],[.2,.8]], observed 60/40 → solve .9p + .2(1-p) = .6 → p = 4/7 (inside the simplex: MLE)
    M = np.array([[0.9, 0.1], [0.2, 0.8]])
    assert em_correct(np.array([60.0, 40.0]), M)[0, 0] == pytest.approx(4 / 7, abs=1e-6)


def test_misclassification_matrix_rows_sum_to_one():
    M = misclassification_matrix(np.array(["a", "a", "b"]), np.array(["a", "b", "b"]), ("a", "b", "c"), prior=0.0 + 1e-9)
    assert M.sum(axis=1) == pytest.approx(1.0) and M[0, 0] == pytest.approx(0.5)
