"""Method A analysis on hand-made inputs (values computed by hand) and on the SYNTHETIC fixture tree."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.contracts import GROUPS, L_BIN_LABELS
from biasaudit.pipeline.outputs import NO_DATA, OK, OutputWriter
from biasaudit.stats.regression import ols_cluster
from biasaudit.t2i.analysis import (
    ELSEWHERE,
    SECTIONS,
    calibration,
    corrected,
    homogeneity,
    reliability,
    representation,
    skin,
)
from biasaudit.t2i.analysis.inputs import PLOTS, Boot, Inputs, load_inputs, stage_counts
from biasaudit.t2i.analysis.representation import deviation_summary, per_prompt_table, threshold_analysis, tvd_summary
from biasaudit.t2i.analysis.skin import (
    LABEL_ADJUSTED,
    SEED_SUBSET,
    dark_share,
    earnings_regression,
    labels_by_L_bin,
    skin_table,
    women_share_regression,
)

from .fixtures_t2i import MODELS, analysis_config, write_tree

CFG = analysis_config(n_boot=100)
BOOT = Boot.of(CFG)


def _prompts():
    return pd.DataFrame([
        {"prompt_id": "p1", "category": "occupation", "instance": "A", "selected_for": "white",
         "white": 0.6, "black": 0.2, "asian": 0.1, "hispanic": 0.1, "other": 0.0, "median_weekly_earnings_usd": 900.0},
        {"prompt_id": "p2", "category": "occupation", "instance": "B", "selected_for": "black",
         "white": 0.2, "black": 0.6, "asian": 0.0, "hispanic": 0.2, "other": 0.0, "median_weekly_earnings_usd": 700.0},
        {"prompt_id": "p3", "category": "surname", "instance": "C", "selected_for": "asian",
         "white": 0.0, "black": 0.0, "asian": 1.0, "hispanic": 0.0, "other": 0.0, "median_weekly_earnings_usd": np.nan},
    ])


def _labels(spec):
    rows = []
    for pid, labels in spec.items():
        rows += [{"image_id": f"m-{pid}-{i:03d}", "model": "m", "prompt_id": pid, "label": lab}
                 for i, lab in enumerate(labels)]
    return pd.DataFrame(rows)


LABELS = _labels({"p1": ["white"] * 4, "p2": ["white", "black", "black", "unknown"],
                  "p3": ["unknown", "unknown"]})


def test_per_prompt_tvd_by_hand():
    pp = per_prompt_table(LABELS, _prompts(), GROUPS).set_index("prompt_id")
    # p1: model (1,0,0,0,0) vs (.6,.2,.1,.1,0) → ½(.4+.2+.1+.1) = 0.4
    assert pp.loc["p1", "tvd"] == pytest.approx(0.4)
    # p2: unknown excluded → (1/3, 2/3, 0, 0, 0) vs (.2,.6,0,.2,0) → ½(2/15 + 1/15 + .2) = 0.2
    assert pp.loc["p2", "tvd"] == pytest.approx(0.2)
    assert (pp.loc["p2", "n"], pp.loc["p2", "n_unknown"]) == (3, 1)
    # p3: every image abstained → no shares, NaN TVD, counted
    assert pp.loc["p3", "n"] == 0 and np.isnan(pp.loc["p3", "tvd"]) and pp.loc["p3", "n_unknown"] == 2


def test_tvd_summary_mean_and_pooled_by_hand():
    s = tvd_summary(per_prompt_table(LABELS, _prompts(), GROUPS), BOOT, GROUPS).set_index("category")
    occ = s.loc["occupation"]
    assert occ["mean_tvd"] == pytest.approx(0.3)
    # pooled: counts (5,2,0,0,0)/7 vs (4·p1 + 3·p2)/7 = (3.0, 2.6, .4, 1.0, 0)/7 → ½(2+.6+.4+1)/7 = 2/7
    assert occ["pooled_tvd"] == pytest.approx(2 / 7)
    assert occ["mean_tvd_low"] <= occ["mean_tvd"] <= occ["mean_tvd_high"]
    assert (occ["n_prompts"], occ["n_images"], occ["n_unknown"]) == (2, 7, 1)
    sur = s.loc["surname"]
    assert sur["n_prompts"] == 0 and sur["n_prompts_all_abstained"] == 1 and np.isnan(sur["mean_tvd"])
    assert s.loc["all", "mean_tvd"] == pytest.approx(0.3)


def test_deviation_and_threshold_by_hand():
    pp = per_prompt_table(LABELS, _prompts(), GROUPS)
    dev = deviation_summary(pp, BOOT, GROUPS).set_index(["category", "race"])
    black = dev.loc[("occupation", "black")]
    assert black["share_below"] == pytest.approx(0.5)  # p1: 0 < .2 ; p2: 2/3 > .6
    assert black["mean_deviation"] == pytest.approx(((0 - 0.2) + (2 / 3 - 0.6)) / 2)
    summary, detail = threshold_analysis(pp, "black", 0.05)
    row = summary.set_index("category").loc["occupation"]
    assert (row["n_prompts_above"], row["n_reaching"]) == (2, 1)
    assert set(detail.loc[detail["reaches"], "prompt_id"]) == {"p2"}


def test_dark_share_and_earnings_regression():
    rng = np.random.default_rng(0)
    prompts = pd.DataFrame({"prompt_id": [f"o{i}" for i in range(6)], "category": "occupation",
                            "instance": list("abcdef"), "median_weekly_earnings_usd": np.linspace(600, 1600, 6)})
    rows = []
    for _, p in prompts.iterrows():
        for j in range(5):
            rows.append({"image_id": f"m-{p.prompt_id}-{j}", "model": "m", "prompt_id": p.prompt_id, "status": "ok",
                         "L": 30 + 0.5 * (p.median_weekly_earnings_usd / 100) + rng.normal(0, 0.5),
                         "a": 10.0, "b": 15.0})
    faces = pd.DataFrame(rows)
    labels = faces[["image_id"]].assign(label=["black"] * 25 + ["white"] * 5)
    measured = skin_table(faces, labels, prompts, GROUPS)
    assert measured["C"].iloc[0] == pytest.approx(np.hypot(10, 15))
    fit = earnings_regression(measured, "black", 100.0, 0.95).iloc[0]
    assert fit["slope"] == pytest.approx(0.5, abs=0.1) and fit["p_value"] < 0.01 and fit["n_clusters"] == 5
    dark = dark_share(measured, BOOT, analysis_config(dark_L_threshold=36.0).analyze).iloc[0]
    expect = ((measured["L"] < 36) & (measured["label"] == "black")).sum() / (measured["L"] < 36).sum()
    assert dark["share"] == pytest.approx(expect)


def test_skin_against_the_share_of_women_by_hand():
    """L* = 40 + 2 per 10 points of women + noise: the seed row's slope is the least-squares slope of the
    Black-classified occupational faces (numpy's polyfit, the oracle), per 10 points; surname faces, faces of
    another label and faces with no share are left out; the extension row pools the labels with a fixed
    effect per label (oracle: polyfit within labels after removing each label's mean)."""
    rng = np.random.default_rng(1)
    women = np.array([0.1, 0.3, 0.5, 0.7, 0.9, np.nan])
    prompts = pd.DataFrame({"prompt_id": [f"o{i}" for i in range(6)] + ["s0"],
                            "category": ["occupation"] * 6 + ["surname"], "instance": list("abcdefg"),
                            "pct_women": [*women, 0.5]})
    rows = [{"image_id": f"{p}-{j}", "model": "m", "prompt_id": p, "status": "ok", "a": 10.0, "b": 15.0,
             "L": 40 + 2 * np.nan_to_num(w) * 10 + rng.normal(0, 1) + (30 if p == "s0" else 0) + (15 if j >= 6 else 0)}
            for p, w in zip(prompts["prompt_id"], [*women, 0.5]) for j in range(8)]
    faces = pd.DataFrame(rows)
    labels = faces[["image_id"]].assign(label=["white" if int(i.split("-")[1]) >= 6 else "black" for i in faces["image_id"]])
    measured = skin_table(faces, labels, prompts, GROUPS)
    table = women_share_regression(measured, "black", 0.95).set_index("subset")
    fit = table.loc[SEED_SUBSET]
    occ = measured[(measured["category"] == "occupation") & measured["pct_women"].notna()]
    used = occ[occ["label"] == "black"]
    slope = np.polyfit(used["pct_women"] * 10, used["L"], 1)[0]
    assert fit["faces"] == 30 and fit["n_clusters"] == 5 and fit["group"] == "black"
    assert fit["slope"] == pytest.approx(slope) and fit["ci_low"] < 2 < fit["ci_high"]
    ext = table.loc[LABEL_ADJUSTED]
    within = occ.assign(y=occ["L"] - occ.groupby("label")["L"].transform("mean"),
                        x=occ["pct_women"] * 10 - occ.groupby("label")["pct_women"].transform("mean") * 10)
    assert ext["faces"] == 40 and ext["slope"] == pytest.approx(np.polyfit(within["x"], within["y"], 1)[0])


def test_the_women_share_readers_hold_their_size_where_only_the_label_mix_moves():
    """A simulated world (#44): L* depends only on the race label (Black 40, White 65, plus a prompt effect and
    noise), and only the label mix moves with the share of women (P(Black) = 0.1 + 0.6 × share). The pooled
    regression without the label (the old reader) finds a slope in every run (200 of 200 at this seed); the
    seed's subset and the label-adjusted extension hold their size: 16 and 17 of 200 at this seed (8%: CR1
    errors over 40 prompts of unequal Black counts over-reject a little), bounded here at 20 (10%) where the
    pooled regression is at ≥ 190."""
    rng = np.random.default_rng(44)
    runs, n_prompts, per_prompt = 200, 40, 20
    rejected = {"pooled, unadjusted": 0, SEED_SUBSET: 0, LABEL_ADJUSTED: 0}
    for _ in range(runs):
        w = rng.uniform(0.05, 0.95, n_prompts)
        pid = np.repeat([f"o{i}" for i in range(n_prompts)], per_prompt)
        share = np.repeat(w, per_prompt)
        black = rng.random(len(pid)) < 0.1 + 0.6 * share
        L = np.where(black, 40.0, 65.0) + np.repeat(rng.normal(0, 2, n_prompts), per_prompt) + rng.normal(0, 5, len(pid))
        skin = pd.DataFrame({"model": "flux-schnell", "prompt_id": pid, "category": "occupation", "pct_women": share,
                             "L": L, "label": np.where(black, "black", "white")})
        pooled = ols_cluster(skin["L"], skin["pct_women"] / 0.1, skin["prompt_id"])
        rejected["pooled, unadjusted"] += pooled.p_value < 0.05
        for r in women_share_regression(skin, "black", 0.95).itertuples():
            rejected[r.subset] += r.p_value < 0.05
    assert rejected["pooled, unadjusted"] >= 190, rejected
    assert rejected[SEED_SUBSET] <= 20 and rejected[LABEL_ADJUSTED] <= 20, rejected


def test_empty_inputs_say_no_data(tmp_path):
    inputs = load_inputs(tmp_path, groups=GROUPS)
    for result in (representation.compute(inputs, CFG), skin.compute(inputs, CFG), homogeneity.compute(inputs, CFG),
                   reliability.compute(inputs, CFG), corrected.compute(inputs, CFG)):
        assert result.status == NO_DATA and result.reason, result.name


def test_faces_without_any_face_say_no_data_with_reasons(tmp_path):
    write_tree(tmp_path)
    for model in MODELS:
        f = tmp_path / f"data/t2i/faces/{model}.parquet"
        df = pd.read_parquet(f).assign(status="skipped", reason="no face", L=np.nan, n_faces=0)
        df.to_parquet(f)
    res = skin.compute(load_inputs(tmp_path, groups=GROUPS), CFG)
    assert res.status == NO_DATA and "no face" in res.reason


@pytest.mark.slow
def test_full_run_on_synthetic_tree_writes_every_output(tmp_path):
    write_tree(tmp_path)
    inputs = load_inputs(tmp_path, groups=GROUPS)
    assert inputs.models == list(MODELS)
    writer = OutputWriter(tmp_path / "reports/t2i", dpi=60)
    results = [representation.compute(inputs, CFG), skin.compute(inputs, CFG),
               homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=50, min_group_size=5)),
               reliability.compute(inputs, CFG), corrected.compute(inputs, CFG)]
    for r in results:
        assert r.status == OK, (r.name, r.reason)
        writer.add(r)
    writer.finish(PLOTS, profile="offline", stand_in=True)
    out = tmp_path / "reports/t2i"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stand_in"] is True and set(metrics["sections"]) == {r.name for r in results}
    assert metrics["representation"]["tvd"]["synth-a/all"]["mean"] > 0
    for name in ("figure2_shares", "tvd_by_category", "skin_L_by_label", "homogeneity_gap_heatmap"):
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{name}.{ext}").stat().st_size > 1000
    for name in ("tvd_summary", "tvd_per_prompt", "deviation_by_race", "homogeneity_by_race", "tvd_corrected_summary"):
        assert len(pd.read_csv(out / "tables" / f"{name}.csv")) and (out / "tables" / f"{name}.md").exists()
    for name, cols in PLOTS.items():
        assert list(pd.read_csv(out / "plots" / f"{name}.csv").columns) == cols
    hom = pd.read_csv(out / "tables/homogeneity_by_race.csv")
    assert {"gap_lo", "gap_hi", "p_perm", "small"} <= set(hom.columns) and set(hom["space"]) == {"clip", "face"}


def test_stage_counts_report_failures_abstentions_and_missing_faces(tmp_path):
    write_tree(tmp_path)
    counts = stage_counts(load_inputs(tmp_path, groups=GROUPS)).set_index(["stage", "model"])
    assert counts.loc[("generate", "synth-a"), "status_failed"] == 1
    assert counts.loc[("classify", "synth-a"), "abstentions"] == 1
    assert counts.loc[("faces", "synth-a"), "no_face"] == 7


def _bin_of(L: float) -> str:
    """The paper's bins from their definition: L* < 40, [40, 55), [55, 70), ≥ 70."""
    return "<40" if L < 40 else "[40,55)" if L < 55 else "[55,70)" if L < 70 else "≥70"


def test_similarity_by_L_bin_has_every_bin_the_faces_stage_writes(tmp_path):
    """Regression: the faces stage wrote '40-55'/'55-70' while the analysis grouped by '[40,55)'/'[55,70)',
    so the middle bins of the figure were NaN. The fixture's faces rows come from the producer
    (faces.colour.describe_rgb); every bin with ≥ 2 embedded images must have a finite similarity."""
    write_tree(tmp_path)
    inputs = load_inputs(tmp_path, groups=GROUPS)
    measured = inputs.faces.dropna(subset=["L"])
    assert (measured["L_bin"] == measured["L"].map(_bin_of)).all()
    assert set(measured["L_bin"]) == {"<40", "[40,55)", "[55,70)", "≥70"}  # the fixture spans all four
    res = homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=0, min_group_size=2))
    table = res.tables["homogeneity_by_L_bin"]
    for (model, space), t in table.groupby(["model", "space"]):
        counts = measured[measured["model"] == model]["L_bin"].value_counts()
        expected = {b for b, n in counts.items() if n >= 2}
        got = t.set_index("group").reindex(list(L_BIN_LABELS))["intra"]
        assert np.isfinite(got[list(expected)]).all(), (model, space, got.to_dict())


def test_homogeneity_with_the_prompt_as_the_group_is_the_brute_force_gap(tmp_path):
    """homogeneity_by_prompt: per model and space, each prompt's images against the model's other prompts:
    intra = mean cosine over the prompt's pairs, inter = mean cosine to every other prompt's image (brute force
    from the embeddings the stage reads); homogeneity_overall: every face of the model as one group."""
    from biasaudit.t2i.analysis.inputs import load_embeddings

    write_tree(tmp_path)
    inputs = load_inputs(tmp_path, groups=GROUPS)
    res = homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=0, min_group_size=2))
    table = res.tables["homogeneity_by_prompt"]
    model, space = table[["model", "space"]].iloc[0]
    index, X = load_embeddings(tmp_path, model, space)
    meta = inputs.manifests.drop_duplicates("image_id").set_index("image_id")["prompt_id"]
    prompts = index["image_id"].map(meta).to_numpy()
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    t = table[(table["model"] == model) & (table["space"] == space)].set_index("group")
    assert set(t.index) == set(prompts)
    for p in list(t.index)[:3]:
        a, b = prompts == p, prompts != p
        S = U[a] @ U[a].T
        assert t.loc[p, "intra"] == pytest.approx(S[np.triu_indices(a.sum(), 1)].mean(), abs=1e-6)  # float32 rows
        assert t.loc[p, "inter"] == pytest.approx((U[a] @ U[b].T).mean(), abs=1e-6)
        assert t.loc[p, "gap"] == pytest.approx(t.loc[p, "intra"] - t.loc[p, "inter"])
    # every face of the model as one group: the mean cosine over all its pairs, inside its interval
    o = res.tables["homogeneity_overall"].set_index(["model", "space"]).loc[(model, space)]
    S = U @ U.T
    assert o["n"] == len(U) and o["intra"] == pytest.approx(S[np.triu_indices(len(U), 1)].mean(), abs=1e-6)
    assert o["intra_lo"] <= o["intra"] <= o["intra_hi"]


@pytest.mark.slow
def test_real_faces_measurements_fill_every_L_bin_of_the_analysis(monkeypatch, tmp_path):
    """The producer itself (FaceMeasurer.measure on real faces darkened in linear light into each bin)
    feeds the consumer's grouping: the four bins of the similarity-by-L* table are all finite."""
    import skimage.data

    from biasaudit.faces import detect, segment
    from biasaudit.faces.stage import FaceMeasurer
    from biasaudit.params.faces import Faces
    from biasaudit.stats.homogeneity import homogeneity_table

    monkeypatch.setenv("BIASAUDIT_TINY_DIR", str(tmp_path / "tiny"))
    astro = skimage.data.astronaut()
    face = detect.DlibDetector().detect(astro)[0]
    region = segment.face_region_from_landmarks(astro.shape[:2], detect.landmarks68(astro, face.bbox))
    measurer = FaceMeasurer(Faces(clip_pretrained="tiny", face_embedding="dlib"))
    rows, vectors = [], []
    for k in (0.2, 0.4, 0.7, 1.0):  # linear-light factors landing in <40, [40,55), [55,70), ≥70
        lin = (astro / 255.0) ** 2.2
        img = astro.copy()
        img[region] = np.round(255 * np.clip(lin[region] * k, 0, 1) ** (1 / 2.2))
        for j, variant in enumerate((img, np.ascontiguousarray(img[:, ::-1]))):
            fields, emb, _, _ = measurer.measure(variant)
            assert fields["status"] == "ok" and emb is not None, fields
            rows.append(fields | {"image_id": f"k{k}-{j}", "model": "m", "prompt_id": f"p{k}", "label": "white"})
            vectors.append(emb)
    faces = pd.DataFrame(rows)
    assert list(faces["L_bin"]) == [_bin_of(L) for L in faces["L"]]
    assert set(faces["L_bin"]) == set(L_BIN_LABELS)
    t = homogeneity_table(np.asarray(vectors, np.float32), faces, by="L_bin", n_boot=0, n_perm=0, small_group=2)
    intra = t.set_index("group").reindex(list(L_BIN_LABELS))["intra"]
    assert np.isfinite(intra).all(), intra.to_dict()
    counts = labels_by_L_bin(faces, GROUPS)
    assert sorted(counts["L_bin"]) == sorted(L_BIN_LABELS) and (counts["n_white"] == 2).all()


def test_calibration_section_reads_the_committed_table(tmp_path):

    inputs = Inputs(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), tmp_path, groups=GROUPS)
    assert calibration.compute(inputs, CFG).status == "no data"
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    pd.DataFrame([{"method": "mean_tvd CI", "kind": "coverage", "setting": "50 prompts", "scale": "paper",
                   "nominal": 0.95, "observed": 0.948, "replications": 500, "mc_se": 0.01, "flag": "ok"}]).to_csv(
        tmp_path / "benchmarks/results/calibration.csv", index=False)
    res = calibration.compute(inputs, CFG)
    assert res.status != "no data" and res.tables["calibration"].iloc[0]["observed"] == 0.948


def test_the_very_dark_group_is_the_parameter_not_a_literal():
    faces = pd.DataFrame({"image_id": [f"i{k}" for k in range(6)], "model": "m", "prompt_id": ["p1", "p1", "p2", "p2", "p3", "p3"],
                          "status": "ok", "L": [20.0, 30.0, 35.0, 60.0, 25.0, 70.0], "a": 10.0, "b": 15.0})
    labels = faces[["image_id"]].assign(label=["white", "black", "white", "white", "asian", "black"])
    measured = skin_table(faces, labels, _prompts(), GROUPS)
    for group, expect in (("white", 2 / 4), ("black", 1 / 4), ("asian", 1 / 4), ("other", 0.0)):
        d = dark_share(measured, BOOT, analysis_config(dark_group=group).analyze).iloc[0]
        assert d["group"] == group and d["share"] == pytest.approx(expect), group  # 4 faces below L* 40


def test_an_analysis_parameter_is_stated_in_the_schema_params_yaml_and_the_section_only():
    from .conftest import ROOT

    for key in ("dark_L_threshold", "dark_group"):
        places = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src").rglob("*.py") if key in p.read_text())
        assert places == ["src/biasaudit/params/analysis.py", "src/biasaudit/t2i/analysis/skin.py"], (key, places)
        assert (ROOT / "params.yaml").read_text().count(f"{key}:") == 1
        assert not any(key in p.read_text() for p in (ROOT / "notebooks").glob("*.py")), key
    assert not any("_DEFAULTS" in p.read_text() for p in (ROOT / "src").rglob("*.py"))


def test_the_notebook_runs_the_declared_sections_in_order():
    """benchmarks/bench_analyze.py times analysis.SECTIONS, with analysis.ELSEWHERE computed in a child process
    started first: the notebook must run exactly those, in order, and show each section its own result."""
    text = (Path(__file__).resolve().parents[1] / "notebooks" / "t2i_analyze.py").read_text()
    shown = re.findall(r"^show\((?:(\w+)\.compute\(data, cfg\)|elsewhere\.result\((\w+)\.compute\)), writer\)$", text,
                       flags=re.M)
    assert tuple(here or there for here, there in shown) == SECTIONS
    assert tuple(there for _, there in shown if there) == ELSEWHERE
    steps = ", ".join(f"{name}.compute" for name in ELSEWHERE)
    assert f"elsewhere = Elsewhere(({steps}), data, cfg)" in text
    assert text.index("Elsewhere((") < text.index("show(")


def _faces_homogeneity_cell() -> str:
    """The faces notebook's homogeneity cell, as the stage runs it."""
    from .conftest import ROOT

    cells = (ROOT / "notebooks" / "t2i_faces.py").read_text().split("# %%")
    (cell,) = [c for c in cells if "similarity_by_bin(" in c and not c.lstrip().startswith("[markdown]")]
    return cell


def test_min_group_size_is_the_one_small_group_threshold(tmp_path):
    """analyze.min_group_size decides `small` where it is displayed, in the analysis section: each row is flagged
    exactly when its n is below the configured value, whatever that value (two values that disagree on some
    rows). The faces notebook, which measures, neither reads nor shows it: its tables are the same under any
    value and carry no `small` flag (so changing it re-runs no faces stage, #47)."""
    import inspect

    import biasaudit.stats as stats_pkg
    from biasaudit.stats import homogeneity as H

    rng = np.random.default_rng(0)
    n_a, n_b = 25, 15  # images per prompt; the L* bins split them 28 / 12
    index = pd.DataFrame({"image_id": [f"i{k}" for k in range(n_a + n_b)], "prompt_id": ["p1"] * n_a + ["p2"] * n_b,
                          "clip_row": np.arange(n_a + n_b), "face_row": np.arange(n_a + n_b)})
    faces = pd.DataFrame({"image_id": index["image_id"], "L_bin": ["<40"] * 28 + ["[40,55)"] * 12})
    X = rng.normal(size=(n_a + n_b, 8))
    counts = {"p1": n_a, "p2": n_b, "<40": 28, "[40,55)": 12}
    cell = _faces_homogeneity_cell()
    assert "min_group_size" not in cell
    shown_by_k = {}
    for k in (14, 30):
        shown: list[pd.DataFrame] = []
        namespace = {"cfg": analysis_config(min_group_size=k), "index": index, "faces": faces, "clip": X, "face": X,
                     "emb_meta": {"clip": {"stand_in": True}, "face": {"stand_in": True}}, "display": shown.append,
                     "homogeneity_gap": H.homogeneity_gap, "similarity_by_bin": H.similarity_by_bin}
        exec(cell, namespace)
        assert len(shown) == 4 and not any("small" in t for t in shown)
        assert {g: n for t in shown for g, n in zip(t["group"], t["n"], strict=True)} == counts
        shown_by_k[k] = shown
    for a, b in zip(shown_by_k[14], shown_by_k[30], strict=True):
        pd.testing.assert_frame_equal(a, b)

    write_tree(tmp_path)
    inputs = load_inputs(tmp_path, groups=GROUPS)
    flagged = {}
    for k in (2, 16):  # the fixture's groups hold 1 to 33 images
        tables = homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=0, min_group_size=k)).tables
        t = pd.concat([tables["homogeneity_by_race"], tables["homogeneity_by_L_bin"]], ignore_index=True)
        assert (t["small"] == (t["n"] < k)).all(), k
        flagged[k] = t["small"].to_numpy()
    assert (flagged[2] != flagged[16]).any()

    for mod in [H, *(__import__(f"biasaudit.stats.{m.name}", fromlist=["_"])
                     for m in __import__("pkgutil").iter_modules(stats_pkg.__path__))]:
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            p = inspect.signature(fn).parameters.get("small_group")
            assert p is None or p.default is inspect.Parameter.empty, f"{mod.__name__}.{name} has a default"


def test_the_near_duplicate_threshold_is_the_parameter(tmp_path):
    """analyze.near_duplicate_cosine reaches the test itself, not only its note: a lower threshold flags more
    images, and every row says which threshold it used (regression: a hard-coded 0.95 passed every test)."""
    write_tree(tmp_path)
    inputs = load_inputs(tmp_path, groups=GROUPS)
    rates = {}
    for c in (0.2, 0.999):
        t = homogeneity.compute(inputs, analysis_config(n_boot=100, n_permutations=0, min_group_size=2,
                                                        near_duplicate_cosine=c)).tables["homogeneity_by_race"]
        assert (t["near_dup_cosine"] == c).all()
        rates[c] = t["n_near_dup"].sum()
    assert rates[0.2] > rates[0.999]


def test_sections_computed_in_a_child_process_give_the_values_computed_here(tmp_path):
    """outputs.Elsewhere (a forked child, values pickled back): the Results computed here, asked for in any order;
    a failing step raises its own traceback without losing the next, and a step's warnings are warned here."""
    import warnings

    from biasaudit.pipeline.outputs import Elsewhere
    from biasaudit.t2i.analysis import face_loss, gender

    write_tree(tmp_path)
    data = load_inputs(tmp_path, groups=GROUPS)
    cfg = analysis_config(n_boot=100, n_permutations=20, min_group_size=5)

    def broken(inputs, cfg):
        raise ValueError("this step fails")

    def warns(inputs, cfg):
        warnings.warn("said in the child", UserWarning, stacklevel=1)
        return 7

    there = Elsewhere((corrected.compute, broken, gender.compute, warns, face_loss.compute), data, cfg)
    with pytest.warns(UserWarning, match="said in the child"):
        assert there.result(warns) == 7
    with pytest.raises(RuntimeError, match="(?s)broken failed in the child process.*ValueError: this step fails"):
        there.result(broken)
    assert there.result(warns) == 7  # a cell run again reads the value it read the first time
    for step in (gender.compute, face_loss.compute, corrected.compute):
        a, b = step(data, cfg), there.result(step)
        assert (a.name, a.status, a.reason, a.notes, a.figures) == (b.name, b.status, b.reason, b.notes, {})
        assert json.dumps(a.metrics, default=repr) == json.dumps(b.metrics, default=repr)
        assert a.tables.keys() == b.tables.keys() and a.plots.keys() == b.plots.keys()
        for name in a.tables:
            pd.testing.assert_frame_equal(a.tables[name], b.tables[name], check_exact=True)


def test_sections_meant_for_a_child_process_are_computed_here_when_fork_fails(monkeypatch):
    from biasaudit.pipeline import outputs

    def no_fork():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(outputs, "fork_tied", no_fork)
    calls = []

    def step(x):
        calls.append(x)
        return x * 2

    there = outputs.Elsewhere((step,), 21)
    assert there.pid == 0 and calls == []
    assert there.result(step) == 42 and calls == [21]
