"""Bad inputs to load_rgb: each gives a usable 8-bit sRGB array with a note, or a recorded reason."""

import numpy as np
from PIL import Image

from biasaudit.pipeline.images import load_rgb


def save(tmp_path, name, img, **kw):
    path = tmp_path / name
    img.save(path, **kw)
    return path


def test_grayscale_expanded(tmp_path):
    res = load_rgb(save(tmp_path, "g.png", Image.fromarray(np.full((40, 40), 90, np.uint8))))
    assert res.ok and res.rgb.shape == (40, 40, 3) and (res.rgb == 90).all() and res.note == "L→RGB"


def test_rgba_transparent_composited_on_white(tmp_path):
    arr = np.zeros((40, 40, 4), np.uint8)
    arr[..., 3] = 0  # fully transparent black must not read as dark skin
    res = load_rgb(save(tmp_path, "a.png", Image.fromarray(arr, "RGBA")))
    assert res.ok and (res.rgb == 255).all() and "alpha composited" in res.note
    arr[..., 3] = 255
    res = load_rgb(save(tmp_path, "b.png", Image.fromarray(arr, "RGBA")))
    assert res.ok and (res.rgb == 0).all() and "opaque" in res.note


def test_palette_and_cmyk(tmp_path):
    pal = Image.fromarray(np.full((40, 40, 3), (200, 100, 50), np.uint8)).convert("P", palette=Image.Palette.ADAPTIVE)
    res = load_rgb(save(tmp_path, "p.png", pal))
    assert res.ok and tuple(res.rgb[0, 0]) == (200, 100, 50)
    cmyk = Image.new("CMYK", (40, 40), (0, 255, 255, 0))  # pure red in naive CMYK
    res = load_rgb(save(tmp_path, "c.jpg", cmyk, quality=100))
    assert res.ok and res.note == "CMYK→RGB" and res.rgb[0, 0, 0] > 200 and res.rgb[0, 0, 1] < 50


def test_16_bit_scaled_not_clipped(tmp_path):
    arr = np.full((40, 40), 32768, np.uint16)
    res = load_rgb(save(tmp_path, "s.png", Image.fromarray(arr)))
    assert res.ok and abs(int(res.rgb[0, 0, 0]) - 128) <= 1 and "8-bit" in res.note


def test_tiny_huge_truncated_and_non_images(tmp_path):
    assert load_rgb(save(tmp_path, "t.png", Image.new("RGB", (8, 8)))).reason.startswith("too small")
    big = save(tmp_path, "big.png", Image.new("L", (3000, 3000)))
    res = load_rgb(big, max_pixels=1_000_000)
    assert not res.ok and res.reason.startswith("too large")
    full = save(tmp_path, "full.jpg", Image.fromarray(np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)))
    trunc = tmp_path / "trunc.jpg"
    trunc.write_bytes(full.read_bytes()[:2000])
    res = load_rgb(trunc)
    assert not res.ok and res.reason.startswith("unreadable image")
    text = tmp_path / "notes.png"
    text.write_text("not an image at all")
    assert load_rgb(text).reason == "not an image"
    assert load_rgb(tmp_path / "absent.png").reason == "missing file"


def test_float_image_rejected(tmp_path):
    path = tmp_path / "f.tif"
    Image.fromarray(np.zeros((40, 40), np.float32)).save(path)
    res = load_rgb(path)
    assert not res.ok and "floating-point" in res.reason


def test_exif_orientation_is_applied(tmp_path):
    """A camera JPEG stored sideways with EXIF Orientation 6 (rotate 90° clockwise to view) loads upright."""
    upright = np.zeros((120, 80, 3), np.uint8)  # portrait: 120 high, 80 wide
    upright[:20] = (255, 0, 0)  # a red band at the top
    stored = np.rot90(upright, k=1)  # how the sensor stored it: rotated 90° counter-clockwise, 80×120
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.ascontiguousarray(stored)).save(tmp_path / "cam.jpg", quality=95, exif=exif.tobytes())
    with Image.open(tmp_path / "cam.jpg") as raw:
        assert raw.size == (120, 80) and raw.getexif()[0x0112] == 6  # the file really is stored sideways
    got = load_rgb(tmp_path / "cam.jpg")
    assert got.ok and got.rgb.shape == (120, 80, 3) and "EXIF orientation 6" in got.note
    assert got.rgb[:20, :, 0].mean() > 200 and got.rgb[:20, :, 1].mean() < 60  # red band on top again
    assert got.rgb[100:, :, 0].mean() < 60
    plain = tmp_path / "plain.jpg"
    Image.fromarray(upright).save(plain, quality=95)
    assert load_rgb(plain).note == "" and load_rgb(plain).rgb.shape == (120, 80, 3)
