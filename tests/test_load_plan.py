"""Loading without CPU-RAM staging: the offload decision is made before loading, from the sizes the
safetensors headers give, so that a pipeline that fits loads straight onto the GPU (diffusers' device_map).
The planned sizes are checked against the tensors of the loaded pipeline (its state dicts)."""

from __future__ import annotations

import pytest

from biasaudit.backends.generators.diffusers_backend import GIB, planned_bytes, straight_to_device
from biasaudit.params.generate import GeneratorSpec


@pytest.fixture(scope="module", params=["sd3", "flux"])
def tiny(request, tmp_path_factory):
    from biasaudit.tiny.diffusion import ensure_tiny_pipeline

    directory, _ = ensure_tiny_pipeline(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, directory


def _state_bytes(module, itemsize: int | None = None) -> int:
    """Bytes of the module's state-dict tensors, each storage once (T5 ties its embeddings)."""
    unique = {t.data_ptr(): t for t in module.state_dict().values()}
    return sum(t.numel() * (itemsize if itemsize and t.is_floating_point() else t.element_size())
               for t in unique.values())


def test_planned_sizes_are_the_loaded_tensors(tiny):
    import diffusers

    arch, directory = tiny
    pipe = diffusers.DiffusionPipeline.from_pretrained(directory)
    loaded = {name: _state_bytes(c) for name, c in pipe.components.items() if hasattr(c, "state_dict")}
    assert planned_bytes(directory, 4) == loaded
    assert planned_bytes(directory, 2) == {name: _state_bytes(c, 2) for name, c in pipe.components.items()
                                           if hasattr(c, "state_dict")}  # bf16: floats at 2 bytes
    assert planned_bytes(directory.parent / "nowhere", 4) is None


def test_straight_to_the_gpu_only_when_no_offload_is_needed(tiny):
    _, directory = tiny
    spec = GeneratorSpec(backend="diffusers", model_id=str(directory), cpu_offload="auto", device="cuda",
                         width=1024, height=1024, batch_size=1)
    assert straight_to_device(str(directory), spec, "cuda", 80 * GIB, 2)[0] == "cuda"
    assert straight_to_device(str(directory), spec, "cuda", 1, 2)[0] == ""  # auto would offload: host RAM first
    model = spec.model_copy(update={"cpu_offload": "model"})
    assert straight_to_device(str(directory), model, "cuda", 80 * GIB, 2)[0] == ""
    assert straight_to_device(str(directory), spec, "cpu", None, 4)[0] == ""
    assert straight_to_device("org/hub-id", spec, "cuda", 80 * GIB, 2)[0] == ""  # nothing local to plan from
