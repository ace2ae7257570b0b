"""Parameter validation messages and profile switching."""

import shutil

import pytest
import yaml

from biasaudit.config import ParamsError, apply_profile, load_params, main, read_yaml, validate

from .conftest import ROOT


def raw_params():
    return read_yaml(ROOT / "params.yaml")


def test_typo_names_the_key_and_suggests():
    raw = raw_params()
    raw["prompts"]["top_kk"] = 3
    with pytest.raises(ParamsError) as err:
        validate(raw)
    assert "prompts.top_kk: unknown key (did you mean 'top_k'?)" in str(err.value)
    assert "allowed: " in str(err.value)


def test_wrong_types_are_rejected_not_coerced():
    raw = raw_params()
    raw["prompts"]["top_k"] = "3"  # a string, as papermill would pass it without -p typing
    raw["benchmarks"]["include_puerto_rico"] = "false"  # the classic boolean trap
    with pytest.raises(ParamsError) as err:
        validate(raw)
    message = str(err.value)
    assert "prompts.top_k" in message and "benchmarks.include_puerto_rico" in message


def test_disallowed_value_lists_the_choices():
    raw = raw_params()
    raw["benchmarks"]["hispanic_assumption"] = "whit"
    with pytest.raises(ParamsError, match="'white', 'proportional' or 'other'"):
        validate(raw)


def test_template_must_contain_instance():
    raw = raw_params()
    raw["prompts"]["templates"]["surname"] = "A person"
    with pytest.raises(ParamsError, match="templates.surname"):
        validate(raw)


def test_cli_check_exit_codes(tmp_path, capsys):
    bad = tmp_path / "params.yaml"
    raw = raw_params()
    raw["benchmarkz"] = {}
    bad.write_text(yaml.safe_dump(raw))
    assert main(["check", str(bad)]) == 2
    assert "benchmarkz: unknown key (did you mean 'benchmarks'?)" in capsys.readouterr().err
    assert main(["check", str(ROOT / "params.yaml")]) == 0


@pytest.fixture
def profile_sandbox(tmp_path):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    return tmp_path


def _value(raw, dotted):
    for part in dotted.split("."):
        raw = raw[part]
    return raw


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml")))
def test_profiles_hold_only_keys_that_differ_from_the_default(profile):
    default = raw_params()
    overrides = read_yaml(ROOT / f"profiles/{profile}.yaml")
    same = [k for k, v in overrides.items() if _value(default, k) == v]
    assert not same, f"profiles/{profile}.yaml repeats the default for {same}"


def test_the_offline_profile_is_params_yaml(profile_sandbox):
    params_path = profile_sandbox / "params.yaml"
    before = params_path.read_bytes()
    apply_profile("offline", params_path, profile_sandbox / "profiles")
    assert params_path.read_bytes() == before and load_params(params_path).profile == "offline"


def test_switching_to_paper_and_back_is_byte_identical(profile_sandbox):
    params_path, profiles = profile_sandbox / "params.yaml", profile_sandbox / "profiles"
    original = params_path.read_bytes()
    paper = apply_profile("paper", params_path, profiles)
    assert paper.profile == "paper" and paper.prompts.top_k == 10 and "sd35-large-turbo" in paper.models
    assert "# biasaudit parameters" in params_path.read_text()  # comments survive
    assert apply_profile("paper", params_path, profiles) == paper  # idempotent
    apply_profile("offline", params_path, profiles)
    assert params_path.read_bytes() == original
    assert not (profile_sandbox / ".params-restore.yaml").exists()
    with pytest.raises(ParamsError, match="unknown profile 'nope'"):
        apply_profile("nope", params_path, profiles)


def test_the_canadian_profile_validates_and_runs_on_its_group_set(profile_sandbox):
    """profiles/offline-ca-vm.yaml (the planted-truth demo on ca-vm): valid against the schema, every per-group
    key is the Canadian set's, the planted distortions are its labels, and switching back is byte for byte."""
    from biasaudit import groupsets

    params_path, profiles = profile_sandbox / "params.yaml", profile_sandbox / "profiles"
    original = params_path.read_bytes()
    ca = apply_profile("offline-ca-vm", params_path, profiles)
    gs, _ = groupsets.load("ca-vm", ROOT / "data" / "reference" / "groupsets")
    assert ca.profile == "offline-ca-vm" and ca.benchmarks.group_set == "ca-vm" and ca.groups == gs.labels
    assert tuple(ca.classify.labels) == gs.labels and set(ca.classify.vlm.sim_confusion) == set(gs.labels)
    assert " ".join(ca.classify.instruction.split()) == " ".join(gs.classifier.instruction.split())
    assert ca.prompts.categories == list(gs.categories) == ["geography"]
    assert ca.prompts.templates["geography"] == gs.categories["geography"].template
    for spec in ca.models.values():
        assert spec.backend == "planted" and set(spec.planted.L_mean) == set(gs.labels)
        assert set(spec.planted.scale) | {spec.planted.receiver} <= set(gs.labels)
    # more than two prompts: instances at or above min_size, top_k per group, none selected twice
    from biasaudit.t2i import prompts as pr

    bench = groupsets.benchmark_table(gs, "geography", ROOT / "data" / "reference" / "groupsets" / "ca-vm")
    chosen = pr.select_instances(bench, ca.prompts.top_k, ca.prompts.min_size["geography"], gs.labels)
    assert len(chosen) == 2 * ca.prompts.top_k == 10
    apply_profile("offline", params_path, profiles)
    assert params_path.read_bytes() == original


def test_an_edit_made_in_the_paper_profile_survives_switching_back(profile_sandbox):
    params_path, profiles = profile_sandbox / "params.yaml", profile_sandbox / "profiles"
    apply_profile("paper", params_path, profiles)
    params_path.write_text(params_path.read_text().replace("figure_dpi: 150", "figure_dpi: 300"))
    back = apply_profile("offline", params_path, profiles)
    expected = validate(raw_params()).model_dump()
    expected["analyze"]["figure_dpi"] = 300
    assert back.model_dump() == expected


def test_key_shaped_env_values_are_rejected_without_echoing_them(capsys, tmp_path):
    """Every *_env field in every section (generators, classify.vlm, vlms.*, counterfactuals)."""
    fake = "sk-proj-Zq81xYv0aBcDeFgHiJkLmNoPqRsTuV"
    google = "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUv"
    token = "X9FQ2ZT7LM4K8PWR3NBV6CJD"  # capitals and digits only, still a token, not a name
    for where in (("classify", "vlm"), ("counterfactuals",), ("vlms", "tiny"), ("models", "planted-a")):
        for secret in (fake, google, token):
            raw = raw_params()
            node = raw
            for part in where:
                node = node[part]
            node["api_key_env"] = secret
            with pytest.raises(ParamsError) as err:
                validate(raw)
            assert "api_key_env" in str(err.value) and secret not in str(err.value), where
            assert secret[4:12] not in str(err.value)
            path = tmp_path / "params.yaml"
            path.write_text(yaml.safe_dump(raw))
            assert main(["check", str(path)]) == 2
            out = capsys.readouterr()
            assert secret not in out.out + out.err and "api_key_env" in out.err
    raw = raw_params()
    raw["classify"]["vlm"]["api_key_env"] = "GEMINI_API_KEY"
    validate(raw)  # a name is fine


def test_other_errors_never_echo_a_secret_either():
    raw = raw_params()
    raw["classify"]["vlm"]["base_url"] = 12  # wrong type: the value is shown …
    raw["reflect"]["prompt_version"] = ["sk-proj-Zq81xYv0aBcDeFgHiJkLmNoPqRsTuV"]  # … unless it looks like a key
    with pytest.raises(ParamsError) as err:
        validate(raw)
    assert "(got 12)" in str(err.value) and "Zq81xYv0" not in str(err.value)


def test_params_file_loads():
    assert load_params(ROOT / "params.yaml").profile == "offline"


@pytest.mark.parametrize("profile", sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml")))
def test_a_run_is_real_only_when_nothing_in_it_is_a_stand_in(profile_sandbox, profile):
    """One banner rule under every profile: the offline profiles (planted generators, simulated classifier and
    raters, the tiny VLM and editor, packaged photos) and the referee profile (every model planted) are stand-in runs
    whatever their name; paper and current are real. The oracle is each profile's own backends, listed by hand."""
    cfg = apply_profile(profile, profile_sandbox / "params.yaml", profile_sandbox / "profiles")
    fakes = cfg.stand_ins()
    if profile.startswith("offline"):
        for part in ("models.planted-a: planted", "classify.vlm: simulated", "vlms.planted: planted", "vlms.tiny: tiny",
                     "counterfactuals: tiny", "reliability.simulate: SIMULATED raters"):
            assert part in fakes, (profile, part)
    elif profile == "referee":  # every model PLANTED at the published values (docs/referee.md)
        for part in ("models.imagen-4-fast: planted", "models.sd35-large-turbo: planted", "models.flux-schnell: planted",
                     "classify.vlm: simulated", "vlms.gpt-5: planted", "reliability.simulate: SIMULATED raters"):
            assert part in fakes, (profile, part)
    else:
        assert fakes == [], (profile, fakes)
    swapped = cfg.model_copy(update={"counterfactuals": cfg.counterfactuals.model_copy(update={"backend": "tiny"})})
    assert "counterfactuals: tiny" in swapped.stand_ins()  # one stand-in part is enough, under any profile


# Fields no code reads, each with why it stays: the test below fails when one of them starts being read too
# (drop it here) or another field joins them.
UNREAD: dict[tuple[str, str], str] = {
    ("Price", "per_image"): "no stage reads it: benchmarks/cost_model.py prices the generated and edited images",
}
READERS = ("src", "notebooks", "scripts")  # the schema itself (src/biasaudit/params) left out


def field_reads(sources=None):
    from .field_reads import Reads

    reads = Reads()
    sources = sources or [p for d in READERS for p in sorted((ROOT / d).rglob("*.py"))
                          if not p.is_relative_to(ROOT / "src/biasaudit/params")]
    reads.scan(sources, ROOT)
    return reads


def test_every_params_field_is_read_through_its_section():
    """Each field of each section is read somewhere through an object that holds that section
    (tests/field_reads.py: `cfg.analyze.seed` reads Analyze.seed, never Params.seed or Boot's), so removing the
    one read of a field fails this test even when another section has a field of the same name."""
    reads = field_reads()
    fields = {(name, f) for name, cls in reads.schema.items() for f in cls.model_fields}
    unread = fields - reads.read
    assert unread == set(UNREAD), f"read nowhere: {sorted(unread - set(UNREAD))}; read now: {sorted(set(UNREAD) - unread)}"


def test_the_field_reader_resolves_reads_by_section_not_by_name(tmp_path):
    """Planted sources: a field read through its section's path counts for that section only; the same name on
    another section, a dict key or an untyped object does not."""
    src = tmp_path / "planted.py"
    src.write_text(
        "from biasaudit.notebook import stage_params\n"
        "def f(p: ReflectAnalysis, q):\n"
        "    return p.n_boot, q.n_permutations, {'seed': 1}['seed']\n"
        "cfg, section = stage_params('analyze')\n"
        "x = section.min_group_size\n"
        "spec = cfg.vlms['v']\n"
        "y = getattr(spec, 'two_afc_mode')\n"
        "for name, gen in cfg.models.items():\n"
        "    z = gen.width\n"
        "w = cfg.execution.ray.num_workers\n")
    reads = field_reads([src])
    read = reads.read
    assert {("ReflectAnalysis", "n_boot"), ("Analyze", "min_group_size"), ("Params", "analyze"),
            ("Params", "vlms"), ("VLMSpec", "two_afc_mode"), ("Params", "models"), ("GeneratorSpec", "width"),
            ("Params", "execution"), ("Execution", "ray"), ("RayOptions", "num_workers")} <= read
    assert ("Analyze", "n_boot") not in read and ("Analyze", "seed") not in read and ("Params", "seed") not in read
    assert not any(f == "n_permutations" for _, f in read)  # read through an untyped name: not counted
