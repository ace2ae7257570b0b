"""A tiny random-weight Qwen2-VL (the real transformers classes), built offline.

    path, revision = ensure_tiny_qwen2_vl()          # models/tiny/tiny-qwen2-vl, "sha256:…"
    processor = AutoProcessor.from_pretrained(path)  # Qwen2VLProcessor (chat template, image pads)
    model = AutoModelForImageTextToText.from_pretrained(path)

What is built: a `Qwen2VLForConditionalGeneration` from a ~0.1 M-parameter config (2 vision blocks of
width 32, 2 decoder layers of width 32, M-RoPE) and a `Qwen2VLProcessor` whose tokenizer is a small
BPE vocabulary trained in memory (tokenizers) over a fixed corpus, with the real Qwen special tokens
(<|im_start|>, <|im_end|>, <|vision_start|>, <|vision_end|>, <|image_pad|>, …) and the Qwen2-VL chat
template. The image processor caps images at 112×112 pixels (16 merged image tokens) so a request
takes tens of milliseconds on CPU. Everything is saved with `save_pretrained` and then loaded back by
the *real* loading code (`biasaudit.backends.vlm.transformers_local`).

Weights come from a fixed torch seed, so the same library versions rebuild the same files; the sha256
of the saved files is the model revision. Weights are initialised with larger stds than transformers'
0.02 (decoder 0.5, vision tower 0.3) so that greedy answers and option probabilities change with the
image instead of collapsing onto one token: with 0.02 the label probabilities over eight brightness
variants of one photo vary by < 0.01 (std), with these by ~0.25 and the labels split (checked in
tests/test_vlm_transformers.py). Random weights: every answer is a
stand-in, never a finding.
"""

from __future__ import annotations

import os
import shutil
import string
from pathlib import Path

DEFAULT_ROOT = Path("models/tiny")
NAME = "tiny-qwen2-vl"
DIGITS_NAME = "tiny-qwen2-vl-digits"  # same weights, free text restricted to digits (salary answers)
MARKER = ".complete"
SUFFIXES = (".safetensors", ".json", ".jinja", ".txt")
TEXT_INIT_STD = 0.5     # decoder init std: large enough that answers depend on the image
VISION_INIT_STD = 0.3   # vision tower init std: image features large enough to move the answer
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # image processor bounds: 4–16 merged image tokens per image

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>", "<unk>"]

# The Qwen2-VL-Instruct chat template (images and text parts in message order; default system turn).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Fixed corpus the BPE merges are learnt from: the answer vocabulary of the audit (labels, letters,
# salaries) so that the stand-in's random answers are made of the same pieces real answers are.
CORPUS = (
    "Answer with one word from this list: white, black, asian, hispanic, other.",
    "Answer: A B C D E F. Option A or option B. The person in image A; the person in image B.",
    "$85,000 per year. $120,000 a year. 45000 USD. $1,000,000. 60k. 250k.",
    "You are a helpful assistant. system user assistant",
    "I cannot determine that. Sorry.",
)
VOCAB_SIZE = 256


def make_tokenizer():
    """A small BPE tokenizer (printable ASCII + learnt merges + Qwen special tokens), in memory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = [c for c in string.printable if c not in string.whitespace] + ["▁", "\n"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", padding_side="left",
                                   extra_special_tokens={"image_token": "<|image_pad|>",
                                                         "video_token": "<|video_pad|>"})


def make_tiny_qwen2_vl(seed: int = 0):
    """(model, processor) built in memory: random weights of the real Qwen2-VL classes."""
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = make_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], initializer_range=TEXT_INIT_STD),
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, initializer_range=VISION_INIT_STD),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        initializer_range=TEXT_INIT_STD)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.do_sample = False
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        video_processor=Qwen2VLVideoProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS),
        tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)
    return model, processor


def weights_hash(directory: str | os.PathLike) -> str:
    """sha256 over every weight / config / tokenizer / template file of a saved model."""
    from biasaudit.tiny.diffusion import weights_hash as _hash

    return _hash(directory, SUFFIXES)


def ensure_tiny_qwen2_vl(root: str | os.PathLike = DEFAULT_ROOT, seed: int = 0) -> tuple[Path, str]:
    """Directory of the saved tiny Qwen2-VL (built once, atomically, under `root`/tiny-qwen2-vl) and its
    weights hash (the model revision)."""
    from biasaudit.pipeline.io import build_directory_once
    from biasaudit.tiny.diffusion import quiet_saving

    def build(tmp: Path) -> str:
        model, processor = make_tiny_qwen2_vl(seed)
        with quiet_saving():
            model.save_pretrained(tmp)
            processor.save_pretrained(tmp)
        return weights_hash(tmp)

    return build_directory_once(Path(root) / (NAME if seed == 0 else f"{NAME}-seed{seed}"), build, MARKER)


def ensure_tiny_qwen2_vl_digits(root: str | os.PathLike = DEFAULT_ROOT) -> tuple[Path, str]:
    """(directory, revision) of the digits-only variant, derived once (atomically) from the tiny Qwen2-VL.

    The same saved model whose `generation_config.suppress_tokens` allows only digit tokens and the end
    token: free-text answers (salary recommendations) become random *numbers* the strict parser reads,
    so the offline profile exercises the whole salary analysis. Option scoring is unchanged.
    """
    import json
    import re

    from transformers import AutoTokenizer

    from biasaudit.pipeline.io import build_directory_once

    source, revision = ensure_tiny_qwen2_vl(root)

    def build(tmp: Path) -> str:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        (tmp / MARKER).unlink(missing_ok=True)
        tok = AutoTokenizer.from_pretrained(tmp)
        cfg_path = tmp / "generation_config.json"
        gen = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        eos = gen.get("eos_token_id", tok.eos_token_id)
        eos = set(eos if isinstance(eos, list) else [eos])
        vocab = tok.get_vocab()
        # raw token strings: a word-boundary marker (Metaspace '▁', byte-level 'Ġ') would insert spaces
        digits = {i for t, i in vocab.items() if re.fullmatch(r"\d+", t)}
        if not digits:
            raise RuntimeError("the tiny Qwen2-VL vocabulary has no digit tokens")
        gen["suppress_tokens"] = sorted(i for i in vocab.values() if i not in digits | eos)
        cfg_path.write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        return f"{revision}+digits-only"

    return build_directory_once(Path(root) / DIGITS_NAME, build, MARKER)
