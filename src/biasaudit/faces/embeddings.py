"""Image embeddings: open_clip (whole image) and face embeddings (dlib 128-d or insightface ArcFace 512-d).
All returned as float32 rows with unit L2 norm."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def _normalise(X: np.ndarray) -> np.ndarray:
    X = np.asarray(X, dtype=np.float32)
    n = np.linalg.norm(X, axis=-1, keepdims=True)
    return np.divide(X, n, out=np.zeros_like(X), where=n > 0)


def resolve_device(device: str = "auto") -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def tiny_dir() -> Path:
    return Path(os.environ.get("BIASAUDIT_TINY_DIR", "models/tiny"))


class ClipEmbedder:
    """open_clip image tower. `pretrained` is an open_clip tag (e.g. laion2b_s32b_b79k), a local
    checkpoint path, or 'tiny' for the seeded random-weight stand-in (src/biasaudit/tiny/clip.py).

    The model is loaded on the first `embed`: a stage's driver, whose pool workers embed, only names the
    model (name, model_id, revision) and so never imports torch and open_clip (~3 s of CPU a stage)."""

    def __init__(self, model: str = "ViT-H-14", pretrained: str = "laion2b_s32b_b79k", device: str = "auto",
                 batch_size: int = 16):
        self.batch_size = max(1, batch_size)
        self.device_wanted = device
        self.stand_in = pretrained == "tiny"
        if self.stand_in:
            from biasaudit.tiny.clip import TINY_CLIP_NAME, tiny_checkpoint

            model, ckpt = TINY_CLIP_NAME, tiny_checkpoint(tiny_dir())
            if not ckpt.is_file():  # built once (seeded: the same bytes wherever it is built)
                from biasaudit.tiny.clip import build_tiny_open_clip

                build_tiny_open_clip(tiny_dir())
            pretrained = str(ckpt)
        if Path(pretrained).is_file():
            from biasaudit.pipeline.provenance import sha256_file

            self.revision = "sha256:" + sha256_file(pretrained)[:16]  # streamed: a 3.9 GB checkpoint, 1 MiB at a time
        else:
            self.revision = pretrained
        self.arch, self.pretrained = model, pretrained
        self.name = "open_clip"
        self.model_id = model + ("" if self.stand_in else f":{pretrained if not Path(pretrained).is_file() else Path(pretrained).name}")
        self.model = None

    def load(self) -> None:
        """Load the model (once): torch and open_clip are imported here."""
        if self.model is not None:
            return
        import open_clip
        import torch

        if self.stand_in:  # the tiny config, with this process' open_clip (the checkpoint exists since __init__)
            from biasaudit.tiny.clip import register_tiny_open_clip

            register_tiny_open_clip(tiny_dir())
        self.device = resolve_device(self.device_wanted)
        precision = "fp16" if self.device.startswith("cuda") else "fp32"
        model, _, self.preprocess = open_clip.create_model_and_transforms(
            self.arch, pretrained=self.pretrained, device=self.device, precision=precision)
        self.model = model.eval()
        self._torch = torch

    def embed(self, images: list[np.ndarray]) -> np.ndarray:
        from PIL import Image

        self.load()
        torch = self._torch
        out = []
        # torch's CPU kernels split sums by thread, so the last bits of an embedding depend on the machine's
        # core count; the stand-in is tiny, so on the CPU it runs on one thread and its bytes (dvc.lock's
        # hash of the embeddings) are the same on every machine with the same kernels
        threads = torch.get_num_threads()
        if self.stand_in and self.device == "cpu":
            torch.set_num_threads(1)
        try:
            for start in range(0, len(images), self.batch_size):
                batch = torch.stack([self.preprocess(Image.fromarray(im)) for im in images[start:start + self.batch_size]])
                dtype = next(self.model.parameters()).dtype
                with torch.inference_mode():
                    feats = self.model.encode_image(batch.to(self.device, dtype=dtype))
                out.append(feats.float().cpu().numpy())
        finally:
            torch.set_num_threads(threads)
        dim = self.model.visual.output_dim if hasattr(self.model.visual, "output_dim") else 0
        return _normalise(np.concatenate(out)) if out else np.zeros((0, dim), np.float32)


class DlibFaceEmbedder:
    """dlib's ResNet face descriptor (128-d), from the 68-landmark shape on the face box."""

    name, model_id, stand_in, dim = "dlib", "dlib_face_recognition_resnet_model_v1", False, 128

    def __init__(self, jitter: int = 0):
        import dlib

        from biasaudit.faces.detect import dlib_model_path

        self.jitter = jitter
        self.revision = dlib.__version__
        self.net = dlib.face_recognition_model_v1(str(dlib_model_path("dlib_face_recognition_resnet_model_v1.dat")))

    def embed(self, rgb: np.ndarray, bbox) -> np.ndarray:
        import dlib

        from biasaudit.faces.detect import shape_predictor

        x0, y0, x1, y1 = (int(round(v)) for v in bbox)
        img = np.ascontiguousarray(rgb)
        shape = shape_predictor()(img, dlib.rectangle(x0, y0, x1, y1))
        return _normalise(np.array(self.net.compute_face_descriptor(img, shape, self.jitter)))
