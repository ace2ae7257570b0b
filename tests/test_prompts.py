"""Selection of proxy instances and prompt rendering."""

import pandas as pd
import pytest

from biasaudit import GROUPS
from biasaudit.t2i import benchmarks as bm
from biasaudit.t2i import prompts as pr


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


def test_paper_selection_has_150_prompts():
    """The paper profile: k=10 → 50 per category, 10 selected for each group in each category."""
    from biasaudit.params.t2i import Prompts

    params = Prompts()
    selected = {}
    for category in ("occupation", "geography", "surname"):
        if category == "occupation":
            bench, _ = pr.attach_occupation_phrases(bm.occupation_benchmark(*bm.load_bls())[0],
                                                    pr.load_occupation_phrases())
        elif category == "geography":
            bench = bm.geography_benchmark(bm.load_p2())
        else:
            bench = bm.surname_benchmark(bm.load_census_surnames())
        selected[category] = pr.select_instances(bench, 10, params.min_size[category], GROUPS)
    prompts = pr.build_prompts(selected, params.templates, params.style_suffix, "v1", GROUPS)
    assert len(prompts) == 150
    assert prompts.groupby(["category", "selected_for"]).size().eq(10).all()
    assert prompts["prompt_id"].is_unique
    ceo_like = prompts[prompts["category"] == "surname"]["prompt"].iloc[0]
    assert ceo_like.startswith("A person with the last name ") and ceo_like.endswith(params.style_suffix)
    assert prompts[prompts["category"] == "surname"]["instance"].str.istitle().all()
