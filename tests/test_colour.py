"""Colour maths against published reference values: Sharma, Wu & Dalal (2005) CIEDE2000 test data,
Bruce Lindbloom / colour-science sRGB→CIELAB (D65) values, hue and ITA by hand."""

import numpy as np
import pytest

from biasaudit.faces import colour as C

# Sharma, Wu, Dalal, "The CIEDE2000 color-difference formula", Color Res. Appl. 30 (2005), Table 1.
SHARMA = np.array([
    [50.0000, 2.6772, -79.7751, 50.0000, 0.0000, -82.7485, 2.0425],
    [50.0000, 3.1571, -77.2803, 50.0000, 0.0000, -82.7485, 2.8615],
    [50.0000, 2.8361, -74.0200, 50.0000, 0.0000, -82.7485, 3.4412],
    [50.0000, -1.3802, -84.2814, 50.0000, 0.0000, -82.7485, 1.0000],
    [50.0000, -1.1848, -84.8006, 50.0000, 0.0000, -82.7485, 1.0000],
    [50.0000, -0.9009, -85.5211, 50.0000, 0.0000, -82.7485, 1.0000],
    [50.0000, 0.0000, 0.0000, 50.0000, -1.0000, 2.0000, 2.3669],
    [50.0000, -1.0000, 2.0000, 50.0000, 0.0000, 0.0000, 2.3669],
    [50.0000, 2.4900, -0.0010, 50.0000, -2.4900, 0.0009, 7.1792],
    [50.0000, 2.4900, -0.0010, 50.0000, -2.4900, 0.0010, 7.1792],
    [50.0000, 2.4900, -0.0010, 50.0000, -2.4900, 0.0011, 7.2195],
    [50.0000, 2.4900, -0.0010, 50.0000, -2.4900, 0.0012, 7.2195],
    [50.0000, -0.0010, 2.4900, 50.0000, 0.0009, -2.4900, 4.8045],
    [50.0000, -0.0010, 2.4900, 50.0000, 0.0010, -2.4900, 4.8045],
    [50.0000, -0.0010, 2.4900, 50.0000, 0.0011, -2.4900, 4.7461],
    [50.0000, 2.5000, 0.0000, 50.0000, 0.0000, -2.5000, 4.3065],
    [50.0000, 2.5000, 0.0000, 73.0000, 25.0000, -18.0000, 27.1492],
    [50.0000, 2.5000, 0.0000, 61.0000, -5.0000, 29.0000, 22.8977],
    [50.0000, 2.5000, 0.0000, 56.0000, -27.0000, -3.0000, 31.9030],
    [50.0000, 2.5000, 0.0000, 58.0000, 24.0000, 15.0000, 19.4535],
    [50.0000, 2.5000, 0.0000, 50.0000, 3.1736, 0.5854, 1.0000],
    [50.0000, 2.5000, 0.0000, 50.0000, 3.2972, 0.0000, 1.0000],
    [50.0000, 2.5000, 0.0000, 50.0000, 1.8634, 0.5757, 1.0000],
    [50.0000, 2.5000, 0.0000, 50.0000, 3.2592, 0.3350, 1.0000],
    [60.2574, -34.0099, 36.2677, 60.4626, -34.1751, 39.4387, 1.2644],
    [63.0109, -31.0961, -5.8663, 62.8187, -29.7946, -4.0864, 1.2630],
    [61.2901, 3.7196, -5.3901, 61.4292, 2.2480, -4.9620, 1.8731],
    [35.0831, -44.1164, 3.7933, 35.0232, -40.0716, 1.5901, 1.8645],
    [22.7233, 20.0904, -46.6940, 23.0331, 14.9730, -42.5619, 2.0373],
    [36.4612, 47.8580, 18.3852, 36.2715, 50.5065, 21.2231, 1.4146],
    [90.8027, -2.0831, 1.4410, 91.1528, -1.6435, 0.0447, 1.4441],
    [90.9257, -0.5406, -0.9208, 88.6381, -0.8985, -0.7239, 1.5381],
    [6.7747, -0.2908, -2.4247, 5.8714, -0.0985, -2.2286, 0.6377],
    [2.0776, 0.0795, -1.1350, 0.9033, -0.0636, -0.5514, 0.9082],
])


def test_ciede2000_sharma_table():
    got = C.delta_e2000(SHARMA[:, 0:3], SHARMA[:, 3:6])
    np.testing.assert_allclose(got, SHARMA[:, 6], atol=1e-4)
    # symmetric
    np.testing.assert_allclose(C.delta_e2000(SHARMA[:, 3:6], SHARMA[:, 0:3]), SHARMA[:, 6], atol=1e-4)


@pytest.mark.parametrize("rgb, lab", [
    ((255, 255, 255), (100.0, 0.0, 0.0)),
    ((0, 0, 0), (0.0, 0.0, 0.0)),
    ((255, 0, 0), (53.2408, 80.0925, 67.2032)),      # Lindbloom, sRGB D65
    ((0, 255, 0), (87.7347, -86.1827, 83.1793)),
    ((0, 0, 255), (32.2970, 79.1875, -107.8602)),
    ((128, 128, 128), (53.5850, 0.0, 0.0)),
])
def test_srgb_to_lab_reference(rgb, lab):
    # skimage rounds the sRGB→XYZ matrix to 6 digits: white lands within 0.005 of (100, 0, 0)
    np.testing.assert_allclose(C.srgb_to_lab(np.array(rgb, dtype=np.uint8)), lab, atol=1e-2)


def test_srgb_to_lab_agrees_with_colour_science():
    import colour

    rng = np.random.default_rng(0)
    rgb = rng.random((200, 3))
    ref = colour.XYZ_to_Lab(colour.sRGB_to_XYZ(rgb), colour.CCS_ILLUMINANTS["CIE 1931 2 Degree Standard Observer"]["D65"])
    # the two libraries derive the sRGB matrix differently (rounded vs from primaries): ≤ 0.03 apart,
    # far below a perceptible difference (ΔE2000 ≈ 1)
    np.testing.assert_allclose(C.srgb_to_lab(rgb), ref, atol=3e-2)


def test_hue_chroma_ita_by_hand():
    lab = np.array([[50, 3, 4], [70, -1, 0], [30, 0, -2], [60, 10, 20], [50, 1, -1]], dtype=float)
    np.testing.assert_allclose(C.chroma(lab), [5, 1, 2, np.hypot(10, 20), np.sqrt(2)])
    np.testing.assert_allclose(C.hue_degrees(lab), [np.degrees(np.arctan2(4, 3)), 180, 270,
                                                    np.degrees(np.arctan2(20, 10)), 315])
    h = C.hue_degrees(lab)
    assert ((h >= 0) & (h < 360)).all()
    # ITA = atan2(L-50, b): L=60, b=20 → atan(0.5); L=50 → 0; L=30, b=-2 → -95.7 (third quadrant)
    np.testing.assert_allclose(C.ita_degrees(lab)[[3, 0]], [np.degrees(np.arctan(0.5)), 0.0])
    np.testing.assert_allclose(C.ita_degrees(np.array([[80.0, 0, 30.0]])), 45.0)
    np.testing.assert_allclose(C.ita_degrees(np.array([[20.0, 0, 30.0]])), -45.0)


def test_l_bins_edges():
    got = C.l_bin(np.array([0, 39.999, 40, 54.9, 55, 69.99, 70, 100, np.nan]))
    assert list(got) == ["<40", "<40", "[40,55)", "[40,55)", "[55,70)", "[55,70)", "≥70", "≥70", ""]


def test_describe_rgb_grey_and_skin():
    d = C.describe_rgb(np.array([128.0, 128.0, 128.0]))
    assert abs(d["L"] - 53.585) < 2e-3 and abs(d["C"]) < 1e-2 and d["L_bin"] == "[40,55)"
    # a typical dark skin tone (Monk 9, #3a312a) is dark, warm and in the <40 bin
    dark = C.describe_rgb(np.array([0x3a, 0x31, 0x2a], dtype=float))
    assert dark["L"] < 25 and dark["L_bin"] == "<40" and 30 < dark["h"] < 90 and dark["ita"] < -45


def test_mean_skin_rgb_and_empty_mask():
    img = np.zeros((4, 4, 3), np.uint8)
    img[:2] = (200, 100, 50)
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    np.testing.assert_allclose(C.mean_skin_rgb(img, mask), [200, 100, 50])
    with pytest.raises(ValueError):
        C.mean_skin_rgb(img, np.zeros((4, 4), bool))


def test_grayscale_and_achromatic_skin_are_not_measurable():
    rng = np.random.default_rng(0)
    gray = np.repeat(rng.integers(0, 255, (64, 64, 1), dtype=np.uint8), 3, axis=2)
    noisy = np.clip(gray.astype(int) + rng.integers(-2, 3, gray.shape), 0, 255).astype(np.uint8)  # JPEG-like noise
    mask = np.zeros((64, 64), bool)
    mask[16:48, 16:48] = True
    assert "grayscale" in C.achromatic_reason(gray, mask) and "grayscale" in C.achromatic_reason(noisy)
    # a colour photo whose skin region is gray (a statue, a B&W inset): C* ≈ 0 on the skin
    colour_img = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    colour_img[mask] = (128, 128, 128)
    assert "near-achromatic skin" in C.achromatic_reason(colour_img, mask)
    # real skin tones, light to very dark (CIELAB → sRGB), are measurable
    from skimage.color import lab2rgb

    for lab in ((75, 10, 18), (55, 14, 22), (30, 10, 14), (20, 6, 9)):
        skin = colour_img.copy()
        skin[mask] = np.round(lab2rgb(np.array(lab, float)) * 255).astype(np.uint8)
        assert C.achromatic_reason(skin, mask) == "", lab


def test_hue_stays_below_360():
    """A hue a hair below 0° (b* = −1e-16) wrapped with np.mod alone came out as 360.0 (issue 17)."""
    from biasaudit.faces.colour import hue_degrees, wrap_degrees

    h = hue_degrees(np.array([[50.0, 1.0, -1e-16], [50.0, 1.0, 0.0], [50.0, -1.0, -1e-300]]))
    assert np.all((h >= 0) & (h < 360)), h
    assert wrap_degrees(np.array([-1e-14, 360.0, 720.5]))[0] < 360 and wrap_degrees(np.array([360.0]))[0] == 0.0
