"""BiSeNet face parsing: our network has the published `79999_iter.pth` key names and shapes, and the
loader accepts a (random) state dict in that layout with torch.load(weights_only=True)."""

import numpy as np
import pytest
import torch

from biasaudit.faces import bisenet as B

# Key names and shapes of zllrunning/face-parsing.PyTorch's 79999_iter.pth (a sample across modules).
PUBLISHED = {
    "cp.resnet.conv1.weight": (64, 3, 7, 7),
    "cp.resnet.bn1.running_mean": (64,),
    "cp.resnet.layer1.0.conv1.weight": (64, 64, 3, 3),
    "cp.resnet.layer2.0.downsample.0.weight": (128, 64, 1, 1),
    "cp.resnet.layer2.0.downsample.1.weight": (128,),
    "cp.resnet.layer4.1.bn2.running_var": (512,),
    "cp.arm16.conv.conv.weight": (128, 256, 3, 3),
    "cp.arm16.conv_atten.weight": (128, 128, 1, 1),
    "cp.arm16.bn_atten.weight": (128,),
    "cp.arm32.conv.conv.weight": (128, 512, 3, 3),
    "cp.conv_head32.conv.weight": (128, 128, 3, 3),
    "cp.conv_head16.bn.bias": (128,),
    "cp.conv_avg.conv.weight": (128, 512, 1, 1),
    "ffm.convblk.conv.weight": (256, 256, 1, 1),
    "ffm.conv1.weight": (64, 256, 1, 1),
    "ffm.conv2.weight": (256, 64, 1, 1),
    "conv_out.conv.conv.weight": (256, 256, 3, 3),
    "conv_out.conv_out.weight": (19, 256, 1, 1),
    "conv_out16.conv.conv.weight": (64, 128, 3, 3),
    "conv_out16.conv_out.weight": (19, 64, 1, 1),
    "conv_out32.conv_out.weight": (19, 64, 1, 1),
}


@pytest.fixture(scope="module")
def random_state():
    torch.manual_seed(0)
    state = B.BiSeNet().state_dict()
    return {k: (torch.randn_like(v) * 0.05 if v.is_floating_point() and "running_var" not in k else v)
            for k, v in state.items()}


def test_published_key_names_and_shapes(random_state):
    for key, shape in PUBLISHED.items():
        assert tuple(random_state[key].shape) == shape, key
    assert not any(k.startswith(("cp.resnet.fc", "sp.")) for k in random_state)  # no classifier, no spatial path
    n_params = sum(v.numel() for k, v in random_state.items() if "running" not in k and "num_batches" not in k)
    assert 13_000_000 < n_params < 13_500_000  # ResNet-18 (11.2 M) + heads: the published model's size


@pytest.mark.slow
def test_loader_accepts_published_layout(tmp_path, random_state):
    # as published: some files carry a DataParallel 'module.' prefix and no num_batches_tracked counters
    state = {"module." + k: v for k, v in random_state.items() if not k.endswith("num_batches_tracked")}
    path = tmp_path / "79999_iter.pth"
    torch.save(state, path)
    net = B.load_bisenet(path)
    assert not net.training
    torch.testing.assert_close(net.state_dict()["conv_out.conv_out.weight"], random_state["conv_out.conv_out.weight"])
    with torch.inference_mode():
        out, out16, out32 = net(torch.zeros(1, 3, 64, 64), aux=True)
    assert out.shape == out16.shape == out32.shape == (1, 19, 64, 64)


def test_loader_rejects_other_files(tmp_path, random_state):
    with pytest.raises(FileNotFoundError, match="bisenet_weights"):
        B.load_bisenet(tmp_path / "missing.pth")
    bad = dict(random_state)
    bad.pop("ffm.conv1.weight")
    bad["head.weight"] = torch.zeros(3)
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match="ffm.conv1.weight"):
        B.load_bisenet(tmp_path / "bad.pth")


def test_parse_returns_class_maps_at_crop_size(tmp_path, random_state):
    torch.save(random_state, tmp_path / "w.pth")
    net = B.load_bisenet(tmp_path / "w.pth")
    crops = [np.zeros((40, 30, 3), np.uint8), np.full((50, 50, 3), 200, np.uint8)]
    maps = B.parse(net, crops, size=64)
    assert [m.shape for m in maps] == [(40, 30), (50, 50)]
    assert all(m.dtype == np.uint8 and m.max() < 19 for m in maps)


def test_bisenet_skin_masks_map_back_to_image(tmp_path, random_state):
    from biasaudit.faces.segment import bisenet_masks

    torch.save(random_state, tmp_path / "w.pth")
    net = B.load_bisenet(tmp_path / "w.pth")
    rgb = np.random.default_rng(0).integers(0, 255, (120, 100, 3), dtype=np.uint8)
    masks = bisenet_masks(net, rgb, [(30, 30, 70, 80)], margin=0.25, classes=tuple(range(19)))
    # all classes selected: the mask is exactly the (clipped, square) crop box
    # centre (50, 55), side 50·(1 + 2·0.25) = 75 → x 12.5..87.5, y 17.5..92.5 → int/ceil: 12..88, 17..93
    x0, y0, x1, y1 = 12, 17, 88, 93
    assert masks[0].shape == (120, 100) and masks[0].sum() == (x1 - x0) * (y1 - y0)
