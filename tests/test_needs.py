"""`biasaudit check --stage <instance>` lists what that stage instance needs, for every instance of the
paper profile: the expected needs are read off the profile's own parameters, not from weights.needs."""

import pytest

from biasaudit import lifecycle, weights
from biasaudit.cli import profile_params

from .conftest import ROOT


@pytest.fixture(scope="module")
def paper():
    return profile_params("paper", ROOT / "params.yaml")


def needed_by(cfg, stage):
    return {n.used_by for n in weights.needs(cfg) if n.for_stage(stage)}


def test_every_faces_instance_lists_the_face_weights(paper):
    f = paper.faces
    expected = {"faces.clip_pretrained"} | ({"faces.insightface_root"} if f.detector == "insightface" else set()) \
        | ({"faces.bisenet_weights"} if f.skin_method == "bisenet" else set())
    assert len(paper.models) >= 3
    for model in paper.models:
        assert needed_by(paper, f"faces@{model}") == expected, model


def whats(cfg, stage):
    return {n.what for n in weights.needs(cfg) if n.for_stage(stage)}


def test_every_generate_and_reflect_instance_lists_its_own_model(paper):
    for name, spec in paper.models.items():
        got = needed_by(paper, f"generate@{name}")
        own = {f"models.{name}.model_id"} if spec.backend == "diffusers" else \
            ({f"models.{name}.api_key_env"} if spec.api_key_env else set())
        # imagen-4.0-fast-generate-001's quoted shutdown date has passed: its model is a need (retired) too
        if lifecycle.stop_reason(spec.model_id):
            own |= {f"models.{name}.model_id"}
        assert got == own, name
    for name, spec in paper.vlms.items():
        own = {spec.api_key_env, spec.base_url} - {""}  # its API key, or the local server it talks to
        assert own & whats(paper, f"reflect@{name}"), name
    # a key shared by several stages (Gemini: classify, reflect, the FOCUS edits) is listed for each of them
    key = paper.classify.vlm.api_key_env
    assert all(key in whats(paper, s) for s in ("classify@sd35-large-turbo", "counterfactuals", "reflect@gemini-2.5-pro"))


def test_a_shared_need_names_every_stage_once(paper):
    shared = [n for n in weights.needs(paper) if n.used_by == "faces.clip_pretrained"]
    assert len(shared) == 1 and sorted(shared[0].stage.split(", ")) == sorted(f"faces@{m}" for m in paper.models)
