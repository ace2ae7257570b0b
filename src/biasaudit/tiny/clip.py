"""A tiny random-weight open_clip model (ViT + text transformer, the real architecture), built offline.

    name, ckpt = build_tiny_open_clip(directory)
    model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=str(ckpt))

The config is registered with open_clip under TINY_CLIP_NAME; the checkpoint is seeded, so every
build gives the same weights. Random weights: anything computed with it is a stand-in.
"""

from __future__ import annotations

import json
from pathlib import Path

TINY_CLIP_NAME = "biasaudit-tiny-clip"
TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def register_tiny_open_clip(directory: str | Path) -> str:
    import open_clip

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / f"{TINY_CLIP_NAME}.json"
    if not config_path.exists() or json.loads(config_path.read_text()) != TINY_CLIP_CONFIG:
        config_path.write_text(json.dumps(TINY_CLIP_CONFIG, indent=2))
    open_clip.add_model_config(config_path)
    return TINY_CLIP_NAME


def tiny_checkpoint(directory: str | Path, seed: int = 0) -> Path:
    """Where build_tiny_open_clip writes the seeded checkpoint (it may not exist yet)."""
    return Path(directory) / f"{TINY_CLIP_NAME}-seed{seed}.safetensors"


def build_tiny_open_clip(directory: str | Path, seed: int = 0) -> tuple[str, Path]:
    """Register the tiny config and write a seeded random checkpoint (once); return (model name, path)."""
    import open_clip
    import torch
    from safetensors.torch import save_file

    from biasaudit.pipeline.io import atomic_path

    name = register_tiny_open_clip(directory)
    # safetensors, not torch.save: torch.save writes a random serialization id into every file, so each fresh
    # clone got another checkpoint hash, hence another embedder revision in the outputs and another dvc.lock
    ckpt = tiny_checkpoint(directory, seed)
    if not ckpt.exists():
        torch.manual_seed(seed)
        model = open_clip.create_model(name, pretrained=None)
        with atomic_path(ckpt) as tmp:
            save_file(model.state_dict(), tmp)
    return name, ckpt
