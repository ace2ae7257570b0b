"""Local pipelines: the cpu_offload choice from free VRAM and measured component sizes, the SD3 T5
drop, and NaN / all-black outputs as `failed: numerical` (retried with new recorded seeds)."""

from types import SimpleNamespace

import numpy as np
import pytest

from biasaudit.backends.generators.base import GenRequest
from biasaudit.backends.generators.diffusers_backend import (
    GIB,
    DiffusersGenerator,
    activation_bytes,
    choose_offload,
    numerical_fault,
    retry_seed,
)
from biasaudit.params.generate import GeneratorSpec

# bf16 weights from the published parameter counts (2 bytes each): SD 3.5 Large = 8.1 B transformer,
# T5-XXL encoder 4.76 B, CLIP-L 0.12 B + CLIP-G 0.69 B, VAE 0.08 B; FLUX.1-schnell = 11.9 B transformer,
# T5-XXL 4.76 B, CLIP-L 0.12 B, VAE 0.08 B.
SD35 = {"transformer": int(8.1e9 * 2), "text_encoder_3": int(4.76e9 * 2), "text_encoder": int(0.12e9 * 2),
        "text_encoder_2": int(0.69e9 * 2), "vae": int(0.08e9 * 2)}
FLUX = {"transformer": int(11.9e9 * 2), "text_encoder_2": int(4.76e9 * 2), "text_encoder": int(0.12e9 * 2),
        "vae": int(0.08e9 * 2)}


@pytest.mark.parametrize("card_gb, batch, sd35, flux", [
    (24, 1, "model", "sequential"),       # FLUX's 22 GiB transformer alone does not fit a 24 GB card
    (24, 4, "sequential", "sequential"),
    (48, 4, "none", "none"),
    (80, 4, "none", "none"),
])
def test_offload_choice_per_card(card_gb, batch, sd35, flux):
    free = int(card_gb * 1e9 * 0.97)  # what a fresh process sees free (driver/context take the rest)
    act = activation_bytes(1024, 1024, batch)
    assert choose_offload(free, SD35, act) == sd35
    assert choose_offload(free, FLUX, act) == flux


def test_offload_rule_from_its_definition():
    comps = {"a": 10 * GIB, "b": 5 * GIB}
    assert choose_offload(None, comps, GIB) == "none"  # no CUDA
    assert choose_offload(int(16 * GIB / 0.92) + 1, comps, GIB) == "none"   # 15 + 1 fits
    assert choose_offload(int(16 * GIB / 0.92) - 1, comps, GIB) == "model"  # only 10 + 1 fits
    assert choose_offload(int(11 * GIB / 0.92) - 1, comps, GIB) == "sequential"


def test_numerical_fault():
    ok = np.full((8, 8, 3), 0.5, np.float32)
    assert numerical_fault(ok) == ""
    nan = ok.copy()
    nan[0, 0, 0] = np.nan
    assert numerical_fault(nan).startswith("numerical: 1 NaN")
    assert numerical_fault(np.zeros((8, 8, 3), np.float32)).startswith("numerical: all-black")
    assert numerical_fault(np.full((8, 8, 3), 9 / 255, np.float32)) == ""  # dark, not black


class FakePipe:
    """Decodes NaN for the seeds in `bad`, mid-grey otherwise (what the backend does with it is tested)."""

    def __init__(self, bad):
        self.bad, self.seeds = set(bad), []

    def __call__(self, prompt, height, width, generator, output_type, **kw):
        images = []
        for g in generator:
            seed = g.initial_seed()
            self.seeds.append(seed)
            images.append(np.full((height, width, 3), np.nan if seed in self.bad else 0.5, np.float32))
        return SimpleNamespace(images=images)


def _gen(spec, pipe):
    gen = DiffusersGenerator.__new__(DiffusersGenerator)
    gen.spec, gen.pipe, gen.stand_in = spec, pipe, False
    return gen


def _req(i, seed):
    return GenRequest(f"m-p-{i:03d}", "p", "a nurse", i, seed, 16, 16)


def test_nan_image_is_failed_numerical_not_refused_and_retried_with_new_seed():
    spec = GeneratorSpec(backend="tiny", architecture="sd3", width=16, height=16)
    [res, good] = _gen(spec, FakePipe({11})).generate([_req(0, 11), _req(1, 12)])
    assert res.status == "failed" and res.reason.startswith("numerical:") and res.rgb is None
    assert good.status == "ok" and good.rgb.dtype == np.uint8 and int(good.rgb[0, 0, 0]) == 128
    retry = spec.model_copy(update={"numerical_retries": 2})
    pipe = FakePipe({11, retry_seed(11, 1)})
    [res] = _gen(retry, pipe).generate([_req(0, 11)])
    assert res.status == "ok" and res.retries == 2
    assert res.extra["numerical_retry_seed"] == retry_seed(11, 2)
    assert res.extra["seeds_tried"] == [11, retry_seed(11, 1), retry_seed(11, 2)] == pipe.seeds
    pipe = FakePipe({11, retry_seed(11, 1), retry_seed(11, 2)})
    [res] = _gen(retry, pipe).generate([_req(0, 11)])
    assert res.status == "failed" and res.reason.startswith("numerical") and len(res.extra["seeds_tried"]) == 3


@pytest.mark.slow
def test_tiny_sd3_auto_offload_on_cpu_and_t5_drop_recorded(tmp_path):
    from biasaudit.backends.generators.diffusers_backend import make_tiny

    spec = GeneratorSpec(backend="tiny", architecture="sd3", width=32, height=32, num_inference_steps=1,
                         device="cpu", dtype="fp32", cpu_offload="auto", drop_t5=True, max_sequence_length=16)
    gen = make_tiny("tiny-sd3", spec, tmp_path)
    mem = gen.settings()["memory"]
    assert mem["cpu_offload"] == "none" and mem["cpu_offload_requested"] == "auto" and mem["drop_t5"]
    assert gen.pipe.text_encoder_3 is None and mem["pipeline_gib"] > 0
    [res] = gen.generate([_req(0, 5)])
    assert res.status in ("ok", "failed")  # random weights: an image or a numerical fault, never 'refused'
    with pytest.raises(ValueError, match="drop_t5"):
        GeneratorSpec(backend="tiny", architecture="flux", drop_t5=True)
