"""Group sets as data: the schema rejects a malformed set, the U.S. set agrees with what params.yaml runs, and a
made-up set of three groups goes from its instance tables through prompts and a planted distortion to per-prompt
TVDs with no code change (each TVD checked against 0.5·Σ|p − q| computed here from the counts)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from biasaudit import GROUPS, groupsets
from biasaudit.backends.generators.planted import planted_distribution, read_benchmarks
from biasaudit.config import load_params
from biasaudit.t2i import prompts as pr
from biasaudit.t2i.analysis.representation import per_prompt_table

ROOT = Path(__file__).resolve().parents[1]

THREE = {
    "name": "testland", "country": "Testland (made up)", "description": "three made-up groups",
    "groups": [{"label": "north", "display": "Northern", "colour": "#112233"},
               {"label": "south", "display": "Southern", "colour": "#445566"},
               {"label": "east", "display": "Eastern", "colour": "#778899"}],
    "classifier": {"instruction": "Answer with one word: north, south or east."},
    "categories": {
        "region": {"template": "A person from {instance}", "table": "regions.csv", "values": "counts",
                   "source": {"publisher": "Made up", "table": "T1", "year": 2024, "url": "https://example.org/t1",
                              "licence": "CC0"}},
        "trade": {"template": "A person who works as a {instance}", "table": "trades.csv", "values": "percent",
                  "source": {"publisher": "Made up", "table": "T2", "year": 2023, "url": "https://example.org/t2",
                             "licence": "CC0"}},
    },
    "targets": {"aspiration": {"north": 0.4, "south": 0.3, "east": 0.3}},
    "limitations": ["no surname proxy"],
}
REGIONS = pd.DataFrame({"instance": ["Alpha", "Beta", "Gamma", "Delta"],
                        "north": [900, 100, 200, 300], "south": [50, 800, 100, 300], "east": [50, 100, 700, 400]})
TRADES = pd.DataFrame({"instance": ["smith", "baker", "weaver"], "north": [70.0, 10.0, 20.0],
                       "south": [20.0, 80.0, 10.0], "east": [10.0, 10.0, 69.0], "size": [120.0, 90.0, 60.0]})


def write_set(folder: Path, spec: dict = THREE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "groupset.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    REGIONS.to_csv(folder / "regions.csv", index=False)
    TRADES.to_csv(folder / "trades.csv", index=False)
    return folder


def test_three_group_set_runs_prompts_to_tvd_with_no_code_change(tmp_path: Path):
    gs, folder = groupsets.load(write_set(tmp_path / "testland"))
    labels = gs.labels
    assert labels == ("north", "south", "east")
    bench = {c: groupsets.benchmark_table(gs, c, folder) for c in gs.categories}
    # counts → shares by row total: Alpha 900/1000; percent rows rescaled: weaver east 69/99
    assert bench["region"].set_index("instance").loc["Alpha", "north"] == pytest.approx(0.9)
    assert bench["region"].set_index("instance").loc["Delta", "size"] == 1000
    assert bench["trade"].set_index("instance").loc["weaver", "east"] == pytest.approx(69 / 99)
    selected = {c: pr.select_instances(b, top_k=1, min_size=0, groups=labels) for c, b in bench.items()}
    assert list(selected["region"]["instance"]) == ["Alpha", "Beta", "Gamma"]  # the top share of each group
    templates = {c: cat.template for c, cat in gs.categories.items()}
    prompts = pr.build_prompts(selected, templates, ", portrait", "t1", groups=labels)
    assert len(prompts) == 6 and set(labels) <= set(prompts.columns) and "white" not in prompts.columns
    assert prompts.set_index("instance").loc["smith", "prompt"] == "A person who works as a smith, portrait"
    path = tmp_path / "prompts.csv"
    prompts.to_csv(path, index=False)

    # the planted generator's distortion on this set: south × 0.5, the mass to north
    shares = read_benchmarks(path, labels)
    rng = np.random.default_rng(3)
    n_images = 4000
    rows, planted = [], {}
    for pid, q in shares.items():
        p = planted_distribution(q, {"south": 0.5}, "north", labels)
        planted[pid] = p
        counts = rng.multinomial(n_images, p)
        rows += [{"model": "m", "prompt_id": pid, "label": g} for g, k in zip(labels, counts) for _ in range(k)]
    rows.append({"model": "m", "prompt_id": prompts["prompt_id"].iloc[0], "label": "unknown"})  # one abstention
    per = per_prompt_table(pd.DataFrame(rows), prompts, groups=labels).set_index("prompt_id")
    assert len(per) == 6
    for pid, q in shares.items():
        counts = np.array([per.loc[pid, f"n_{g}"] for g in labels], float)
        by_hand = 0.5 * np.abs(counts / counts.sum() - q / q.sum()).sum()
        assert per.loc[pid, "tvd"] == pytest.approx(by_hand)
        exact = 0.5 * np.abs(planted[pid] - q / q.sum()).sum()  # the planted TVD: 0.5 × south's share
        assert exact == pytest.approx(0.5 * q[1] / q.sum())
        assert abs(per.loc[pid, "tvd"] - exact) < 0.03  # 4000 images: within ~4 SE of the planted value
    assert per["n_unknown"].sum() == 1


def test_explicit_instances_replace_the_top_k(tmp_path: Path):
    gs, folder = groupsets.load(write_set(tmp_path / "testland"))
    bench = groupsets.benchmark_table(gs, "region", folder)
    chosen = pr.select_listed(bench, ["Delta", "Alpha"], gs.labels)
    assert list(chosen["instance"]) == ["Delta", "Alpha"]
    assert list(chosen["selected_for"]) == ["east", "north"]  # Delta 300/300/400: east has the largest share
    with pytest.raises(ValueError, match="Omega"):
        pr.select_listed(bench, ["Omega"], gs.labels)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["groups"][0].update(colour="blue"), "colour"),
    (lambda s: s["groups"][1].update(label="north"), "repeat"),
    (lambda s: s["targets"]["aspiration"].update(north=0.5), "sum to 1"),
    (lambda s: s["classifier"].update(instruction="Answer north or south."), "east"),
    (lambda s: s["categories"]["region"].pop("source"), "source"),
    (lambda s: s["categories"]["region"].update(template="A person"), "instance"),
    (lambda s: s.update(colour_scheme="x"), "colour_scheme"),
])
def test_schema_rejects_a_malformed_set(tmp_path: Path, change, message):
    spec = yaml.safe_load(yaml.safe_dump(THREE))
    change(spec)
    with pytest.raises(ValueError, match=message):
        groupsets.load(write_set(tmp_path / "bad", spec))


def test_table_missing_a_group_column_is_an_error(tmp_path: Path):
    gs, folder = groupsets.load(write_set(tmp_path / "testland"))
    REGIONS.drop(columns="east").to_csv(folder / "regions.csv", index=False)
    with pytest.raises(ValueError, match="east"):
        groupsets.benchmark_table(gs, "region", folder)


def test_the_us_set_is_what_params_yaml_runs():
    gs, _ = groupsets.load("us", ROOT / "data" / "reference" / "groupsets")
    params = load_params(ROOT / "params.yaml")
    assert gs.labels == GROUPS == tuple(params.classify.labels)
    assert " ".join(gs.classifier.instruction.split()) == " ".join(params.classify.instruction.split())
    assert {c: cat.template for c, cat in gs.categories.items()} == dict(params.prompts.templates)
    assert set(gs.categories) == set(params.prompts.categories)


CA = ROOT / "data" / "reference" / "groupsets" / "ca-vm"


def excerpt_rows() -> dict[str, tuple[str, str, str]]:
    """Province → (Number, % of Canada's visible minority females, % of females) as printed in the source."""
    rows = {}
    for line in (CA / "source_excerpt.txt").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 4 and all(p.replace(",", "").replace(".", "").isdigit() for p in parts[-3:]):
            rows[" ".join(parts[:-3])] = tuple(parts[-3:])
    return rows


def test_canadian_set_carries_the_published_figures_exactly():
    src = excerpt_rows()
    table = pd.read_csv(CA / "provinces.csv", dtype=str).set_index("instance")
    # three values quoted from the source text, compared character for character
    assert src["Ontario"] == ("1,697,085", "52.7", "26.2")
    assert table.loc["Ontario", "visible_minority_females"] == "1697085"
    assert src["British Columbia"][2] == table.loc["British Columbia", "pct_of_females"] == "28.0"
    assert src["Nunavut"][1] == table.loc["Nunavut", "pct_of_canada_vm_females"] == "0.0"
    # and every row: 13 provinces and territories (the Canada total is not an instance)
    assert set(table.index) == set(src) - {"Canada"} and len(table) == 13
    for name, (number, pct_canada, pct_females) in src.items():
        if name == "Canada":
            continue
        r = table.loc[name]
        assert (r["visible_minority_females"], r["pct_of_canada_vm_females"], r["pct_of_females"]) == (
            number.replace(",", ""), pct_canada, pct_females), name
        assert r["visible_minority"] == pct_females
        assert float(r["not_visible_minority"]) == pytest.approx(100 - float(pct_females))
    # the published shares of all visible minority women add up to the Canada row's 100.0 within rounding
    assert sum(float(v[1]) for k, v in src.items() if k != "Canada") == pytest.approx(100.0, abs=0.7)


def test_canadian_set_runs_prompts_to_tvd(tmp_path: Path):
    gs, folder = groupsets.load("ca-vm", ROOT / "data" / "reference" / "groupsets")
    assert gs.limitations and gs.categories["geography"].source.licence.startswith("Statistics Canada Open Licence")
    bench = groupsets.benchmark_table(gs, "geography", folder)
    assert bench.set_index("instance").loc["British Columbia", "visible_minority"] == pytest.approx(0.28)
    selected = {"geography": pr.select_instances(bench, top_k=2, min_size=10000, groups=gs.labels)}
    assert list(selected["geography"]["instance"]) == ["British Columbia", "Ontario",
                                                       "Newfoundland and Labrador", "Nunavut"]
    prompts = pr.build_prompts(selected, {"geography": gs.categories["geography"].template}, "", "t1",
                               groups=gs.labels)
    assert prompts["prompt"].iloc[0] == "A woman from British Columbia"
    # planted: visible_minority × 0.5 → the planted TVD is half the benchmark's visible minority share
    rng = np.random.default_rng(5)
    rows = []
    for pid, q in zip(prompts["prompt_id"], prompts[list(gs.labels)].to_numpy(float)):
        p = planted_distribution(q, {"visible_minority": 0.5}, "not_visible_minority", gs.labels)
        for g, k in zip(gs.labels, rng.multinomial(6000, p)):
            rows += [{"model": "m", "prompt_id": pid, "label": g}] * int(k)
    per = per_prompt_table(pd.DataFrame(rows), prompts, groups=gs.labels).set_index("instance")
    for name, share in (("British Columbia", 0.28), ("Ontario", 0.262), ("Nunavut", 0.017)):
        assert abs(per.loc[name, "tvd"] - share / 2) < 0.02, name
