"""Tiny random-weight Stable Diffusion 3 and Flux pipelines of the real diffusers classes.

Built offline from diffusers' test-suite-sized configs (hidden size 32, 1–2 layers) with in-memory
tokenizers (a character-level CLIP BPE vocabulary and a character-level T5 sentencepiece model), saved
with `save_pretrained` into `models/tiny/<arch>/` and then loaded back by the *real* diffusers
loading code (`biasaudit.backends.generators.diffusers_backend`). Weights come from a fixed torch
seed, so the same library versions rebuild the same files; the sha256 of the weight files is the
model revision. These pipelines draw noise, not people: every output is labelled "stand-in".
"""

from __future__ import annotations

import hashlib
import os
import string
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

Arch = Literal["sd3", "flux"]
DEFAULT_ROOT = Path("models/tiny")
MARKER = ".complete"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
_CHARS = string.ascii_lowercase + string.digits + " ,.'-"


def _clip_tokenizer():
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
    for c in _CHARS.replace(" ", ""):
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77, pad_token="!")


def _t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
    pieces += [(c, -2.0) for c in _CHARS.replace(" ", "")]
    return T5Tokenizer(vocab=pieces, extra_ids=10)


def _clip_config(vocab_size: int):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2, vocab_size=vocab_size, hidden_size=32,
                          intermediate_size=37, layer_norm_eps=1e-5, num_attention_heads=4, num_hidden_layers=2,
                          hidden_act="gelu", projection_dim=32)


def _t5_encoder(vocab_size: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def _vae():
    from diffusers import AutoencoderKL

    # three blocks → spatial factor 4; 4 latent channels (packed 2×2 into 16 for Flux)
    return AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4, 4, 4),
                         down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                         layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
                         use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)


def make_tiny_pipeline(arch: Arch, seed: int = 0):
    """Build (in memory) a random-weight pipeline of the real class for `arch`."""
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    torch.manual_seed(seed)
    clip_tok, t5_tok = _clip_tokenizer(), _t5_tokenizer()
    clip_cfg = _clip_config(len(clip_tok))
    if arch == "sd3":
        transformer = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=4, num_layers=2,
                                            attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
                                            joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
        return StableDiffusion3Pipeline(
            transformer=transformer, vae=_vae(), scheduler=FlowMatchEulerDiscreteScheduler(),
            text_encoder=CLIPTextModelWithProjection(clip_cfg), text_encoder_2=CLIPTextModelWithProjection(clip_cfg),
            text_encoder_3=_t5_encoder(len(t5_tok)), tokenizer=clip_tok, tokenizer_2=clip_tok, tokenizer_3=t5_tok)
    if arch == "flux":
        transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
        return FluxPipeline(transformer=transformer, vae=_vae(), scheduler=FlowMatchEulerDiscreteScheduler(),
                            text_encoder=CLIPTextModel(clip_cfg), text_encoder_2=_t5_encoder(len(t5_tok)),
                            tokenizer=clip_tok, tokenizer_2=t5_tok)
    raise ValueError(f"architecture: unknown tiny architecture '{arch}' (sd3 | flux)")


def weights_hash(directory: str | os.PathLike, suffixes: tuple[str, ...] = WEIGHT_SUFFIXES) -> str:
    """sha256 over the (relative path, content) of every weight/config file under `directory`."""
    directory = Path(directory)
    h = hashlib.sha256()
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in suffixes
                   and not p.name.startswith("."))
    if not files:
        raise FileNotFoundError(f"no weight files under {directory}")
    for path in files:
        h.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


@contextmanager
def quiet_saving() -> Iterator[None]:
    """Saving a stand-in prints no transformers / huggingface_hub progress bar ("Writing model shards"
    amid the stage's own output); the switch is theirs only, so the stage's own tqdm bars still show,
    and it is restored afterwards."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def ensure_tiny_pipeline(arch: Arch, root: str | os.PathLike = DEFAULT_ROOT, seed: int = 0) -> tuple[Path, str]:
    """Directory of the saved tiny pipeline (built once, atomically) and its weights hash."""
    from biasaudit.pipeline.io import build_directory_once

    def build(tmp: Path) -> str:
        pipeline = make_tiny_pipeline(arch, seed)
        with quiet_saving():
            pipeline.save_pretrained(tmp)
        return weights_hash(tmp)

    return build_directory_once(Path(root) / arch, build, MARKER)
