"""Skin-tone scales beside L*: ITA° (Chardon et al. 1991) and the Monk Skin Tone scale (Monk 2019).

Expected values come from the definitions and the published swatches, never from the code under test:
ITA° = atan2(L* − 50, b*)·180/π with the six published cut-offs, and the MST sRGB hex values as published at
skintone.google (typed here from the source, independent of data/reference/skin_scales/monk.csv)."""

import math

import numpy as np
import pandas as pd
import pytest
from skimage.color import deltaE_ciede2000, lab2rgb, rgb2lab

from biasaudit.faces import skin_scales as S
from biasaudit.faces.colour import describe_rgb
from biasaudit.t2i.analysis import face_loss, skin
from biasaudit.t2i.analysis.inputs import load_inputs

from .fixtures_t2i import analysis_config, write_tree

PUBLISHED_MST = ("f6ede4", "f3e7db", "f7ead0", "eadaba", "d7bd96", "a07e56", "825c43", "604134", "3a312a", "292420")


def _lab_of_hex(h: str) -> np.ndarray:
    rgb = np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)], float) / 255.0
    return rgb2lab(rgb, illuminant="D65", observer="2")


@pytest.mark.parametrize("L,b,expected", [
    (60.0, 10.0, 45.0),                               # tan⁻¹(10/10)
    (50.0 + 10.0 * math.sqrt(3.0), 10.0, 60.0),       # tan⁻¹(√3)
    (50.0 + 10.0 / math.sqrt(3.0), 10.0, 30.0),       # tan⁻¹(1/√3)
    (50.0, 18.0, 0.0),
    (40.0, 10.0, -45.0),
    (50.0 - 10.0 * math.sqrt(3.0), 10.0, -60.0),
])
def test_ita_of_known_L_b_pairs(L, b, expected):
    lab = np.array([[L, 12.0, b]])
    out = S.annotate(pd.DataFrame(lab, columns=["L", "a", "b"]))
    assert out["ita"].iloc[0] == pytest.approx(expected, abs=1e-9)
    # the faces table's own `ita` column (describe_rgb) is the same angle, through an sRGB round trip
    rgb = lab2rgb(lab[0], illuminant="D65", observer="2") * 255.0
    assert describe_rgb(rgb)["ita"] == pytest.approx(expected, abs=0.05)


@pytest.mark.parametrize("ita,category", [
    (70.0, "very light"), (55.1, "very light"), (55.0, "light"), (48.0, "light"), (41.5, "light"),
    (40.9, "intermediate"), (28.5, "intermediate"), (27.0, "tan"), (10.5, "tan"), (9.0, "brown"), (0.0, "brown"),
    (-29.0, "brown"), (-30.5, "dark"), (-60.0, "dark"),
])
def test_ita_categories_are_chardons_six(ita, category):
    """Chardon et al. 1991: very light > 55° > light > 41° > intermediate > 28° > tan > 10° > brown > −30° > dark."""
    assert S.ita_category(ita)[0] == category
    assert S.load().ita_categories == ("very light", "light", "intermediate", "tan", "brown", "dark")


def test_the_monk_file_holds_the_published_swatches():
    scales = S.load()
    assert scales.monk_tones == tuple(str(i) for i in range(1, 11))
    assert tuple(h.lower() for h in scales.monk_hex) == PUBLISHED_MST
    np.testing.assert_allclose(scales.monk_lab, np.stack([_lab_of_hex(h) for h in PUBLISHED_MST]), atol=1e-9)


def test_mst_swatches_map_to_themselves():
    lab = np.stack([_lab_of_hex(h) for h in PUBLISHED_MST])
    tone, de = S.monk_tone(lab)
    assert list(tone) == [str(i) for i in range(1, 11)]
    np.testing.assert_allclose(de, 0.0, atol=1e-9)
    # a face colour 1 ΔE-ish off each swatch (smaller than half the gap to the nearest other swatch) stays
    # on its tone, and the reported ΔE2000 is skimage's to that swatch
    gaps = deltaE_ciede2000(lab[:, None, :], lab[None, :, :])
    np.fill_diagonal(gaps, np.inf)
    near = lab + np.array([0.4, 0.3, -0.3])
    tone, de = S.monk_tone(near)
    assert list(tone) == [str(i) for i in range(1, 11)]
    np.testing.assert_allclose(de, deltaE_ciede2000(near, lab), atol=1e-9)
    assert np.all(de < gaps.min(axis=1) / 2)


def test_monk_tone_is_the_brute_force_nearest_swatch():
    rng = np.random.default_rng(3)
    lab = np.column_stack([rng.uniform(10, 95, 200), rng.uniform(-2, 25, 200), rng.uniform(0, 35, 200)])
    swatches = np.stack([_lab_of_hex(h) for h in PUBLISHED_MST])
    tone, de = S.monk_tone(lab)
    for i in range(len(lab)):
        d = [deltaE_ciede2000(lab[i], s) for s in swatches]
        assert tone[i] == str(int(np.argmin(d)) + 1) and de[i] == pytest.approx(min(d))
    tone, de = S.monk_tone(np.array([[np.nan, 1.0, 2.0]]))
    assert tone[0] == S.NO_TONE and np.isnan(de[0])


def test_the_skin_section_shows_both_scales_beside_L(tmp_path):
    root = write_tree(tmp_path)
    cfg = analysis_config(n_boot=100)
    inputs = load_inputs(root, groups=cfg.groups, colours=cfg.group_colours)
    res = skin.compute(inputs, cfg)
    by_label = res.tables["skin_scales_by_label"]
    dist = res.tables["skin_scales"]
    assert "skin_scales" in res.figures
    measured = skin.skin_table(inputs.faces, inputs.labels, inputs.prompts, cfg.groups)
    for r in by_label.itertuples():
        faces = measured[(measured["model"] == r.model) & (measured["label"] == r.label)]
        assert r.L_mean == pytest.approx(faces["L"].mean())  # beside L*, the same faces
        ita = np.degrees(np.arctan2(faces["L"] - 50, faces["b"]))
        assert r.ita_mean == pytest.approx(ita.mean())
    # the distribution: brute-force counts per model × label × prompt category, every tone, shares summing to 1
    swatches = np.stack([_lab_of_hex(h) for h in PUBLISHED_MST])
    nearest = [str(int(np.argmin([deltaE_ciede2000(row, sw) for sw in swatches])) + 1)
               for row in measured[["L", "a", "b"]].to_numpy()]
    measured = measured.assign(tone=nearest)
    monk = dist[dist["scale"] == "monk"].set_index(["model", "label", "category", "tone"])
    for (model, label, cat), g in measured.groupby(["model", "label", "category"]):
        for t in (str(i) for i in range(1, 11)):
            assert monk.loc[(model, label, cat, t), "n"] == (g["tone"] == t).sum()
    sums = dist.groupby(["model", "label", "category", "scale"])["share"].sum()
    np.testing.assert_allclose(sums, 1.0)
    assert set(dist["category"]) == {*measured["category"], "all"}


def test_face_loss_checks_both_scales_by_tone(tmp_path):
    root = write_tree(tmp_path)
    cfg = analysis_config(n_boot=100)
    inputs = load_inputs(root, groups=cfg.groups, colours=cfg.group_colours)
    loss = face_loss.compute(inputs, cfg).tables["face_loss"]
    assert {"label", "L_bin", "ita_category", "monk_tone"} <= set(loss["by"])
    # every attempted image lands in exactly one tone of each scale (lost faces, unmeasured: 'unknown')
    for by in ("ita_category", "monk_tone"):
        per_model = loss[loss["by"] == by].groupby("model")["n_images"].sum()
        per_label = loss[loss["by"] == "label"].groupby("model")["n_images"].sum()
        pd.testing.assert_series_equal(per_model, per_label)
