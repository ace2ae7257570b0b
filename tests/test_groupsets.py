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


def three_group_params(tmp_path: Path, monkeypatch, **analyze) -> tuple[dict, object]:
    """params.yaml with the made-up set active (under tmp_path/data/reference/groupsets/, the working
    directory): one planted model, the simulated classifier and analyze keyed by its three labels."""
    from biasaudit.config import read_yaml, validate

    write_set(tmp_path / "data" / "reference" / "groupsets" / "testland")
    monkeypatch.chdir(tmp_path)
    groupsets.active.cache_clear()
    labels = [g["label"] for g in THREE["groups"]]
    raw = read_yaml(ROOT / "params.yaml")
    raw["benchmarks"] = {**raw["benchmarks"], "group_set": "testland"}
    raw["models"] = {"planted-t": {"backend": "planted", "width": 160, "height": 160, "planted": {
        "scale": {"south": 0.5}, "receiver": "north",
        "L_mean": {"north": 62.0, "south": 38.0, "east": 50.0}, "L_sd": {g: 4.0 for g in labels},
        "hue_mean": {g: 55.0 for g in labels}, "hue_sd": {g: 2.0 for g in labels}}}}
    M = {"north": {"north": 0.9, "south": 0.05, "east": 0.05}, "south": {"north": 0.2, "south": 0.7, "east": 0.1},
         "east": {"north": 0.05, "south": 0.05, "east": 0.9}}
    raw["classify"] = {**raw["classify"], "labels": labels, "instruction": THREE["classifier"]["instruction"],
                       "vlm": {**raw["classify"]["vlm"], "sim_confusion": M}}
    raw["reliability"] = {**raw["reliability"], "sim_group_accuracy": {}}
    raw["analyze"] = {**raw["analyze"], "threshold_group": "south", "dark_group": "south", "earnings_group": "south",
                      **analyze}
    return raw, validate(raw)


def test_the_schema_reads_the_active_sets_groups(tmp_path: Path, monkeypatch):
    from biasaudit.config import ParamsError, validate

    raw, cfg = three_group_params(tmp_path, monkeypatch)
    assert cfg.groups == ("north", "south", "east")
    assert cfg.group_colours == {"north": "#112233", "south": "#445566", "east": "#778899"}
    for section, key, value, message in [
            ("analyze", "dark_group", "black", "dark_group: 'black' is not a group"),
            ("classify", "labels", ["north", "white"], "white"),
            ("reliability", "sim_group_accuracy", {"hispanic": 0.6}, "hispanic")]:
        bad = {**raw, section: {**raw[section], key: value}}
        with pytest.raises(ParamsError, match=message):
            validate(bad)
    us_planted = {**raw, "models": {"p": {"backend": "planted", "planted": {}}}}  # the U.S. defaults
    with pytest.raises(ParamsError, match="north"):
        validate(us_planted)
    us_confusion = {**raw, "classify": {**raw["classify"], "vlm": {**raw["classify"]["vlm"], "sim_confusion": {
        "white": {"white": 1.0}}}}}
    with pytest.raises(ParamsError, match="sim_confusion"):
        validate(us_confusion)
    groupsets.active.cache_clear()


def test_three_group_set_runs_the_planted_stages_with_no_code_change(tmp_path: Path, monkeypatch):
    """Planted draws, the simulated classifier and the validation section's planted-truth rows on the made-up
    set, with the groups the config reads from the set; planted values checked against the definition."""
    import json

    from biasaudit.backends.generators.planted import draw_truth
    from biasaudit.backends.vlm import make_vlm_backend
    from biasaudit.t2i.analysis import validation
    from biasaudit.t2i.analysis.inputs import Inputs

    _, cfg = three_group_params(tmp_path, monkeypatch, n_boot=200)
    labels, spec = cfg.groups, cfg.models["planted-t"].planted
    gs, folder = groupsets.load("testland")
    bench = groupsets.benchmark_table(gs, "region", folder)
    prompts = pr.build_prompts({"region": pr.select_instances(bench, 1, 0, labels)},
                               {"region": gs.categories["region"].template}, "", "t1", labels)
    prompts.to_csv(tmp_path / "prompts.csv", index=False)
    shares = read_benchmarks(tmp_path / "prompts.csv", labels)
    clf = make_vlm_backend(cfg.classify.vlm, cfg.groups)
    M = np.array([[cfg.classify.vlm.sim_confusion[t][c] for c in labels] for t in labels])
    man, lab, n = [], [], 600
    for pid, q in shares.items():
        p = planted_distribution(q, dict(spec.scale), spec.receiver, labels)
        # the declared distortion: south × 0.5, north + the difference
        assert p == pytest.approx([q[0] + 0.5 * q[1], 0.5 * q[1], q[2]])
        draws = [draw_truth(np.random.default_rng([s, 0]), p, spec, labels) for s in range(n)]
        got = np.array([[d[0] == g for g in labels] for d in draws]).mean(axis=0)
        assert np.abs(got - p).max() < 4 * np.sqrt(0.25 / n)
        for g in labels:  # L* of each planted label ~ N(L_mean, L_sd)
            L = [d[1] for d in draws if d[0] == g]
            if len(L) > 20:
                assert abs(np.mean(L) - spec.L_mean[g]) < 4 * 4.0 / np.sqrt(len(L)), g
        for k, (g, L, hue) in enumerate(draws):
            iid = f"t-{pid}-{k}"
            man.append({"image_id": iid, "model": "planted-t", "prompt_id": pid, "status": "ok", "planted_label": g,
                        "planted_L": L, "planted_hue": hue, "extra": json.dumps({"planted_shares": list(p)})})
            lab.append({"image_id": iid, "model": "planted-t", "prompt_id": pid, "label": clf.answer(iid, g),
                        "status": "ok"})
    labels_df = pd.DataFrame(lab)
    said = pd.crosstab(pd.Series([m["planted_label"] for m in man]), labels_df["label"]).reindex(
        index=list(labels), columns=list(labels), fill_value=0)
    assert np.abs(said.div(said.sum(axis=1), axis=0).to_numpy() - M).max() < 0.08  # the declared confusion
    inputs = Inputs(prompts, pd.DataFrame(man), labels_df, pd.DataFrame(), root=tmp_path, groups=labels)
    table = validation.compute(inputs, cfg).tables["validation"]
    rows = table[table["category_or_group"] == "region"].set_index("quantity")
    q = prompts[list(labels)].to_numpy(float)
    assert rows.loc["mean_tvd", "planted"] == pytest.approx((0.5 * q[:, 1]).mean())  # TVD = (1 − 0.5) · q_south
    exp = rows.loc["mean_tvd_expected_at_n"]
    assert exp["low"] <= exp["planted"] <= exp["high"] and bool(exp["covered"])
    groupsets.active.cache_clear()


@pytest.mark.parametrize("answer, expected", [
    ("visible_minority", "visible_minority"), ("**not_visible_minority**", "not_visible_minority"),
    ("Answer: not visible minority.", "not_visible_minority"), ("Visible minority", "visible_minority"),
    ("visible_minority or not_visible_minority", None), ("South Asian", None)])
def test_labels_with_underscores_parse_as_words(answer, expected):
    """A set's labels may hold `_` (ca-vm): the parser keeps it as part of the word, and "not visible minority"
    is not read as "visible minority"."""
    from biasaudit.backends.vlm.parse import parse_choice

    gs, _ = groupsets.load("ca-vm", ROOT / "data" / "reference" / "groupsets")
    assert parse_choice(answer, gs.labels)[0] == expected
