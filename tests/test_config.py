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


def test_profiles_list_the_same_keys():
    paper = read_yaml(ROOT / "profiles/paper.yaml")
    offline = read_yaml(ROOT / "profiles/offline.yaml")
    assert set(paper) == set(offline)


def test_default_params_are_the_offline_profile(profile_sandbox):
    before = (profile_sandbox / "params.yaml").read_text()
    apply_profile("offline", profile_sandbox / "params.yaml", profile_sandbox / "profiles")
    assert yaml.safe_load((profile_sandbox / "params.yaml").read_text()) == yaml.safe_load(before)


def test_switching_to_paper_and_back_is_lossless(profile_sandbox):
    params_path, profiles = profile_sandbox / "params.yaml", profile_sandbox / "profiles"
    original = params_path.read_text()
    paper = apply_profile("paper", params_path, profiles)
    assert paper.profile == "paper" and paper.prompts.top_k == 10
    assert "# biasaudit parameters" in params_path.read_text()  # comments survive
    apply_profile("offline", params_path, profiles)
    assert yaml.safe_load(params_path.read_text()) == yaml.safe_load(original)
    assert "# biasaudit parameters" in params_path.read_text()
    with pytest.raises(ParamsError, match="unknown profile 'nope'"):
        apply_profile("nope", params_path, profiles)


def test_params_file_loads():
    assert load_params(ROOT / "params.yaml").profile == "offline"
