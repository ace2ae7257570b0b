"""The referee run's planted world (biasaudit/referee.py) and the replication table's referee check.

The planted world is set from data/reference/published/: every row a planter sets must be recovered by the
analysis of the planted tables, and, with that row's planted target moved away from its published value by a
declared margin (MOVES), that row, read against the unmoved published value, must read "not covered" (and, where
the move leaves the labels as planted, the other models' rows keep their verdicts). So each reader reads its own
number. Run on the written tables of a
compact prompt table (the analysis sections representation and skin, 200 bootstrap resamples): the whole
pipeline at the papers' scale is `make referee`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit import contracts as C
from biasaudit import referee as R
from biasaudit.report.replication import (
    CHANCE_MISS,
    REFEREE_NOTE,
    Run,
    allowed_misses,
    compare,
    load_published,
    point_tolerance,
    referee_check,
    replication_table,
)

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ("white", "black", "asian", "hispanic", "other")
N_IMAGES = 100
# the margin each planted target is moved by (a claim is moved to the other side of its bound); a TVD down,
# since a higher one can be out of reach of the rows that bound the same prompts (SD's surnames: 0.523 and three
# surnames below 0.1)
MOVES = {"mean_tvd": -0.15, "mean_deviation": 0.2, "n_classified": 60.0, "L_mean": 8.0, "homogeneity_gap": 0.1,
         "mean_similarity": 0.1, "similarity_difference": 0.1, "n_in_bin": 10.0, "share_reaching": 1.0}
REPRESENTATION = {"mean_tvd", "mean_deviation", "n_classified", "prompt_tvd_max", "share_reaching", "prompt_deviation"}
SIMILARITY = {"homogeneity_gap", "mean_similarity", "similarity_difference", "n_in_bin", "group_extreme"}


PER_GROUP = 5  # compact prompts per category × group


def compact_prompts() -> pd.DataFrame:
    """3 categories × 5 groups × 5 prompts; each prompt's benchmark concentrated on the group it was selected
    for, the instances the published rows name among them (Schmidt, Chen, Kim), earnings and women's share
    for occupations. Test input, not an expected value. (With 3 prompts a group, 15 a category, a claim over one
    category has too little power for any planting margin the other rows leave: A56's margin of Imagen's Black
    surname deviation read 0.13 [−0.004, 0.24].)"""
    rng = np.random.default_rng(7)
    named = {("surname", "white"): ["Schmidt"], ("surname", "asian"): ["Chen", "Kim"], ("surname", "black"): ["Charles"],
             ("occupation", "white"): ["Chief executives"], ("occupation", "asian"): ["Manicurists and pedicurists"]}
    rows = []
    for cat in ("occupation", "geography", "surname"):
        for gi, g in enumerate(GROUPS):
            names = named.get((cat, g), []) + [f"{cat}-{g}-{k}" for k in range(PER_GROUP)]
            for k, inst in enumerate(names[:PER_GROUP]):
                top = 0.55 + 0.06 * k if g != "other" else 0.35 + 0.05 * k
                rest = rng.dirichlet(np.ones(len(GROUPS) - 1)) * (1 - top)
                shares = np.insert(rest, gi, top)
                rows.append({"prompt_id": f"{cat[:3]}_{g}_{k}", "category": cat, "instance": inst, "selected_for": g,
                             "prompt": f"A person: {inst}", **dict(zip(GROUPS, shares)),
                             "median_weekly_earnings_usd": 900.0 + 90.0 * (gi * PER_GROUP + k) if cat == "occupation" else np.nan,
                             # not collinear with earnings: A63's slope is planted orthogonal to them
                             "pct_women": 0.2 + 0.03 * ((gi * PER_GROUP + k) * 7 % 25) if cat == "occupation" else np.nan})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def cfg():
    from biasaudit.cli import profile_params

    params = profile_params("referee", ROOT / "params.yaml")
    return params.model_copy(update={"analyze": params.analyze.model_copy(update={"n_boot": 200})})


@pytest.fixture(scope="module")
def published() -> pd.DataFrame:
    return load_published(ROOT / C.PUBLISHED_DIR)


def run_world(tmp: Path, cfg, published: pd.DataFrame, planted_from: pd.DataFrame, prompts: pd.DataFrame,
              sections: tuple[str, ...] = ("representation", "skin", "homogeneity"), start=None, reuse=None):
    """Plant the world of `planted_from`'s rows, write its tables under tmp, run the analysis `sections` on them,
    and return the replication table (referee) against `published`. `start`: a solution to start the
    representation solve from; `reuse`: a solution to use as is (a moved row that no representation row reads)."""
    import matplotlib.pyplot as plt

    from biasaudit.pipeline.outputs import OutputWriter
    from biasaudit.report.load import Outputs
    from biasaudit.t2i.analysis import homogeneity, inputs, representation, skin

    world = R.plant_world(planted_from, list(cfg.models), GROUPS, N_IMAGES, prompts["instance"])
    rep = reuse or R.solve_representation(world, prompts, planted_from, start=start)
    tables = R.planted_tables(world, rep, cfg.seed, cfg.analyze.earnings_unit_usd)
    prompts.to_csv(tmp / "prompts.csv", index=False)
    R.write_tables(tables, tmp, Path("images"))
    data = inputs.load_inputs(tmp, "prompts.csv", "images", groups=GROUPS)
    writer = OutputWriter(tmp / "reports" / "t2i")
    for name in sections:
        result = {"representation": representation, "skin": skin, "homogeneity": homogeneity}[name].compute(data, cfg)
        for fig in result.figures.values():  # the replication table reads tables: no figure is rendered
            plt.close(fig.fig)
        writer.add(dataclasses.replace(result, figures={}))
    writer.finish(inputs.PLOTS, profile="referee", stand_in=True)
    run = Run(Outputs.load(tmp / "reports" / "t2i"), Outputs.load(tmp / "reports" / "vlm"), groups=GROUPS)
    table = replication_table(published, run, ["models: planted"], referee=True)
    return world, rep, table


def moved(published: pd.DataFrame, rid: str, width: float = 0.0) -> pd.DataFrame:
    """The published rows with row `rid`'s target moved: a number by its MOVES margin, or by the width of its
    interval in the unmoved world where that is wider (a move inside the interval cannot break the row: A29's bin
    similarity, whose interval on the compact world is wider than 0.1), up, or down where up leaves the range; a
    claim to the other side of its bound."""
    out = published.copy()
    i = out.index[out["id"] == rid][0]
    rel, value = out.at[i, "relation"], float(out.at[i, "value"])
    if rel in ("<", ">"):
        out.at[i, "relation"] = {"<": ">", ">": "<"}[rel]
    else:
        step = MOVES[out.at[i, "statistic"]]
        step = math.copysign(max(abs(step), width), step) if math.isfinite(width) else step
        out.at[i, "value"] = str(value + step if 0 <= value + step < (1.0 if abs(step) < 1 else math.inf) else value - step)
    return out


def planted_rows(world: R.World) -> list[str]:
    """Method A's rows whose planter sets the planted world (design settings aside: they read params; claims
    implied by other rows aside; the raters' rows: test_planted_raters_recover_the_published_agreement; Method
    B's planted answers are not part of this compact world)."""
    design = {k for k, v in world.planted.items() if v.startswith(("design", R.IMPLIED, "planted raters"))}
    return sorted(k for k in set(world.planted) - design if k.startswith("A"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, cfg, published):
    prompts = compact_prompts()
    return (prompts, *run_world(tmp_path_factory.mktemp("referee"), cfg, published, published, prompts))


@pytest.mark.slow
def test_every_planted_row_is_recovered(baseline):
    prompts, world, rep, table = baseline
    rows = planted_rows(world)
    assert len(rows) >= 38, rows  # representation, L*, dark share, earnings and similarity rows of Method A
    checked, failed = referee_check(table[table["id"].isin(rows)].reset_index(drop=True))
    assert failed == [], checked[checked["id"].isin(failed)][["id", "this_run", "low", "high", "note"]].to_string()
    assert table["note"].str.startswith(REFEREE_NOTE).all()


def rows_to_move(world: R.World, published: pd.DataFrame, covered: pd.Series) -> dict[tuple[str, str], list[str]]:
    """Each reader (statistic, relation) → its planted rows that read covered in the unmoved world (a move of a
    row that misses already proves nothing), in id order: the test moves the first whose move the world can
    plant, or every one with BIASAUDIT_REFEREE_MOVES=all (opt-in: many more representation re-solves)."""
    kind = published.set_index("id")
    readers: dict[tuple[str, str], list[str]] = {}
    for rid in planted_rows(world):
        readers.setdefault((kind.at[rid, "statistic"], kind.at[rid, "relation"]), [])
        if covered.get(rid) == "True":
            readers[(kind.at[rid, "statistic"], kind.at[rid, "relation"])].append(rid)
    return readers


@pytest.mark.slow
def test_moving_each_planted_target_breaks_its_row(tmp_path, baseline, cfg, published):
    prompts, world, rep, base = baseline
    base_cov = base.set_index("id")["covered"].astype(str)
    stat = published.set_index("id")["statistic"]
    subset = published.set_index("id")["subset"].astype(str)
    widths = (base.set_index("id")["high"].map(float) - base.set_index("id")["low"].map(float))
    readers = rows_to_move(world, published, base_cov)
    assert all(readers.values()), f"readers with no row covered in the unmoved world: {[k for k, v in readers.items() if not v]}"
    every = os.environ.get("BIASAUDIT_REFEREE_MOVES") == "all"
    unplantable: dict[tuple[str, str], list[str]] = {}  # reader → its rows whose move the world cannot plant
    measured = {str(c["row"]["id"]) for c in world.constraints if c["kind"] in R.PLANTING_CHECKED}
    for reader, candidates in readers.items():
        made = 0  # moves of this reader's rows that the world could plant
        for rid in candidates:
            folder = tmp_path / rid
            folder.mkdir()
            kind = stat[rid]
            section = ("representation" if kind in REPRESENTATION or "measure=mean_" in subset[rid] else "homogeneity"
                       if kind in SIMILARITY or "face_similarity" in subset[rid] else "skin")
            moved_world, moved_rep, table = run_world(
                folder, cfg, published, moved(published, rid, float(widths.get(rid, math.nan))), prompts, (section,),
                start=rep, reuse=None if section == "representation" else rep)  # an extreme of mean_*: re-solved too
            # a move the world cannot make (it conflicts with other rows) tests nothing: the moved world's labels
            # must leave the published value (a mean TVD or deviation: by more than planting_misses' tolerance)
            if rid in measured and rid not in R.planting_misses(world, moved_rep):
                unplantable.setdefault(reader, []).append(rid)
                continue
            cov = table.set_index("id")["covered"].astype(str)
            assert cov[rid] == "False", f"{rid}: moved target still reads covered ({table.set_index('id').loc[rid, 'this_run']})"
            # a re-solved world (representation): the rows of the moved model may compete with the moved target and
            # the compact world's direction rows sit close to their bounds, so other rows' verdicts are compared only
            # where the labels stay as planted: every other model's rows of the section keep their verdict
            if section != "representation":
                same = table.set_index("id")
                others = [i for i in cov.index if i in planted_rows(world) and same.at[i, "run_model"] not in
                          (same.at[rid, "run_model"], "*")
                          and same.at[i, "statistic"] in (SIMILARITY if section == "homogeneity"
                                                          else {"L_mean", "dark_share", "earnings_slope_p"})]
                changed = [i for i in others if cov[i] != base_cov[i]]
                assert changed == [], f"moving {rid} changed {changed}"
            made += 1
            if not every:
                break
        assert made, f"{reader}: no move of its rows could be planted ({unplantable.get(reader)})"


# ---------------------------------------------------------------------------- the referee comparison

def test_referee_compare_labels_and_rules_points():
    row = {"id": "X", "method": "A", "kind": "result", "statistic": "n_classified", "model": "m", "run_model": "m",
           "category": "all", "group": "black", "subset": "", "relation": "=", "value": "172", "unit": "", "sentence": ""}
    from biasaudit.report.replication import RunValue

    stand_in = compare(row, RunValue(172.0), stand_in=True)
    assert stand_in["covered"] == "" and "no comparison" in stand_in["note"]
    hit = compare(row, RunValue(172.4), stand_in=True, referee=True)
    assert hit["covered"] is True and hit["note"].startswith(REFEREE_NOTE)
    assert compare(row, RunValue(173.0), stand_in=True, referee=True)["covered"] is False
    claim = {**row, "relation": "<", "value": "0.1"}
    assert compare(claim, RunValue(0.05), True, True)["covered"] is True
    assert compare(claim, RunValue(0.15), True, True)["covered"] is False


def test_point_tolerance_is_half_the_last_published_digit():
    assert point_tolerance("0.222") == pytest.approx(0.0005)
    assert point_tolerance("172") == 0.5
    assert point_tolerance("31.5") == pytest.approx(0.05)


def test_chance_misses_are_named_within_the_binomial_bound():
    from scipy.stats import binom

    n = 40
    allowed = allowed_misses(n, 0.95)
    assert binom.cdf(allowed, n, 0.05) >= 0.99 > binom.cdf(allowed - 1, n, 0.05)
    rows = [{"id": f"R{i}", "covered": i >= allowed, "low": 0.0, "high": 1.0, "note": ""} for i in range(n)]
    checked, failed = referee_check(pd.DataFrame(rows))
    assert failed == [] and checked["note"].str.contains(CHANCE_MISS).sum() == allowed
    rows[allowed]["covered"] = False  # one more miss than chance allows: every miss fails
    _, failed = referee_check(pd.DataFrame(rows))
    assert len(failed) == allowed + 1


def test_a_planted_null_below_alpha_is_a_chance_miss_and_a_point_miss_is_not():
    """A claim of no significance (p > 0.05) planted as a null misses with probability 0.05, as a 95% interval does;
    a point without an interval (a count) that misses fails."""
    base = [{"id": f"R{i}", "covered": True, "low": 0.0, "high": 1.0, "note": "", "statistic": "mean_tvd",
             "relation": "=", "published": "0.3"} for i in range(20)]
    null = {"id": "P", "covered": False, "low": None, "high": None, "note": "", "statistic": "earnings_slope_p",
            "relation": ">", "published": "0.05"}
    checked, failed = referee_check(pd.DataFrame([*base, null]))
    assert failed == [] and CHANCE_MISS in checked.set_index("id").at["P", "note"]
    point = {**null, "id": "N", "statistic": "n_classified", "relation": "=", "published": "172"}
    _, failed = referee_check(pd.DataFrame([*base, point]))
    assert failed == ["N"]
    _, failed = referee_check(pd.DataFrame([*base, {**null, "published": "0.01"}]))  # a bound that is not 1 − level
    assert failed == ["P"]


def test_unplanted_rows_say_why(published):
    world = R.plant_world(published, ["imagen-4-fast", "sd35-large-turbo", "flux-schnell"], GROUPS, N_IMAGES)
    notes = R.planted_notes(world)
    assert set(notes) == set(published["id"])
    assert notes["A45"].startswith(R.CANNOT_PLANT)  # the BLS table is data, not a model
    assert all(v.startswith((R.PLANTED, "not planted:", R.CANNOT_PLANT)) for v in notes.values())


def test_exact_total_and_largest_remainder():
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.ones(5), size=40)
    counts = R.largest_remainder(q, 100)
    assert (counts.sum(axis=1) == 100).all() and np.abs(counts - 100 * q).max() < 1
    before = int(counts[:, 1].sum())
    R.exact_total(counts, q, 1, before + 7, 100)
    assert counts[:, 1].sum() == before + 7
    R.exact_total(counts, q, 1, before - 5, 100)
    assert counts[:, 1].sum() == before - 5
    assert (counts.sum(axis=1) == 100).all() and (counts >= 0).all()


def test_focus_design_counts_read_the_group_edits(tmp_path, cfg, published):
    """The planted FOCUS manifest of the referee design holds 6 occupations × 8 photos × 10 groups of group edits;
    with the null-edit control on (two images per photo), B01 still reads 480 and B03 10 (the control arms are
    no image of FOCUS) and B13/B14 count 48 each; the referee profile has no control arm (the paper's design):
    B13/B14 read 0."""
    from biasaudit.report.load import Outputs

    def read(focus, ids, folder):
        folder.mkdir()
        path = folder / "manifest.parquet"
        focus.to_parquet(path)
        run = Run(Outputs.load(folder / "t2i"), Outputs.load(folder / "vlm"), focus_manifest=path)
        rows = published[published["id"].isin(ids)]
        return replication_table(rows, run, ["models: planted"], referee=True).set_index("id")["this_run"].to_dict()

    on = cfg.model_copy(update={"counterfactuals": cfg.counterfactuals.model_copy(update={"null_edit": True})})
    focus = R.planted_focus(on)
    assert (focus["arm"] == "counterfactual").sum() == 6 * 8 * 10
    assert len(focus) == 6 * 8 * 10 + 2 * 6 * 8
    got = read(focus, ["B01", "B02", "B03", "B06", "B07", "B13", "B14"], tmp_path / "on")
    assert got == {"B01": 480.0, "B02": 6.0, "B03": 10.0, "B06": 5.0, "B07": 2.0, "B13": 48.0, "B14": 48.0}
    assert not cfg.counterfactuals.null_edit
    assert read(R.planted_focus(cfg), ["B01", "B13", "B14"], tmp_path / "off") == {"B01": 480.0, "B13": 0.0,
                                                                                      "B14": 0.0}


RATER_ROWS = [f"A{i}" for i in range(35, 42)] + ["A73"]


def rater_table(folder: Path, planted_from: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """The raters planted from `planted_from`'s rows (referee.planted_ratings) for a fixed classifier sample,
    through the reliability stage's own statistics and writer (t2i.reliability.agreement, write_outputs), then
    the replication table's raters' rows against `published`."""
    from biasaudit.report.load import Outputs
    from biasaudit.t2i import reliability as rel

    world = R.plant_world(planted_from, ["imagen-4-fast", "sd35-large-turbo", "flux-schnell"], GROUPS, N_IMAGES)
    rng = np.random.default_rng(3)
    clf = pd.Series(rng.choice(np.array(GROUPS), 300, p=[0.5, 0.15, 0.12, 0.15, 0.08]),
                    index=[f"img-{i:03d}" for i in range(300)], name=rel.CLASSIFIER)
    raters, _ = R.planted_ratings(world, clf.to_numpy(str), GROUPS, seed=0)
    assert (raters.index == range(300)).all() and raters.isin(GROUPS).all().all()
    ratings = pd.DataFrame({"rater1": raters["r1"].to_numpy(), "rater2": raters["r2"].to_numpy()},
                           index=clf.index).join(clf)
    tables = rel.agreement(ratings, ["rater1", "rater2"], GROUPS, n_boot=0)
    labels = pd.DataFrame({"stand_in": [True]})
    rel.write_outputs(folder / C.RELIABILITY_DIR, tables, ratings, {}, {"source": "planted", "note": "PLANTED"},
                      labels, "PLANTED raters (test)", {})
    run = Run(Outputs.load(folder / C.T2I_REPORTS), Outputs.load(folder / "vlm"), groups=GROUPS)
    rows = published[published["id"].isin(RATER_ROWS)]
    return replication_table(rows, run, ["models: planted"], referee=True).set_index("id")


@pytest.mark.slow
def test_planted_raters_recover_the_published_agreement(tmp_path, published):
    """The planted raters give the raters' rows their published values: A35–A41 within the published rounding
    (points: no bootstrap here), A73 on its claimed side."""
    table = rater_table(tmp_path, published, published)
    assert len(table) == 8
    assert (table["covered"].astype(str) == "True").all(), table[["this_run", "low", "high", "note"]].to_string()
    assert table.at["A37", "this_run"] == 300 and table.at["A38", "this_run"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("rid", ["A35", "A36", "A39", "A40", "A41", "A73"])
def test_moving_a_raters_target_breaks_its_row(tmp_path, published, rid):
    """Each raters' reader reads its own number: the raters planted with row `rid`'s target moved (a κ or share
    by 0.1, the claimed majority to the other side), read against the published value, miss it; the rows whose
    targets did not move stay recovered (a reader returning the published number would pass the test above)."""
    moved_rows = published.copy()
    i = moved_rows.index[moved_rows["id"] == rid][0]
    if moved_rows.at[i, "relation"] == ">":
        moved_rows.at[i, "relation"] = "<"
    else:
        moved_rows.at[i, "value"] = str(round(float(moved_rows.at[i, "value"]) - 0.1, 3))
    table = rater_table(tmp_path, moved_rows, published)
    cov = table["covered"].astype(str)
    assert cov[rid] == "False", (rid, table.at[rid, "this_run"])
    assert (cov.drop(rid) == "True").all(), table.loc[cov != "True", ["this_run", "note"]].to_string()


def agreement_of(r1: np.ndarray, r2: np.ndarray, clf: np.ndarray) -> dict[tuple[str, ...], float]:
    """The raters' statistics the published rows name, from the labels: Cohen's κ and Fleiss' κ and the
    disagreement shares by the reliability stage (t2i.reliability.agreement), the split counted pair by pair."""
    from biasaudit.t2i import reliability as rel

    ratings = pd.DataFrame({"rater1": r1, "rater2": r2, rel.CLASSIFIER: clf})
    tables = rel.agreement(ratings, ["rater1", "rater2"], GROUPS, n_boot=0)
    mean = tables["mean_kappa"].set_index("kind")["mean_cohen_kappa"]
    fl = tables["fleiss_kappa"].set_index(["group", "raters"])["fleiss_kappa"]
    dis = tables["disagreements"]
    human_w = sum(int(((r == "white") & (clf == "hispanic")).sum()) for r in (r1, r2))
    human_h = sum(int(((r == "hispanic") & (clf == "white")).sum()) for r in (r1, r2))
    return {("kappa", "human-human"): mean["human-human"], ("kappa", "human-classifier"): mean["human-classifier"],
            ("fleiss", "hispanic", "all"): fl[("hispanic", "all")],
            ("disagree", "hispanic", "white"): dis.at["hispanic", "white"],
            ("disagree", "hispanic", "asian"): dis.at["hispanic", "asian"],
            ("split", "white", "hispanic"): human_w / (human_w + human_h)}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 4, 5, 6, 7])
def test_planted_raters_hold_on_other_classifier_samples(seed, published):
    """A40 once missed on such samples (the share of Hispanic disagreements against White moves on a lattice of
    whole images): on synthetic classifier samples of 300 labels near the referee's mix, every raters' row holds
    within RATER_TOLERANCE, read from the planted labels by the reliability stage's statistics and by counting."""
    world = R.plant_world(published, ["imagen-4-fast", "sd35-large-turbo", "flux-schnell"], GROUPS, N_IMAGES)
    rng = np.random.default_rng(seed)
    # shares drawn around the referee run's rated sample (132 White, 14 Black, 56 Asian, 56 Hispanic, 42 other)
    clf = np.array(GROUPS)[rng.choice(5, 300, p=rng.dirichlet(np.array([132, 14, 56, 56, 42])))]
    raters, _ = R.planted_ratings(world, clf, GROUPS, seed=0)
    got = agreement_of(raters["r1"].to_numpy(str), raters["r2"].to_numpy(str), clf)
    assert set(got) == set(world.agreement)
    off = {key: (got[key], target) for key, target in world.agreement.items()
           if not abs(got[key] - target) < R.RATER_TOLERANCE[key[0]]}
    assert off == {}, off


def test_a_row_whose_planted_world_misses_its_target_is_never_a_chance_miss():
    from biasaudit.report.replication import PLANTING_MISSED

    base = [{"id": f"R{i}", "covered": True, "low": 0.0, "high": 1.0, "note": "", "statistic": "mean_tvd",
             "relation": "=", "published": "0.3"} for i in range(40)]
    miss = {**base[0], "id": "M", "covered": False}
    _, failed = referee_check(pd.DataFrame([*base, miss]))
    assert failed == []  # one interval miss of 41: chance
    _, failed = referee_check(pd.DataFrame([*base, miss]), planted={"M": f"{PLANTING_MISSED}: 0.39 against = 0.523"})
    assert failed == ["M"]


def test_planting_misses_of_an_undistorted_world_are_the_rows_that_ask_for_distortion(published):
    """A world whose planted counts are the benchmark (every mean TVD and deviation 0 up to the counts' rounding):
    the mean TVD rows and the deviation rows away from 0 are missed; a deviation claimed below 0 by its bound too."""
    prompts = compact_prompts()
    world = R.plant_world(published, ["imagen-4-fast", "sd35-large-turbo", "flux-schnell"], GROUPS, N_IMAGES,
                          prompts["instance"])
    bench = prompts[list(GROUPS)].to_numpy(float)
    counts = {m: R.largest_remainder(bench / bench.sum(axis=1, keepdims=True), N_IMAGES) for m in world.models}
    rep = R.Representation(prompts, {}, {}, counts, 0.0)
    missed = R.planting_misses(world, rep)
    expected = set()
    for c in world.constraints:
        if c["kind"] not in ("mean_tvd", "mean_deviation"):
            continue
        t, rel = float(c["row"]["value"]), str(c["row"]["relation"])
        # the undistorted world's value is 0 (±0.005 of rounding 100 images), so the tolerance 0.01 decides alone
        if (rel == "=" and abs(t) > 0.02) or (rel == "<" and t < 0.02) or (rel == ">" and t > -0.02):
            expected.add(str(c["row"]["id"]))
    assert expected and expected <= set(missed), sorted(expected - set(missed))
    assert all(v.startswith("planting missed") for v in missed.values())



def test_a_count_off_by_one_is_never_a_chance_miss():
    """A count's interval of width 0 is no 95% interval: it is not excused by the binomial bound."""
    base = [{"id": f"R{i}", "covered": True, "low": 0.0, "high": 1.0, "note": "", "statistic": "mean_tvd",
             "relation": "=", "published": "0.3"} for i in range(40)]
    count = {"id": "N", "covered": False, "low": 3.0, "high": 3.0, "note": "", "statistic": "n_edits",
             "relation": "=", "published": "4"}
    _, failed = referee_check(pd.DataFrame([*base, count]))
    assert failed == ["N"]
    _, failed = referee_check(pd.DataFrame([*base, {**count, "low": 2.5, "high": 3.5}]))
    assert failed == []  # an interval that misses: chance, one of 41


def test_a_claim_planted_at_its_margin_is_recovered_with_its_power():
    """The planting margin of a claimed sign (referee.claim_margin) gives the reader's interval (the analysis's
    percentile cluster bootstrap over prompts, at the referee profile's level) ≥ CLAIM_POWER of landing beyond the
    bound. Oracle: simulation, each replicate drawing every prompt's labels (binomial) from planted shares whose
    per-prompt deviations are heterogeneous, then the reader's interval. At 3/4 of the margin the power is far lower
    (measured 0.96 at the margin, 0.81 at 0.9 of it, 0.42 at 0.75): the margin is not merely large."""
    from biasaudit.t2i.analysis.inputs import Boot

    rng = np.random.default_rng(3)
    n_prompts, n_images, sims = 50, 100, 300
    b = rng.uniform(0.05, 0.6, n_prompts)
    spread = rng.normal(0.0, 0.12, n_prompts)  # the planted deviations vary across prompts
    spread -= spread.mean()
    boot = Boot(400, R.CLAIM_LEVEL, "percentile", 0, "none", "within")
    power = {}
    for scale in (1.0, 0.75):
        shift = 0.0
        for _ in range(50):  # the mean deviation whose margin it equals (the margin depends on the shares)
            p = np.clip(b + spread + shift, 0.0, 1.0)
            shift += scale * float(R.claim_margin(p, b, n_images)) - (p - b).mean()
        hits = 0
        for k in range(sims):
            d = rng.binomial(n_images, p) / n_images - b
            iv = boot.run(np.column_stack([np.ones(n_prompts), d]), lambda s: s[..., 1:] / s[..., :1], "sim", k)[0]
            hits += iv.low > 0
        power[scale] = hits / sims
    # binomial sd of a 0.95 estimate over 300 draws is 0.0126: 0.92 is 2.4 sd below
    assert power[1.0] >= 0.92, power
    assert power[0.75] < 0.6, power


def test_a_claimed_direction_that_straddles_its_bound_is_never_a_chance_miss():
    """A claim misses with probability 1 − the power of its planting, not 1 − level: the binomial allowance of the
    intervals does not excuse it, however many intervals cover; a planted null (p > 1 − level) still can be."""
    base = [{"id": f"R{i}", "covered": True, "low": 0.0, "high": 1.0, "note": "", "statistic": "mean_tvd",
             "relation": "=", "published": "0.3"} for i in range(60)]
    claim = {"id": "C", "covered": False, "low": -0.01, "high": 0.11, "note": "", "statistic": "mean_deviation",
             "relation": ">", "published": "0"}
    _, failed = referee_check(pd.DataFrame([*base, claim]))
    assert failed == ["C"]
    _, failed = referee_check(pd.DataFrame([*base, {**claim, "relation": "=", "published": "0.2"}]))
    assert failed == []  # the same interval as a published value's: one miss of 61 is chance
    null = {**claim, "id": "P", "low": None, "high": None, "statistic": "earnings_slope_p", "published": "0.05"}
    checked, failed = referee_check(pd.DataFrame([*base, null]))
    assert failed == [] and CHANCE_MISS in checked.set_index("id").at["P", "note"]


def test_a_slope_planted_on_too_few_faces_is_a_planting_miss(published):
    """A23 and A63 read Flux's Black occupational faces: a world that plants none there (the solve once left 8 of
    5,000) misses both rows by the planting, not by chance; the benchmark's own counts miss neither."""
    prompts = compact_prompts()
    world = R.plant_world(published, ["imagen-4-fast", "sd35-large-turbo", "flux-schnell"], GROUPS, N_IMAGES,
                          prompts["instance"])
    bench = prompts[list(GROUPS)].to_numpy(float)
    counts = {m: R.largest_remainder(bench / bench.sum(axis=1, keepdims=True), N_IMAGES) for m in world.models}
    assert not {"A23", "A63"} & set(R.planting_misses(world, R.Representation(prompts, {}, {}, counts, 0.0)))
    occ = (prompts["category"] == "occupation").to_numpy()
    flux = counts["flux-schnell"]
    flux[occ, 0] += flux[occ, 1]  # every Black face of Flux's occupations made White
    flux[occ, 1] = 0
    missed = R.planting_misses(world, R.Representation(prompts, {}, {}, counts, 0.0))
    assert {"A23", "A63"} <= set(missed) and "too few faces" in missed["A63"]
