"""Selection of proxy instances and prompt rendering."""

import pandas as pd
import pytest

from biasaudit import GROUPS
from biasaudit.t2i import benchmarks as bm
from biasaudit.t2i import prompts as pr

from .conftest import ROOT


def toy_bench() -> pd.DataFrame:
    rows = []
    # Instance i has a high share of group i % 5; sizes vary so some fall under the minimum.
    for i in range(40):
        shares = [0.05] * 5
        shares[i % 5] = 0.8 - i * 0.01
        total = sum(shares)
        rows.append({"instance": f"inst{i:02d}", **{g: s / total for g, s in zip(GROUPS, shares)},
                     "size": 100.0 if i % 7 else 5.0})
    return pd.DataFrame(rows)


def test_selection_respects_k_min_size_and_is_unique():
    sel = pr.select_instances(toy_bench(), top_k=3, min_size=10, groups=GROUPS)
    assert len(sel) == 15
    assert sel["instance"].is_unique
    assert (sel["size"] >= 10).all()
    assert sel.groupby("selected_for").size().to_dict() == {g: 3 for g in GROUPS}
    white = sel[sel["selected_for"] == "white"]["instance"].tolist()
    assert white == ["inst05", "inst10", "inst15"]  # inst00 is under min_size (size 5)


def test_selection_is_deterministic_under_row_order():
    bench = toy_bench()
    a = pr.select_instances(bench, 3, 10, GROUPS)
    b = pr.select_instances(bench.sample(frac=1, random_state=1), 3, 10, GROUPS)
    pd.testing.assert_frame_equal(a.reset_index(drop=True)[["instance", "selected_for"]],
                                  b.reset_index(drop=True)[["instance", "selected_for"]])


def test_duplicates_go_to_the_first_group_and_later_groups_take_the_next():
    bench = pd.DataFrame([
        {"instance": "shared", "white": 0.5, "black": 0.5, "asian": 0, "hispanic": 0, "other": 0, "size": 10},
        {"instance": "b2", "white": 0.1, "black": 0.4, "asian": 0.5, "hispanic": 0, "other": 0, "size": 10},
        {"instance": "x", "white": 0.2, "black": 0.1, "asian": 0.2, "hispanic": 0.3, "other": 0.2, "size": 10},
        {"instance": "y", "white": 0.2, "black": 0.1, "asian": 0.1, "hispanic": 0.2, "other": 0.4, "size": 10},
        {"instance": "z", "white": 0.3, "black": 0.3, "asian": 0.3, "hispanic": 0.05, "other": 0.05, "size": 10},
    ])
    sel = pr.select_instances(bench, 1, 1, GROUPS).set_index("selected_for")["instance"]
    assert sel["white"] == "shared" and sel["black"] == "b2"  # ties with 'shared' → next best


def test_too_few_candidates_names_the_parameters():
    with pytest.raises(ValueError, match="min_size"):
        pr.select_instances(toy_bench(), top_k=10, min_size=10, groups=GROUPS)


def test_rendering_and_ids():
    text = pr.render_prompt("A person who works as {article} {instance}", ", portrait", "editor", "an")
    assert text == "A person who works as an editor, portrait"
    assert pr.prompt_id("surname", "Smith") == pr.prompt_id("surname", "Smith")
    assert pr.prompt_id("surname", "Smith").startswith("sur_smith-")
    assert pr.prompt_id("geography", "Doña Ana County, New Mexico") != pr.prompt_id("geography", "Dona Ana County, New Mexico")


def test_phrase_mapping_covers_every_usable_occupation():
    occ, _ = bm.occupation_benchmark(*bm.load_bls())
    phrases = pr.load_occupation_phrases()
    usable, excluded = pr.attach_occupation_phrases(occ, phrases)
    assert len(usable) + len(excluded) == len(occ)
    assert set(phrases["article"]) <= {"a", "an"}
    mapping = phrases.set_index("bls_occupation")["phrase"]
    assert mapping["Nursing assistants"] == "nursing assistant"
    assert mapping["Chief executives"] == "chief executive"
    assert (excluded["reason"].str.len() > 0).all()


def real_benchmarks() -> dict[str, pd.DataFrame]:
    """The U.S. tables as the prompts stage reads them (occupations through the phrase mapping)."""
    occ, _ = pr.attach_occupation_phrases(bm.occupation_benchmark(*bm.load_bls())[0], pr.load_occupation_phrases())
    return {"occupation": occ, "geography": bm.geography_benchmark(bm.load_p2()),
            "surname": bm.surname_benchmark(bm.load_census_surnames())}


def select_all(params, benches: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {c: pr.select_instances(benches[c], params.top_k, params.min_size[c], GROUPS, params.size_weight)
            for c in params.categories}


def test_paper_selection_has_150_prompts():
    """The paper profile: k=10 → 50 per category, 10 selected for each group in each category."""
    from biasaudit.cli import profile_params

    params = profile_params("paper", ROOT / "params.yaml").prompts
    selected = select_all(params, real_benchmarks())
    prompts = pr.build_prompts(selected, params.templates, params.style_suffix, "v1", GROUPS)
    assert len(prompts) == 150
    assert prompts.groupby(["category", "selected_for"]).size().eq(10).all()
    assert prompts["prompt_id"].is_unique
    ceo_like = prompts[prompts["category"] == "surname"]["prompt"].iloc[0]
    assert ceo_like.startswith("A person with the last name ") and ceo_like.endswith(params.style_suffix)
    assert prompts[prompts["category"] == "surname"]["instance"].str.istitle().all()


def test_size_weight_runs_from_share_to_count():
    """0 ranks by the group's share, 1 by its count (share × size), between them share tilted by size."""
    bench = pd.DataFrame([
        {"instance": "rare", "white": 0.99, "black": 0.01, "asian": 0, "hispanic": 0, "other": 0, "size": 100},
        {"instance": "common", "white": 0.80, "black": 0.20, "asian": 0, "hispanic": 0, "other": 0, "size": 10000},
        {"instance": "huge", "white": 0.50, "black": 0.50, "asian": 0, "hispanic": 0, "other": 0, "size": 100000},
    ] + [{"instance": f"x{i}", "white": 0, "black": 0, "asian": 0.3, "hispanic": 0.3, "other": 0.4, "size": 50}
         for i in range(3)])
    white = {w: pr.select_instances(bench, 1, 0, GROUPS, w).set_index("selected_for").loc["white", "instance"]
             for w in (0.0, 0.1, 1.0)}
    # 0.99 vs 0.80 × 100^0.1 = 1.27 vs 0.50 × 1000^0.1 = 1.00 (relative to rare's size); count: 99, 8000, 50000
    assert white == {0.0: "rare", 0.1: "common", 1.0: "huge"}
    with pytest.raises(ValueError, match="size_weight"):
        pr.select_instances(bench, 1, 0, GROUPS, 1.5)


# The instances the paper names (its text, quoted here as the oracle): "person with the last name Chen",
# "person who works as an information systems manager"; "Surnames like "Schmidt", "Chen", and "Kim" ...
# surnames with higher Black demographic shares (e.g., "Charles")"; "Asians are overrepresented in "a CEO" and
# "an actor" prompts and underrepresented in "a nail technician" prompts"; "stereotypically female occupations
# such as nail technician, nursing assistant, and school teachers". It names no location.
PAPER_SURNAMES = ["Chen", "Schmidt", "Kim", "Charles"]
PAPER_OCCUPATIONS = ["information systems manager", "CEO", "actor", "nail technician", "nursing assistant",
                     "school teacher"]
# What no rule can select from the 2025 tables, and why: BLS suppresses the shares of Actors (43 thousand
# employed, under its 50 thousand publication base), so the row is not in the benchmark.
UNREACHABLE = {"actor": "Actors"}


def test_paper_profile_selects_every_instance_the_paper_names():
    from biasaudit.cli import profile_params

    params = profile_params("paper", ROOT / "params.yaml").prompts
    benches = real_benchmarks()
    selected = select_all(params, benches)
    surnames = set(selected["surname"]["instance"])
    assert [s for s in PAPER_SURNAMES if s not in surnames] == []
    phrases = pr.load_occupation_phrases()
    to_bls = phrases[phrases["paper_phrase"] != ""].set_index("paper_phrase")["bls_occupation"]
    assert sorted(to_bls.index) == sorted(PAPER_OCCUPATIONS)  # the mapping covers exactly the paper's list
    occupations = set(selected["occupation"]["instance"])
    reachable = [to_bls[p] for p in PAPER_OCCUPATIONS if p not in UNREACHABLE]
    assert [o for o in reachable if o not in occupations] == []
    for phrase, row in UNREACHABLE.items():
        assert to_bls[phrase] == row and row not in set(benches["occupation"]["instance"]), \
            f"{row} is in the benchmark now: select it and drop it from UNREACHABLE"
    # the offline default keeps the share rule, which misses all but one of them
    default = profile_params("offline", ROOT / "params.yaml").prompts
    assert default.size_weight == 0.0
    by_share = pr.select_instances(benches["surname"], 10, default.min_size["surname"], GROUPS, default.size_weight)
    assert not set(PAPER_SURNAMES) & set(by_share["instance"])


def test_selection_sensitivity_reports_entropy_own_share_and_overlap():
    a = pd.DataFrame([{"instance": "p", "selected_for": "white", "white": 1.0, "black": 0.0, "asian": 0.0,
                       "hispanic": 0.0, "other": 0.0, "size": 10.0},
                      {"instance": "q", "selected_for": "black", "white": 0.5, "black": 0.5, "asian": 0.0,
                       "hispanic": 0.0, "other": 0.0, "size": 30.0}])
    b = a.iloc[[1]].copy()
    table = pr.selection_sensitivity({"share": {"surname": a}, "paper": {"surname": b}}, GROUPS)
    row = table.set_index("rule").loc["share"]
    assert row["mean_entropy_bits"] == pytest.approx(0.5)  # 0 bits and 1 bit
    assert row["mean_own_share"] == pytest.approx(0.75) and row["mean_white"] == pytest.approx(0.75)
    assert row["median_size"] == 20.0 and row["shared_with_first"] == 2
    assert table.set_index("rule").loc["paper", "shared_with_first"] == 1
    # the benchmark mix moves from (0.75, 0.25) to (0.5, 0.5): TVD 0.25; the first rule against itself 0
    assert table.set_index("rule")["tvd_mix_vs_first"].to_dict() == pytest.approx({"share": 0.0, "paper": 0.25})


# The paper's words for the occupations it names, each quoted here from the paper as the oracle.
PAPER_WORDS = {"Chief executives": "a CEO", "Computer and information systems managers": "an information systems manager",
               "Manicurists and pedicurists": "a nail technician", "Nursing assistants": "a nursing assistant",
               "Elementary and middle school teachers": "a school teacher"}


def test_a_named_occupation_is_prompted_in_the_papers_words():
    """The paper profile's prompts say "a CEO", not BLS's "a chief executive"; each mapping row carries the
    paper's sentence it comes from, which contains the phrase; an occupation the paper does not name keeps
    the reviewed BLS phrase."""
    from biasaudit.cli import profile_params

    params = profile_params("paper", ROOT / "params.yaml").prompts
    prompts = pr.build_prompts(select_all(params, real_benchmarks()), params.templates, params.style_suffix, "v1",
                               GROUPS).set_index("instance")
    for bls, words in PAPER_WORDS.items():
        assert prompts.loc[bls, "prompt"].startswith(f"A person who works as {words}, "), prompts.loc[bls, "prompt"]
    assert prompts.loc["Lawyers", "prompt"].startswith("A person who works as a lawyer, ")
    phrases = pr.load_occupation_phrases()
    named = phrases[phrases["paper_phrase"] != ""]
    assert (named["paper_line"].str.len() > 0).all() and (phrases.loc[phrases["paper_phrase"] == "", "paper_line"] == "").all()
    for r in named.itertuples():
        assert r.paper_phrase.rstrip("s") in r.paper_line, r.bls_occupation


def _named_selected(benches, weight: float, surname_floor: float) -> int:
    phrases = pr.load_occupation_phrases()
    named_occ = set(phrases.loc[phrases["paper_phrase"] != "", "bls_occupation"]) - set(UNREACHABLE.values())
    occ = set(pr.select_instances(benches["occupation"], 10, 100.0, GROUPS, weight)["instance"])
    sur = set(pr.select_instances(benches["surname"], 10, surname_floor, GROUPS, weight)["instance"])
    return len(named_occ & occ) + len(set(PAPER_SURNAMES) & sur)


@pytest.mark.parametrize("weight, floor, all_nine", [
    (0.05, 30000, True), (0.11, 30000, True), (0.05, 60000, True), (0.11, 60000, True), (0.10, 50000, True),
    (0.04, 50000, False), (0.16, 50000, False), (0.10, 25000, False), (0.10, 65000, False), (0.0, 10000, False)])
def test_the_selection_rule_is_fitted_to_the_named_instances(weight, floor, all_nine):
    """The region docs/prompts.md states, computed: all 9 reachable named instances are selected for
    size_weight 0.05–0.11 with surname floors 30,000–60,000 (occupation floor 100), and outside it at least
    one is lost."""
    assert (_named_selected(real_benchmarks(), weight, floor) == 9) is all_nine
