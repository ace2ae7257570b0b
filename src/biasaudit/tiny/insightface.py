"""Tiny random-weight ONNX stand-ins that insightface's model router accepts as a `buffalo_l`-style pack:
an SCRFD-shaped detector (9 outputs: score/bbox/kps for strides 8, 16, 32; 2 anchors) and an
ArcFace-shaped recogniser (3×112×112 → 512). They exercise the real insightface code path offline;
their detections and embeddings are meaningless (stand-in). The detector's score head is biased so
that some anchors pass a 0.85 threshold, giving (random) boxes to test the downstream steps.
"""

from __future__ import annotations

import os
from pathlib import Path

TINY_PACK = "tiny_buffalo"
DET_SIZE = 256


def _build_detector(path: Path, seed: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Det(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.ModuleList([nn.Conv2d(3, 8, s, s) for s in (8, 16, 32)])
            self.score = nn.ModuleList([nn.Conv2d(8, 2, 1) for _ in range(3)])
            self.box = nn.ModuleList([nn.Conv2d(8, 8, 1) for _ in range(3)])
            self.kps = nn.ModuleList([nn.Conv2d(8, 20, 1) for _ in range(3)])
            with torch.no_grad():
                for conv in self.score:
                    conv.weight.mul_(4.0)
                    conv.bias.fill_(1.0)
                for conv in self.box:
                    conv.weight.mul_(0.1)
                    conv.bias.fill_(2.0)  # boxes ≈ 2 strides from each anchor centre

        def forward(self, x):
            scores, boxes, kps = [], [], []
            for stem, s, b, k in zip(self.stem, self.score, self.box, self.kps):
                f = torch.relu(stem(x))
                scores.append(torch.sigmoid(s(f)).permute(0, 2, 3, 1).reshape(-1, 1))
                boxes.append(b(f).abs().permute(0, 2, 3, 1).reshape(-1, 4))
                kps.append(k(f).permute(0, 2, 3, 1).reshape(-1, 10))
            return (*scores, *boxes, *kps)

    names = [f"{kind}_{s}" for kind in ("score", "bbox", "kps") for s in (8, 16, 32)]
    torch.onnx.export(Det().eval(), torch.zeros(1, 3, DET_SIZE, DET_SIZE), str(path), input_names=["input.1"],
                      output_names=names, dynamo=False, opset_version=17)


def _build_recogniser(path: Path, seed: int) -> None:
    import torch
    from torch import nn

    torch.manual_seed(seed + 1)
    net = nn.Sequential(nn.Conv2d(3, 8, 16, 16), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 512)).eval()
    torch.onnx.export(net, torch.zeros(1, 3, 112, 112), str(path), input_names=["input.1"], output_names=["embedding"],
                      dynamic_axes={"input.1": {0: "batch"}, "embedding": {0: "batch"}}, dynamo=False, opset_version=17)


def build_tiny_insightface(root: str | Path | None = None, seed: int = 0) -> Path:
    """Write `root/models/tiny_buffalo/{det_tiny,w600k_tiny}.onnx` once; return `root` for FaceAnalysis
    (use name='tiny_buffalo', det_size=256)."""
    from biasaudit.pipeline.io import atomic_path

    root = Path(root or Path(os.environ.get("BIASAUDIT_TINY_DIR", "models/tiny")) / "insightface")
    pack = root / "models" / TINY_PACK
    pack.mkdir(parents=True, exist_ok=True)
    for name, build in (("det_tiny.onnx", _build_detector), ("w600k_tiny.onnx", _build_recogniser)):
        if not (pack / name).exists():
            with atomic_path(pack / name) as tmp:
                build(tmp, seed)
    return root
