"""The local transformers VLM backend over a tiny random-weight Qwen2-VL (real classes, built offline).

Random weights: these tests check the plumbing (chat template, image order, batching, option
probabilities, failures, caching), never what a model "thinks".
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from biasaudit.backends.vlm import CachedVLM, VLMRequest, make_vlm_backend, parse_choice
from biasaudit.params.classify import VLMSpec

LABELS = ("white", "black", "asian", "hispanic", "other")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="module")
def backend(tiny_root):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIASAUDIT_TINY_DIR", str(tiny_root))
        mp.setenv("HF_HUB_OFFLINE", "1")
        return make_vlm_backend(VLMSpec(backend="tiny", model_id="tiny-qwen2-vl", local_batch_size=4))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Eight different images: the astronaut photo at eight brightness shifts (astronaut.png = shift 0)."""
    from skimage import data

    d = tmp_path_factory.mktemp("img")
    base = data.astronaut().astype(int)
    paths = []
    for k, shift in enumerate((0, -80, -40, 40, 80, -20, 20, 60)):
        p = d / f"img{k}.png"
        Image.fromarray(np.clip(base + shift, 0, 255).astype(np.uint8)).resize((128, 128)).save(p)
        paths.append(str(p))
    return paths


def test_tiny_model_builds_offline_and_round_trips(tiny_root, backend, monkeypatch):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2VLForConditionalGeneration

    from biasaudit.tiny.vlm import ensure_tiny_qwen2_vl, make_tiny_qwen2_vl, weights_hash

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path, revision = ensure_tiny_qwen2_vl(tiny_root)  # built by the fixture: reused, not rebuilt
    assert path == tiny_root / "tiny-qwen2-vl" and revision == weights_hash(path) == backend.revision
    assert revision.startswith("sha256:") and backend.stand_in and backend.model_id == "tiny-qwen2-vl"
    fresh, processor = make_tiny_qwen2_vl(seed=0)  # same seed → same weights as the saved files
    loaded = AutoModelForImageTextToText.from_pretrained(path)
    assert isinstance(loaded, Qwen2VLForConditionalGeneration)
    n_params = sum(p.numel() for p in loaded.parameters())
    assert 50_000 < n_params < 1_000_000
    saved = loaded.state_dict()
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(saved[name], tensor), name
    proc = AutoProcessor.from_pretrained(path)
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                    add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n<|im_start|>assistant\n")
    assert proc.tokenizer.convert_tokens_to_ids("<|image_pad|>") == loaded.config.image_token_id
    assert proc.tokenizer.get_vocab() == processor.tokenizer.get_vocab()


def test_single_and_two_image_requests(backend, images):
    reqs = [VLMRequest(images=(images[0],), prompt="Describe the person.", max_tokens=6),
            VLMRequest(images=(images[0], images[1]), prompt="Who earns more, A or B?", options=("A", "B")),
            VLMRequest(images=(images[1], images[0]), prompt="Who earns more, A or B?", options=("A", "B"))]
    one, ab, ba = backend.generate(reqs)
    assert one.status == "ok" and one.option_probs is None and one.tokens_in > 0 and 1 <= one.tokens_out <= 6
    assert ab.status == ba.status == "ok" and ab.tokens_out == 1
    assert ab.tokens_in > one.tokens_in  # the second image's tokens are in the prompt
    assert ab.option_probs != pytest.approx(ba.option_probs, abs=1e-6)  # image order reaches the model


def test_option_probs_sum_to_one_and_answers_parse(backend, images):
    reqs = [VLMRequest(images=(p,), prompt="Race? One word.", options=LABELS) for p in images[:4]]
    reqs += [VLMRequest(images=(images[0],), prompt="Salary bracket?", options=tuple("ABCDEF"))]
    for req, r in zip(reqs, backend.generate(reqs)):
        assert r.status == "ok" and set(r.option_probs) == set(req.options)
        assert sum(r.option_probs.values()) == pytest.approx(1.0, abs=1e-5)
        assert all(0.0 <= v <= 1.0 for v in r.option_probs.values())
        assert r.text == max(r.option_probs, key=r.option_probs.get)
        assert parse_choice(r.text, req.options) == (r.text, "")


def test_unconstrained_keeps_option_probs_of_the_same_forward(backend, images):
    """Without constrain the greedy text is free, and option_probs match the constrained scoring."""
    req = VLMRequest(images=(images[2],), prompt="Race? One word.", options=LABELS, max_tokens=5)
    constrained = backend.generate([req])[0]
    free_spec = backend.spec.model_copy(update={"constrain": False})
    spec, backend.spec = backend.spec, free_spec
    try:
        free = backend.generate([req])[0]
    finally:
        backend.spec = spec
    assert free.status == "ok" and free.tokens_out <= 5
    assert free.option_probs == pytest.approx(constrained.option_probs, abs=1e-5)
    choice, reason = parse_choice(free.text, LABELS)  # random text: a choice or a recorded reason
    assert choice in LABELS or reason


def test_outputs_vary_with_the_image(backend, images):
    free = backend.generate([VLMRequest(images=(p,), prompt="Describe the person.", max_tokens=8) for p in images])
    probs = backend.generate([VLMRequest(images=(p,), prompt="Race?", options=LABELS) for p in images])
    assert all(r.status == "ok" for r in free + probs)
    assert len({r.text for r in free}) >= 7, [r.text for r in free]
    assert len({r.text for r in probs}) >= 2, [r.text for r in probs]  # not always the same label
    p = np.array([[r.option_probs[o] for o in LABELS] for r in probs])
    assert p.std(axis=0).max() > 0.1  # transformers' default init std (0.02) gives < 0.01


def test_batched_equals_one_by_one(backend, images):
    reqs = [VLMRequest(images=(images[0],), prompt="Short?", options=("A", "B")),
            VLMRequest(images=(images[1], images[2]), prompt="A much longer question about the two images?",
                       options=("A", "B")),
            VLMRequest(images=(images[3],), prompt="Describe.", max_tokens=4)]
    batched = backend.generate(reqs)
    single = [backend.generate([r])[0] for r in reqs]
    for b, s in zip(batched, single):
        assert b.text == s.text and b.tokens_in == s.tokens_in
        if s.option_probs:
            assert b.option_probs == pytest.approx(s.option_probs, abs=1e-4)


def test_a_stand_in_answers_on_one_thread_whatever_the_process_uses(backend, images):
    """The tiny stand-in's forward passes run on one torch thread (their sums then do not depend on the
    machine's cores) and the process's own thread count is restored afterwards."""
    import torch

    seen = []
    hook = backend.model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    reqs = [VLMRequest(images=(p,), prompt="Race? One word.", options=LABELS) for p in images[:3]]
    before = torch.get_num_threads()
    answers = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            answers[threads] = [(r.text, r.option_probs) for r in backend.generate(reqs)]
            assert torch.get_num_threads() == threads
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}
    assert answers[1] == answers[2]  # exactly: the same single-thread sums


def test_bad_items_fail_alone_with_a_reason(backend, images, tmp_path):
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    seen: dict[int, str] = {}
    out = backend.generate([VLMRequest(images=(images[0],), prompt="A or B?", options=("A", "B")),
                            VLMRequest(images=(images[0], str(corrupt)), prompt="A or B?", options=("A", "B")),
                            VLMRequest(images=(str(tmp_path / "missing.png"),), prompt="x"),
                            VLMRequest(images=(images[0],), prompt="x", options=("A", "A"))],
                           on_result=lambda i, r: seen.__setitem__(i, r.status))
    assert [r.status for r in out] == ["ok", "failed", "failed", "failed"]
    assert "corrupt.png" in out[1].reason and "missing.png" in out[2].reason
    assert "duplicate options" in out[3].reason
    assert seen == {0: "ok", 1: "failed", 2: "failed", 3: "failed"}


def test_uncached_hub_id_offline_names_the_key(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = VLMSpec(backend="transformers", model_id="biasaudit-test/not-a-cached-model")
    with pytest.raises(ValueError, match=r"model_id.*biasaudit-test/not-a-cached-model.*HF_HUB_OFFLINE"):
        make_vlm_backend(spec)
    with pytest.raises(ValueError, match="model_id"):
        make_vlm_backend(VLMSpec(backend="transformers", model_id="./no/such/folder"))


def test_transformers_backend_loads_a_local_folder(tiny_root, backend, images):
    """backend: transformers with model_id = a local folder (the paper path for a downloaded checkpoint)."""
    spec = VLMSpec(backend="transformers", model_id=str(tiny_root / "tiny-qwen2-vl"))
    local = make_vlm_backend(spec)
    assert local.name == "transformers" and not local.stand_in and local.revision.startswith("local-")
    req = VLMRequest(images=(images[4],), prompt="Race?", options=LABELS)
    assert local.generate([req])[0].option_probs == pytest.approx(backend.generate([req])[0].option_probs, abs=1e-6)


def test_cached_vlm_makes_no_calls_on_a_second_pass(backend, images, tmp_path):
    reqs = [VLMRequest(images=(p,), prompt="Race?", options=LABELS) for p in images[:3]]
    reqs.append(VLMRequest(images=(images[0], images[1]), prompt="Describe both.", max_tokens=4))
    first = CachedVLM(backend, tmp_path / "cache.sqlite")
    out1 = first.generate(reqs)
    assert first.accounting.calls == 4 and first.accounting.cache_hits == 0
    second = CachedVLM(backend, tmp_path / "cache.sqlite")
    out2 = second.generate(reqs)
    assert second.accounting.calls == 0 and second.accounting.cache_hits == 4
    assert all(r.from_cache for r in out2)
    assert [r.text for r in out2] == [r.text for r in out1]
    assert [r.option_probs for r in out2] == [r.option_probs for r in out1]


def test_options_sharing_a_first_token_are_scored_by_sequence_likelihood(backend, images):
    """Words the small vocabulary splits alike ('he'/'hello') cannot be told apart by their first
    token; they are scored by whole-sequence log-likelihood instead of failing."""
    options = ("hello", "help", "world")
    ids, reason = backend.first_tokens(options)
    if ids is not None:
        pytest.skip("this tiny vocabulary gives these options distinct first tokens")
    (response,) = backend.generate([VLMRequest((images[0],), "Pick one.", options)])
    assert response.status == "ok", response.reason
    assert set(response.option_probs) == set(options)
    assert sum(response.option_probs.values()) == pytest.approx(1.0)
    assert all(0 < p < 1 for p in response.option_probs.values())


def test_saving_a_stand_in_prints_no_progress_bar_and_restores_them(tmp_path, capfd):
    """Building the tiny model (save_pretrained) wrote a "Writing model shards" bar amid a stage's output;
    now nothing, and transformers' bars are on again afterwards (a later download shows its bar)."""
    from transformers.utils import logging as hf_logging

    from biasaudit.tiny.vlm import ensure_tiny_qwen2_vl

    hf_logging.enable_progress_bar()
    capfd.readouterr()
    ensure_tiny_qwen2_vl(tmp_path, seed=3)  # a fresh build, not the fixture's
    err = capfd.readouterr().err
    assert "Writing model shards" not in err and "it/s]" not in err, err
    assert hf_logging.is_progress_bar_enabled()
    for _ in hf_logging.tqdm(range(2), desc="after the save"):
        pass
    assert "after the save" in capfd.readouterr().err
