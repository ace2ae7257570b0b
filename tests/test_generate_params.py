"""Generation parameters: schema errors name the key; preflight stops before any work."""

import pandas as pd
import pytest

from biasaudit.config import ParamsError, read_yaml, validate
from biasaudit.params.generate import GeneratorSpec
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.t2i.generate import image_id, plan_items, preflight

from .conftest import ROOT


def params_with(models: dict, **generate) -> dict:
    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = models
    raw["generate"] = {**raw["generate"], **generate}
    return raw


@pytest.mark.parametrize("spec, key", [
    ({"backend": "midjourney"}, "backend"),
    ({"backend": "tiny"}, "architecture"),
    ({"backend": "tiny", "architecture": "sd3", "width": 100}, "width"),
    ({"backend": "diffusers", "model_id": "x/y", "height": 8}, "height"),
    ({"backend": "diffusers", "model_id": "x/y", "width": 8192}, "width"),
    ({"backend": "diffusers"}, "model_id"),
    ({"backend": "imagen", "model_id": "imagen-4.0-fast-generate-001", "api_key_env": "K", "width": 1000}, "width"),
    ({"backend": "imagen", "model_id": "imagen-4.0-fast-generate-001"}, "api_key_env"),
    ({"backend": "openai", "model_id": "dall-e-3", "api_key_env": "K", "width": 512, "height": 512}, "width"),
    ({"backend": "openai", "model_id": "gpt-image-1", "api_key_env": "sk-proj-abc123"}, "api_key_env"),
    ({"backend": "folder", "folder": "x"}, "mapping_csv"),
    ({"backend": "packaged-photos", "stepz": 3}, "stepz"),
    ({"backend": "diffusers", "model_id": "x/y", "device": "cpu", "cpu_offload": "model"}, "cpu_offload"),
])
def test_schema_errors_name_the_key(spec, key):
    with pytest.raises(ParamsError) as err:
        validate(params_with({"m": spec}))
    assert "models.m" in str(err.value) and key in str(err.value)


def test_bad_model_name_and_generate_keys():
    with pytest.raises(ParamsError, match="models"):
        validate(params_with({"Bad Name/": {"backend": "packaged-photos"}}))
    with pytest.raises(ParamsError, match="generate.images_per_prompt"):
        validate(params_with({}, images_per_prompt=0))
    raw = params_with({})
    raw["execution"] = {**raw["execution"], "shard_index": 2, "shard_count": 2}
    with pytest.raises(ParamsError, match="execution: .*shard_index"):
        validate(raw)
    with pytest.raises(ParamsError, match="generate.shard_index"):  # moved to the shared execution section
        validate(params_with({}, shard_index=0))


def test_both_profiles_validate_without_network(tmp_path):
    import shutil

    from biasaudit.config import apply_profile

    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    for name in ("offline", "paper"):
        cfg = apply_profile(name, tmp_path / "params.yaml", ROOT / "profiles")
        assert cfg.models and cfg.profile == name
    paper = cfg
    sd = paper.models["sd35-large-turbo"]
    assert (sd.num_inference_steps, sd.guidance_scale, sd.width, sd.height) == (4, 0.0, 1024, 1024)
    flux = paper.models["flux-schnell"]
    assert (flux.num_inference_steps, flux.guidance_scale, flux.max_sequence_length) == (4, 0.0, 256)
    assert paper.models["imagen-4-fast"].backend == "imagen"


def test_preflight_paper_hub_ids_fail_clearly_when_weights_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    cfg = validate({**read_yaml(ROOT / "params.yaml"), "models": read_yaml(ROOT / "profiles/paper.yaml")["models"]})
    with pytest.raises(ParamsError) as err:
        preflight("sd35-large-turbo", cfg)
    msg = str(err.value)
    assert "models.sd35-large-turbo.model_id" in msg and "not in the local Hugging Face cache" in msg
    with pytest.raises(ParamsError, match="models.imagen-4-fast.api_key_env: environment variable GOOGLE_API_KEY"):
        preflight("imagen-4-fast", cfg)
    with pytest.raises(ParamsError, match="unknown model 'nope'"):
        preflight("nope", cfg)


def test_preflight_missing_local_path_and_folder(tmp_path):
    cfg = validate(params_with({
        "local": {"backend": "diffusers", "model_id": str(tmp_path / "no-such-dir"), "device": "cpu"},
        "imported": {"backend": "folder", "folder": str(tmp_path), "mapping_csv": str(tmp_path / "map.csv")},
    }))
    with pytest.raises(ParamsError, match=r"models.local.model_id: local path .* does not exist"):
        preflight("local", cfg)
    with pytest.raises(ParamsError, match=r"models.imported.mapping_csv: file .* does not exist"):
        preflight("imported", cfg)


def test_folder_generator_names_links_loops_and_folders(tmp_path):
    """Mapped entries of a folder generator that are no image file stop the stage with what they are."""
    from biasaudit.backends.generators.folder import read_mapping

    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "ok.png").write_bytes(b"x")
    (tmp_path / "img" / "dangling.png").symlink_to("deleted.png")
    (tmp_path / "img" / "loop.png").symlink_to("loop.png")
    (tmp_path / "img" / "x.jpg").mkdir()
    files = ["ok.png", "dangling.png", "loop.png", "x.jpg", "absent.png"]
    pd.DataFrame({"file": files, "prompt_id": ["p"] * 5}).to_csv(tmp_path / "map.csv", index=False)
    _, problems = read_mapping(tmp_path / "img", tmp_path / "map.csv")
    text = "\n".join(problems)
    assert "1 file(s) not found" in text and "'absent.png'" in text  # nothing there at all
    assert "3 entries of" in text
    assert "dangling.png (broken link: 'dangling.png' → 'deleted.png'" in text
    assert "loop.png (link loop" in text and "x.jpg (a directory, not a file)" in text
    assert "ok.png" not in text
    cfg = validate(params_with({"imported": {"backend": "folder", "folder": str(tmp_path / "img"),
                                             "mapping_csv": str(tmp_path / "map.csv")}}))
    with pytest.raises(ParamsError, match=r"models.imported.mapping_csv: 3 entries .*broken link"):
        preflight("imported", cfg)


def test_seeds_and_plan_are_deterministic_and_index_major():
    spec = GeneratorSpec(backend="packaged-photos", width=64, height=64)
    prompts = pd.DataFrame({"prompt_id": ["p1", "p2"], "prompt": ["a", "b"], "template_version": ["v1", "v1"]})
    items = plan_items(prompts, "m", 3, spec)
    assert [it["image_id"] for it in items[:3]] == ["m-p1-000", "m-p2-000", "m-p1-001"]
    assert image_id("m", "p2", 12) == "m-p2-012"
    assert items[0]["seed"] == derive_seed("m", "p1", 0) == plan_items(prompts, "m", 3, spec)[0]["seed"]
    assert len({it["seed"] for it in items}) == 6
    assert derive_seed("other", "p1", 0) != items[0]["seed"]


def test_papermill_reads_every_notebook_parameter():
    """papermill silently skips a parameter line it cannot parse (e.g. '=' or ': ' in its comment);
    the instance keys (the only notebook parameters) must all be seen."""
    import jupytext
    from papermill.translators import PythonTranslator

    for path in sorted((ROOT / "notebooks").glob("*.py")):
        nb = jupytext.read(path)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        names = [p.name for p in PythonTranslator.inspect(cell)]
        declared = [line.split(":")[0] for line in cell.source.splitlines() if line and not line.startswith("#")]
        assert names == declared, path.name
        assert names == {"t2i_generate.py": ["model"], "t2i_classify.py": ["model"], "t2i_faces.py": ["model"],
                         "vlm_reflect.py": ["vlm"]}.get(path.name, []), path.name
