"""BiSeNet face parsing (ResNet-18 context path, 19 CelebAMask-HQ classes), our implementation of the
architecture of zllrunning/face-parsing.PyTorch, so the widely used `79999_iter.pth` state dict loads
by path with `torch.load(weights_only=True)` (no pickled code is executed).

Classes (CelebAMask-HQ order): 0 background, 1 skin, 2 l_brow, 3 r_brow, 4 l_eye, 5 r_eye, 6 eye_g,
7 l_ear, 8 r_ear, 9 ear_r, 10 nose, 11 mouth, 12 u_lip, 13 l_lip, 14 neck, 15 neck_l, 16 cloth,
17 hair, 18 hat. Skin = class 1 (the paper's skin region).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

N_CLASSES = 19
SKIN_CLASS = 1
INPUT_SIZE = 512
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class ConvBNReLU(nn.Module):
    def __init__(self, cin: int, cout: int, ks: int = 3, stride: int = 1, padding: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, ks, stride, padding, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if cin != cout or stride != 1:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))


class Resnet18(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = _layer(64, 64, 1)
        self.layer2 = _layer(64, 128, 2)
        self.layer3 = _layer(128, 256, 2)
        self.layer4 = _layer(256, 512, 2)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        feat8 = self.layer2(self.layer1(x))
        feat16 = self.layer3(feat8)
        return feat8, feat16, self.layer4(feat16)


class AttentionRefinementModule(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = ConvBNReLU(cin, cout)
        self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
        self.bn_atten = nn.BatchNorm2d(cout)

    def forward(self, x):
        feat = self.conv(x)
        atten = torch.sigmoid(self.bn_atten(self.conv_atten(F.adaptive_avg_pool2d(feat, 1))))
        return feat * atten


class ContextPath(nn.Module):
    def __init__(self):
        super().__init__()
        self.resnet = Resnet18()
        self.arm16 = AttentionRefinementModule(256, 128)
        self.arm32 = AttentionRefinementModule(512, 128)
        self.conv_head32 = ConvBNReLU(128, 128)
        self.conv_head16 = ConvBNReLU(128, 128)
        self.conv_avg = ConvBNReLU(512, 128, ks=1, padding=0)

    def forward(self, x):
        feat8, feat16, feat32 = self.resnet(x)
        avg = self.conv_avg(F.adaptive_avg_pool2d(feat32, 1))
        feat32_sum = self.arm32(feat32) + F.interpolate(avg, feat32.shape[2:], mode="nearest")
        feat32_up = self.conv_head32(F.interpolate(feat32_sum, feat16.shape[2:], mode="nearest"))
        feat16_sum = self.arm16(feat16) + feat32_up
        feat16_up = self.conv_head16(F.interpolate(feat16_sum, feat8.shape[2:], mode="nearest"))
        return feat8, feat16_up, feat32_up


class FeatureFusionModule(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.convblk = ConvBNReLU(cin, cout, ks=1, padding=0)
        self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
        self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

    def forward(self, fsp, fcp):
        feat = self.convblk(torch.cat([fsp, fcp], dim=1))
        atten = torch.sigmoid(self.conv2(F.relu(self.conv1(F.adaptive_avg_pool2d(feat, 1)))))
        return feat * atten + feat


class BiSeNetOutput(nn.Module):
    def __init__(self, cin: int, mid: int, n_classes: int):
        super().__init__()
        self.conv = ConvBNReLU(cin, mid)
        self.conv_out = nn.Conv2d(mid, n_classes, 1, bias=False)

    def forward(self, x):
        return self.conv_out(self.conv(x))


class BiSeNet(nn.Module):
    """Returns (main, aux16, aux32) logits at the input resolution, like the reference implementation."""

    def __init__(self, n_classes: int = N_CLASSES):
        super().__init__()
        self.cp = ContextPath()
        self.ffm = FeatureFusionModule(256, 256)
        self.conv_out = BiSeNetOutput(256, 256, n_classes)
        self.conv_out16 = BiSeNetOutput(128, 64, n_classes)
        self.conv_out32 = BiSeNetOutput(128, 64, n_classes)

    def forward(self, x, aux: bool = False):
        h, w = x.shape[2:]
        feat_res8, feat_cp8, feat_cp16 = self.cp(x)
        out = F.interpolate(self.conv_out(self.ffm(feat_res8, feat_cp8)), (h, w), mode="bilinear", align_corners=True)
        if not aux:
            return out
        out16 = F.interpolate(self.conv_out16(feat_cp8), (h, w), mode="bilinear", align_corners=True)
        out32 = F.interpolate(self.conv_out32(feat_cp16), (h, w), mode="bilinear", align_corners=True)
        return out, out16, out32


def load_bisenet(weights: str | Path, device: str = "cpu") -> BiSeNet:
    """Build BiSeNet and load a state dict saved in the published layout (`79999_iter.pth`).

    Loaded with weights_only=True. A 'module.' prefix (DataParallel) is stripped; BatchNorm
    `num_batches_tracked` counters may be absent; any other missing/unexpected key is an error that
    names the keys, so a wrong file never yields a silently random network."""
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"BiSeNet weights not found: {path} (set faces.bisenet_weights)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    state = {k.removeprefix("module."): v for k, v in state.items()}
    net = BiSeNet(N_CLASSES)
    result = net.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path}: not a BiSeNet face-parsing state dict: missing {missing[:5]} "
                         f"({len(missing)}), unexpected {result.unexpected_keys[:5]} ({len(result.unexpected_keys)})")
    return net.to(device).eval()


def preprocess(crops: list[np.ndarray], size: int = INPUT_SIZE) -> torch.Tensor:
    """uint8 RGB crops → normalised N×3×size×size float tensor (bilinear resize, ImageNet mean/std)."""
    batch = torch.stack([torch.from_numpy(np.ascontiguousarray(c)).permute(2, 0, 1) for c in
                         [_resize(c, size) for c in crops]]).float() / 255.0
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (batch - mean) / std


def _resize(rgb: np.ndarray, size: int) -> np.ndarray:
    import cv2

    return cv2.resize(rgb, (size, size), interpolation=cv2.INTER_LINEAR)


@torch.inference_mode()
def parse(net: BiSeNet, crops: list[np.ndarray], size: int = INPUT_SIZE) -> list[np.ndarray]:
    """Class map (H×W uint8, each crop's own size) for a batch of RGB crops."""
    if not crops:
        return []
    device = next(net.parameters()).device
    labels = net(preprocess(crops, size).to(device)).argmax(1).to(torch.uint8).cpu().numpy()
    import cv2

    return [cv2.resize(lab, (c.shape[1], c.shape[0]), interpolation=cv2.INTER_NEAREST) for lab, c in zip(labels, crops)]
