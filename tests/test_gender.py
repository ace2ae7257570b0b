"""Apparent gender as a second dimension of Method A: the benchmark (BLS Table 11's share of women, parity where
none), the per-prompt table by hand, the planted distortion and the SIMULATED classifier's declared confusion,
and the validation section recovering each planted generator's gender distortion inside its interval."""

import json

import numpy as np
import pandas as pd
import pytest

from biasaudit import groupsets
from biasaudit.backends.generators.planted import draw_gender
from biasaudit.backends.vlm import make_vlm_backend
from biasaudit.t2i.analysis import gender, validation
from biasaudit.t2i.analysis.inputs import Boot, Inputs

from .fixtures_t2i import analysis_config

GENDERS = ("woman", "man")


def test_the_gender_set_is_a_group_set_of_its_own():
    gs = groupsets.active("us-gender")
    assert gs.labels == GENDERS
    cfg = analysis_config()
    assert cfg.genders == GENDERS and cfg.groups != GENDERS


def test_benchmark_is_bls_share_of_women_else_parity():
    prompts = pd.DataFrame({"prompt_id": ["o1", "o2", "g1"], "pct_women": [0.9, 0.25, np.nan]})
    b = gender.gender_benchmark(prompts, GENDERS).set_index("prompt_id")
    assert b.loc["o1", "bench_woman"] == pytest.approx(0.9) and b.loc["o1", "bench_man"] == pytest.approx(0.1)
    assert b.loc["o2", "bench_woman"] == pytest.approx(0.25)
    assert b.loc["g1", "bench_woman"] == 0.5 and b.loc["g1", "benchmark"] == gender.PARITY
    assert b.loc["o1", "benchmark"] == gender.BLS


def test_per_prompt_table_by_hand():
    prompts = pd.DataFrame({"prompt_id": ["o1", "g1"], "category": ["occupation", "geography"],
                            "instance": ["Nurses", "X County"], "pct_women": [0.8, np.nan]})
    labels = pd.DataFrame({"model": "m", "prompt_id": ["o1"] * 5 + ["g1"] * 4, "label": "white",
                           "gender": ["woman", "man", "man", "man", "unknown", "woman", "woman", "woman", "man"]})
    pp = gender.per_prompt_table(labels, prompts, GENDERS).set_index("prompt_id")
    o1 = pp.loc["o1"]
    assert (o1["n"], o1["n_unknown"], o1["n_woman"]) == (4, 1, 1)
    assert o1["tvd"] == pytest.approx(abs(0.25 - 0.8))  # two groups: TVD = |share_woman − bench_woman|
    assert o1["deviation_woman"] == pytest.approx(0.25 - 0.8)
    assert pp.loc["g1", "tvd"] == pytest.approx(0.25) and pp.loc["g1", "benchmark"] == gender.PARITY
    joint = gender.intersection_table(labels, prompts, ("white", "black"), GENDERS, Boot.of(analysis_config()))
    row = joint.set_index("category").loc["all"]
    # 8 images with both labels: white×woman 4, white×man 4 → shares (.5, .5, 0, 0) vs parity .25 each
    assert row["tvd_from_parity"] == pytest.approx(0.5) and row["reference"] == gender.NO_JOINT


def _planted_inputs(cfg, tmp_path, per_prompt=60):
    """Planted gender draws (the generator's own draw_gender) for both planted generators of params.yaml, answered
    by the SIMULATED classifier's gender question, on 12 occupations with BLS-like shares of women."""
    women = np.linspace(0.08, 0.92, 12)
    prompts = pd.DataFrame({"prompt_id": [f"occ{i}" for i in range(12)], "category": "occupation",
                            "instance": [f"Job {i}" for i in range(12)], "pct_women": women})
    clf = make_vlm_backend(cfg.classify.vlm, cfg.genders, "gender")
    man, lab = [], []
    for model in ("planted-a", "planted-b"):
        spec = cfg.models[model].planted
        for pid, w in zip(prompts["prompt_id"], women):
            for k in range(per_prompt):
                iid = f"{model}-{pid}-{k}"
                g, p = draw_gender(hash((model, pid, k)) % 2**31, np.array([w, 1 - w]), spec, cfg.genders)
                man.append({"image_id": iid, "model": model, "prompt_id": pid, "status": "ok", "planted_gender": g,
                            "extra": json.dumps({"planted_gender_shares": list(p)})})
                lab.append({"image_id": iid, "model": model, "prompt_id": pid, "label": "white",
                            "gender": clf.answer(iid, g), "status": "ok"})
    return Inputs(prompts, pd.DataFrame(man), pd.DataFrame(lab), pd.DataFrame(), root=tmp_path, groups=cfg.groups), \
        women


def test_planted_distortion_is_the_declared_one_and_the_classifier_follows_its_confusion(tmp_path):
    cfg = analysis_config()
    a, b = cfg.models["planted-a"].planted, cfg.models["planted-b"].planted
    assert dict(a.gender_scale) == {"woman": 0.5} and a.gender_receiver == "man"
    _, p = draw_gender(1, np.array([0.6, 0.4]), a, GENDERS)
    assert p == pytest.approx([0.3, 0.7])  # women × 0.5, men + the difference
    _, p = draw_gender(1, np.array([0.6, 0.4]), b, GENDERS)
    assert p == pytest.approx([0.6 + 0.4 * 0.4, 0.4 * 0.6])  # men × 0.6, women + the difference
    inputs, _ = _planted_inputs(cfg, tmp_path)
    said = pd.crosstab(inputs.manifests["planted_gender"], inputs.labels["gender"], normalize="index")
    M = cfg.classify.vlm.sim_gender_confusion
    for t in GENDERS:
        for c in GENDERS:
            assert said.loc[t, c] == pytest.approx(M[t][c], abs=0.03)
    # the race answers of the same images are not drawn from the gender stream
    race = make_vlm_backend(cfg.classify.vlm, cfg.groups)
    assert race.M.shape == (len(cfg.groups),) * 2


def test_validation_recovers_each_planted_gender_distortion(tmp_path):
    cfg = analysis_config(n_boot=400)
    inputs, women = _planted_inputs(cfg, tmp_path)
    table = validation.compute(inputs, cfg).tables["validation"]
    rows = table[table["category_or_group"] == "gender/occupation"].set_index(["model", "quantity"])
    for model, sign in (("planted-a", -1), ("planted-b", 1)):
        dev = rows.loc[(model, "gender_mean_deviation_woman")]
        # planted by definition: planted-a women × 0.5 → mean(−0.5·w); planted-b men × 0.6 → women + 0.4·(1 − w)
        expected = np.mean(-0.5 * women) if model == "planted-a" else np.mean(0.4 * (1 - women))
        assert dev["planted"] == pytest.approx(expected, abs=1e-6)
        assert dev["low"] <= dev["planted"] <= dev["high"] and dev["informative"] and dev["check"]
        assert np.sign(dev["estimate"]) == sign and dev["excludes_null"]
        t = rows.loc[(model, "gender_debiased_mean_tvd")]
        assert t["planted"] == pytest.approx(abs(expected), abs=1e-6)  # two groups: TVD = |deviation|, one sign
        assert t["low"] <= t["planted"] <= t["high"] and t["informative"]


def test_gender_section_reports_tvd_and_says_where_parity_is_the_only_reference(tmp_path):
    cfg = analysis_config()
    inputs, _ = _planted_inputs(cfg, tmp_path, per_prompt=20)
    res = gender.compute(inputs, cfg)
    summary = res.tables["gender_summary"].set_index(["model", "category"])
    assert {("planted-a", "occupation"), ("planted-b", "all")} <= set(summary.index)
    assert summary.loc[("planted-a", "occupation"), "benchmark"] == gender.BLS
    assert np.isfinite(summary.loc[("planted-a", "occupation"), "tvd_corrected"])
    assert any(gender.NO_JOINT in n for n in res.notes)
    assert "planted-a/occupation" in res.metrics["gender_tvd"]


def test_without_a_gender_set_or_a_gender_column_the_section_says_no_data(tmp_path):
    cfg = analysis_config()
    inputs, _ = _planted_inputs(cfg, tmp_path, per_prompt=2)
    no_col = Inputs(inputs.prompts, inputs.manifests, inputs.labels.drop(columns="gender"), pd.DataFrame(),
                    root=tmp_path, groups=cfg.groups)
    assert gender.compute(no_col, cfg).status == "no data"
