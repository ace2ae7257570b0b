"""Skin-tone scales people read, beside CIELAB L*: the Individual Typology Angle's six categories (Chardon et al.
1991) and the Monk Skin Tone scale's 10 tones (Monk 2019, Google's skintone.google). Both scales are data
(`data/reference/skin_scales/`: ita.csv, monk.csv and their sources in its README.md).

ITA° = atan2(L* − 50, b*)·180/π (`colour.ita_degrees`, the faces table's `ita` column); a face falls in the first
category (lightest first) whose lower bound `ita_above` its ITA° exceeds. The Monk tone of a face is the tone whose
published sRGB swatch, converted to CIELAB (D65, 2°) like every skin colour here, is nearest by CIEDE2000; that
ΔE2000 is kept beside the tone, so a far match (a colour between tones, or no skin colour at all) is visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from biasaudit.contracts import SKIN_SCALES_DIR
from biasaudit.faces.colour import delta_e2000, ita_degrees, srgb_to_lab

NO_TONE = ""  # a face without a colour (NaN L*/a*/b*) gets no category and no tone


@dataclass(frozen=True)
class Scales:
    ita_categories: tuple[str, ...]  # lightest first
    ita_above: np.ndarray  # lower bound (exclusive) of each category, descending; the last is −inf
    monk_tones: tuple[str, ...]  # "1" … "10", lightest first
    monk_hex: tuple[str, ...]
    monk_lab: np.ndarray  # (10, 3) CIELAB of the published sRGB swatches


def hex_to_rgb(code: str) -> np.ndarray:
    """'f6ede4' (or '#f6ede4') → uint8 [r, g, b]."""
    code = code.strip().lstrip("#")
    if len(code) != 6:
        raise ValueError(f"not a 6-digit hex colour: {code!r}")
    return np.array([int(code[i:i + 2], 16) for i in (0, 2, 4)], dtype=np.uint8)


@lru_cache(maxsize=4)
def load(folder: str | Path = SKIN_SCALES_DIR) -> Scales:
    """The two scales from `folder` (relative to the repository root, where every stage runs; failing that, the
    project's own, as groupsets.active does, so that a run elsewhere still finds the shipped scales)."""
    folder = Path(folder)
    if not (folder / "ita.csv").exists() and not folder.is_absolute():
        folder = Path(__file__).resolve().parents[3] / folder
    ita = pd.read_csv(folder / "ita.csv")
    above = ita["ita_above"].astype(float).to_numpy()
    if not (np.all(np.diff(above) < 0) and np.isneginf(above[-1])):
        raise ValueError(f"{folder / 'ita.csv'}: ita_above must descend and end at -inf")
    monk = pd.read_csv(folder / "monk.csv", dtype=str)
    hexes = tuple(monk["hex"].str.strip())
    lab = srgb_to_lab(np.stack([hex_to_rgb(h) for h in hexes]))
    return Scales(tuple(ita["category"]), above, tuple(monk["tone"].str.strip()), hexes, lab)


def ita_category(ita: np.ndarray | float, scales: Scales | None = None) -> np.ndarray:
    """The ITA category of each angle (degrees); NaN → ''."""
    s = scales or load()
    ita = np.atleast_1d(np.asarray(ita, dtype=np.float64))
    # the first bound (descending) that the angle exceeds
    idx = np.argmax(ita[:, None] > s.ita_above[None, :], axis=1)
    out = np.asarray(s.ita_categories, dtype=object)[idx]
    out[np.isnan(ita)] = NO_TONE
    return out


def monk_tone(lab: np.ndarray, scales: Scales | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(nearest Monk tone, ΔE2000 to it) of each CIELAB row (…×3); a row with a NaN → ('', NaN)."""
    s = scales or load()
    lab = np.asarray(lab, dtype=np.float64).reshape(-1, 3)
    de = delta_e2000(lab[:, None, :], s.monk_lab[None, :, :])  # (n, 10)
    ok = np.isfinite(de).all(axis=1)
    idx = np.argmin(np.where(ok[:, None], de, 0.0), axis=1)
    tone = np.asarray(s.monk_tones, dtype=object)[idx]
    dist = de[np.arange(len(lab)), idx]
    tone[~ok] = NO_TONE
    dist[~ok] = np.nan
    return tone, dist


def annotate(frame: pd.DataFrame, scales: Scales | None = None) -> pd.DataFrame:
    """`frame` (with L, a, b columns) plus `ita_category`, `monk_tone`, `monk_de2000`; ITA is computed from L*
    and b* (the faces table's `ita` column is the same definition)."""
    s = scales or load()
    lab = frame[["L", "a", "b"]].to_numpy(np.float64).reshape(-1, 3)
    ita = ita_degrees(lab)
    tone, dist = monk_tone(lab, s)
    return frame.assign(ita=ita, ita_category=ita_category(ita, s), monk_tone=tone, monk_de2000=dist)
