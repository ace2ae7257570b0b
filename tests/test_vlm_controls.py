"""Method B's answer controls: the null edit (what editing alone does) and the placebo tasks (group effects
that must be null), from the edit items to the `controls` analysis section.

Oracles: counts from the design (10 groups + null edit + original per photo), closed forms and quadrature of
the declared planted model written out here (not the package's estimands), hand-made answer tables."""

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import integrate
from scipy.special import expit
from scipy.stats import norm

from biasaudit.params.vlm import PlantedReflect, Reflect
from biasaudit.vlm import focus, tasks
from biasaudit.vlm import planted as P
from biasaudit.vlm.analysis import controls, gaps, significance, two_afc
from biasaudit.vlm.analysis.inputs import retention_table
from biasaudit.vlm.groups import GROUP_CODES, NULL_EDIT, ORIGINAL

from .fixtures_vlm import WITH_INCOME, answers, config

OCC = ("cook", "doctor", "lawyer", "nurse", "teacher", "ceo")


def units(G):
    return pd.DataFrame({"unit": [f"u{i:02d}" for i in range(G)], "occupation": [OCC[i % 6] for i in range(G)]})


def photos(tmp_path, n_ok=2):
    rows = []
    for i in range(n_ok + 1):
        path = tmp_path / "src" / "doctor" / f"p{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(path)
        rows.append({"occupation": "doctor", "base_id": f"p{i}", "path": str(path),
                     "status": "ok" if i < n_ok else "rejected"})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------ edit items

def test_null_edit_items_are_built_per_accepted_photo_and_keep_the_group_edits_hashes(tmp_path):
    srcs = photos(tmp_path)
    races, genders = ["Asian", "Black", "Latino", "MiddleEastern", "White"], ["man", "woman"]
    plain = focus.edit_items(srcs, races, genders)
    items = focus.edit_items(srcs, races, genders, null_edit=True)
    assert len(plain) == 2 * 10 and len(items) == 2 * 12  # the rejected photo gets nothing
    by_arm = pd.DataFrame(items).groupby(["base_id", "arm"]).size().unstack()
    assert by_arm.loc[["p0", "p1"], ["counterfactual", NULL_EDIT, ORIGINAL]].values.tolist() == [[10, 1, 1]] * 2
    controls_ = [i for i in items if i["arm"] != "counterfactual"]
    assert {i["group"] for i in controls_} == {NULL_EDIT, ORIGINAL} and all(i["race"] is None for i in controls_)
    assert not {i["group"] for i in controls_} & set(GROUP_CODES)
    # a resumed stage keeps the group edits: their content is what it was before the controls existed
    old = {i["edit_id"]: focus.edit_content({k: v for k, v in i.items() if k != "arm"}) for i in plain}
    assert all(focus.edit_content(i) == old[i["edit_id"]] for i in items if i["edit_id"] in old)
    contents = [repr(focus.edit_content(i)) for i in items]
    assert len(set(contents)) == len(contents)


@pytest.mark.slow
def test_the_tiny_null_edit_is_near_identity_and_the_original_is_copied_byte_for_byte(tmp_path):
    from skimage import data

    from biasaudit.backends.editors import make_editor
    from biasaudit.params.vlm import Counterfactuals, ValidateEdits
    from biasaudit.pipeline.provenance import sha256_file

    src = tmp_path / "src" / "doctor" / "astro.png"
    src.parent.mkdir(parents=True)
    Image.fromarray(data.astronaut()).save(src)
    srcs = pd.DataFrame([{"occupation": "doctor", "base_id": "astro", "path": str(src), "status": "ok"}])
    params = Counterfactuals(races=["Black"], genders=["woman"], null_edit=True)
    fn = focus.make_edit_batch_fn(make_editor(params), params, ValidateEdits(), tmp_path / "focus")
    rows = pd.DataFrame(fn(focus.edit_items(srcs, params.races, params.genders, params.null_edit))).set_index("arm")
    assert (rows["status"] == "ok").all()
    assert rows.loc[ORIGINAL, "sha256"] == sha256_file(src)
    # the group edit changes the face visibly, the null edit (own colour, no texture) far less
    assert rows.loc[NULL_EDIT, "px_delta_e_inside"] < 0.5 * rows.loc["counterfactual", "px_delta_e_inside"]
    assert rows.loc[NULL_EDIT, "attempt"] == 1  # passes the pixel checks without the face-change check
    found, problems = focus.scan_focus(tmp_path / "focus")
    assert not problems and sorted(found["arm"]) == sorted(["counterfactual", NULL_EDIT, ORIGINAL])


def test_reflect_items_ask_the_controls_apart_from_the_group_questions():
    rows = [{"occupation": "cook", "base_id": f"b{u}", "race": r, "gender": g, "path": f"/x/{u}/{r}_{g}.jpg",
             "arm": "counterfactual"} for u in range(2) for r in ("Black", "White") for g in ("man", "woman")]
    rows += [{"occupation": "cook", "base_id": f"b{u}", "race": None, "gender": None, "path": f"/x/{u}/{a}.jpg",
              "arm": a} for u in range(2) for a in (NULL_EDIT, ORIGINAL)]
    params = Reflect(tasks=["2afc_income", "2afc_safety", "mcq", "salary", "2afc_placebo_background"])
    items = pd.DataFrame(tasks.build_items(pd.DataFrame(rows), params))
    assert items["item_id"].is_unique
    real = items[(items["arm"] == "counterfactual") & items["placebo"].ne(True)]
    # 4 variants per photo: 6 pairs × 2 orders × 2 tasks; 4 × (2 MCQ + salary)
    assert (real["kind"] == "2afc").sum() == 2 * 6 * 2 * 2 and (real["kind"] != "2afc").sum() == 2 * 4 * 3
    assert set(real["group_a"].dropna()) | set(real["group"].dropna()) <= set(GROUP_CODES)
    placebo = items[items["placebo"].eq(True)]
    assert (placebo["kind"] == "2afc").sum() == 2 * 6 * 2 and (placebo["kind"] == "mcq").sum() == 2 * 4
    assert set(placebo["options"].map(tuple)) == {("A", "B"), ("A", "B", "C")}
    ctl = items[items["arm"].isin([NULL_EDIT, ORIGINAL])]
    pairs = ctl[ctl["kind"] == "2afc"]
    assert len(pairs) == 2 * 2 * 2  # photos × tasks × orders
    assert (pairs.loc[pairs["order"] == 0, "group_a"] == NULL_EDIT).all()
    assert (pairs.loc[pairs["order"] == 1, "group_a"] == ORIGINAL).all()
    assert len(ctl[ctl["kind"] != "2afc"]) == 2 * 2 * 3  # photos × images × (2 MCQ + salary)


# ------------------------------------------------------------------------------------ the analysis

def test_control_and_placebo_rows_never_enter_the_group_tables():
    pl = PlantedReflect()
    u = units(12)
    main = P.simulate_responses(pl, u, np.random.default_rng(1), WITH_INCOME)
    cfg = config(n_boot=200, n_permutations=99, wild_bootstrap=0)
    # rows that would move every group table if they were read there: a placebo task under a real task's
    # name answering 'A' always, and control answers at the extremes of each scale
    poison = main.copy()
    poison["placebo"] = True
    poison.loc[poison["kind"] == "2afc", "choice"] = "A"
    poison.loc[poison["kind"] == "mcq", "choice"] = "A"
    poison.loc[poison["kind"] == "salary", "value_usd"] = 10_000_000.0
    ctl = poison.assign(arm=NULL_EDIT, placebo=False, race="White", gender="woman")
    full = pd.concat([main, poison, ctl], ignore_index=True)

    def tables(df):
        a = answers(df)
        g, s, t = gaps.estimates(a, cfg), significance.estimates(a, cfg), two_afc.estimates(a, cfg)
        return g["delta_g"], g["mean_gaps"], s["ols"], t["income"]["winrate"], retention_table(a.responses)

    for clean, mixed in zip(tables(main), tables(full)):
        pd.testing.assert_frame_equal(clean.reset_index(drop=True), mixed.reset_index(drop=True))
    a = answers(full)
    assert len(a.placebo) == len(poison) and len(a.controls) == len(ctl)


def share_edit_oracle(pl):
    """½[E σ(α + a + √2σZ) + 1 − E σ(α − a + √2σZ)] by adaptive quadrature."""
    tw, a = pl.two_afc, pl.edit_artifact.two_afc
    sd = np.sqrt(2) * tw.photo_sd

    def p(mu):
        return integrate.quad(lambda z: expit(mu + sd * z) * norm.pdf(z), -12, 12)[0]

    return (p(tw.position + a) + 1 - p(tw.position - a)) / 2


def mcq_delta_oracle(pl, task, values):
    """100 · (E value | shift a) / (E value | shift 0) − 100 under the ordered logit with a photo effect."""
    cum = np.cumsum(pl.mcq.base[task])[:-1]
    cuts = np.log(cum / (1 - cum))
    v = np.array([values[k] for k in "ABCDEF"[:len(cuts) + 1]])

    def mean(shift):
        def f(z):
            cdf = np.concatenate([[0.0], expit(cuts - shift - pl.mcq.photo_sd * z), [1.0]])
            return np.diff(cdf) @ v * norm.pdf(z)
        return integrate.quad(f, -12, 12)[0]

    return 100 * (mean(pl.edit_artifact.mcq) / mean(0.0) - 1)


def test_the_planted_edit_artifact_is_recovered_within_its_interval():
    # an MCQ artefact of 1.5 (Δ about 52 % and 9 %): at 0.5 the floor's interval excludes 0 in only about 3 of 4
    # draws of 120 photos, at 1.5 in each of 8 draws tried
    pl = PlantedReflect().model_copy(update={"edit_artifact": PlantedReflect().edit_artifact.model_copy(
        update={"two_afc": 0.8, "mcq": 1.5, "salary": 0.10})})
    cfg = config(n_boot=400, n_permutations=199, wild_bootstrap=0)
    df = P.simulate_responses(pl, units(120), np.random.default_rng(5), WITH_INCOME, controls=True)
    floor = controls.estimates(answers(df, planted=pl), cfg)["floor"].set_index("measure")
    oracle = {"income": share_edit_oracle(pl), "salary_salary": 100 * np.expm1(0.10),
              "mcq_salary": mcq_delta_oracle(pl, "salary", cfg.reflect.task_specs["mcq_salary"].values),
              "mcq_education": mcq_delta_oracle(pl, "education", cfg.reflect.task_specs["mcq_education"].values)}
    for measure, truth in oracle.items():
        r = floor.loc[measure]
        assert r["low"] <= truth <= r["high"], (measure, truth, r["low"], r["high"])
        assert r["planted"] == pytest.approx(truth, rel=1e-6, abs=1e-9), measure  # the section's own estimand
        assert not r["low"] <= r["null"] <= r["high"], measure  # an artefact this size is seen: the test can fail
    # the artefact cancels between two edits: the group tables' estimands are those without it
    none = pl.model_copy(update={"edit_artifact": pl.edit_artifact.model_copy(update={"two_afc": 0.0, "salary": 0.0})})
    with_a = P.estimands(pl, units(12), cfg.reflect_analysis, ("income",), ("salary_salary",))
    without = P.estimands(none, units(12), cfg.reflect_analysis, ("income",), ("salary_salary",))
    pd.testing.assert_frame_equal(with_a["two_afc"]["income"]["winrate"], without["two_afc"]["income"]["winrate"])
    pd.testing.assert_frame_equal(with_a["single"]["salary_salary"]["delta_g"],
                                  without["single"]["salary_salary"]["delta_g"])


def placebo_run(pl, seed=3, photos=24):
    cfg = config(n_boot=400, n_permutations=199, wild_bootstrap=0, min_clusters=12)
    df = P.simulate_responses(pl, units(photos), np.random.default_rng(seed), Reflect(tasks=["2afc_placebo_background", "mcq_placebo_background"]))
    return controls.estimates(answers(df, planted=pl), cfg)


def test_placebo_tasks_are_null_under_the_default_planted_vlm():
    e = placebo_run(PlantedReflect())
    tests = e["placebo_tests"]
    assert set(tests["test"]) == {"bradley_terry", "delta_g (%)"} and len(tests) == 9 + 5
    # the definition: no group effect is declared for a placebo task, so every planted value is 0
    assert np.allclose(tests["planted"], 0.0, atol=1e-9)
    inside = (tests["low"] <= 0) & (0 <= tests["high"])
    assert inside.sum() >= 12, tests  # 95 % intervals: about 0.7 of 14 expected to miss
    assert (e["placebo_verdicts"]["placebo_effect_null"] == "yes").all(), e["placebo_verdicts"]


def test_a_planted_placebo_effect_is_found():
    pl = PlantedReflect()
    strengths = pl.two_afc.strengths | {"placebo_background": {g: (1.0 if g.startswith("W") else 0.0)
                                                               for g in GROUP_CODES}}
    shift = pl.mcq.shift | {"placebo_background": {g: (1.0 if g.startswith("W") else 0.0) for g in GROUP_CODES}}
    pl = pl.model_copy(update={"two_afc": pl.two_afc.model_copy(update={"strengths": strengths}),
                               "mcq": pl.mcq.model_copy(update={"shift": shift})})
    e = placebo_run(pl, photos=48)  # at 24 photos the Δg tests' power against this effect is about one half
    verdict = e["placebo_verdicts"].set_index("test")["placebo_effect_null"]
    assert verdict["bradley_terry"] == "no" and verdict["delta_g (%)"] == "no"
    bt = e["placebo_tests"][e["placebo_tests"]["test"] == "bradley_terry"].set_index("effect")
    # vs the reference WF (strength 1): every non-White group −1, attenuated by the photo effects
    assert -1 < bt.loc["BM", "planted"] < -0.5 and bt.loc["BM", "low"] <= bt.loc["BM", "planted"] <= bt.loc["BM", "high"]
    assert abs(bt.loc["WM", "planted"]) < 1e-9


def test_delta_g_beside_the_floor_follows_the_definition():
    delta_g = pd.DataFrame({"measure": ["m", "m", "m", "n"], "dimension": "race", "level": ["a", "b", "c", "a"],
                            "delta_pct": [10.0, -9.0, 3.0, 5.0], "low": [6.0, -12.0, -1.0, 1.0],
                            "high": [14.0, -5.5, 7.0, 9.0]})
    floor = pd.DataFrame({"kind": ["mcq", "2afc"], "measure": ["m", "n"], "estimate": [1.0, 0.6],
                          "low": [-5.0, 0.5], "high": [4.0, 0.7]})
    out = controls.beyond_floor(delta_g, floor)
    # bound 5: [6, 14] beyond, [−12, −5.5] beyond, [−1, 7] not; measure n has no single-image floor
    assert out["exceeds_floor"].tolist() == [True, True, False, None]
    assert out["exceeds_floor_estimate"].tolist() == [True, True, True, None]
    assert out["floor_reason"].iloc[3] and not out["floor_reason"].iloc[0]
