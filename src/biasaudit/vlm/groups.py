"""The ten FOCUS groups (5 races × 2 genders) and their short codes (AM, AF, …, WF, as in the paper)."""

from __future__ import annotations

from biasaudit.params.vlm import GENDERS, RACES

RACE_CODES: dict[str, str] = {"Asian": "A", "Black": "B", "Latino": "L", "MiddleEastern": "ME", "White": "W"}
GENDER_CODES: dict[str, str] = {"man": "M", "woman": "F"}


def group_code(race: str, gender: str) -> str:
    """('MiddleEastern', 'woman') → 'MEF'."""
    return RACE_CODES[race] + GENDER_CODES[gender]


def parse_group_name(stem: str) -> tuple[str, str] | None:
    """'Black_man' → ('Black', 'man'); None for anything that is not one of the ten groups."""
    race, _, gender = stem.rpartition("_")
    return (race, gender) if race in RACE_CODES and gender in GENDER_CODES else None


GROUPS: tuple[tuple[str, str], ...] = tuple((r, g) for r in RACES for g in GENDERS)
GROUP_CODES: tuple[str, ...] = tuple(group_code(r, g) for r, g in GROUPS)
CODE_TO_GROUP: dict[str, tuple[str, str]] = {group_code(r, g): (r, g) for r, g in GROUPS}


# The arm of an image (FOCUS manifest) and of a REFLECT question (responses): the group edits, and the two
# images of the null-edit control (stored beside them, never one of the ten groups; vlm.focus, vlm.tasks).
COUNTERFACTUAL, NULL_EDIT, ORIGINAL = "counterfactual", "null_edit", "original"
CONTROL_ARMS: tuple[str, ...] = (NULL_EDIT, ORIGINAL)


def arm_of(df) -> "pd.Series":  # noqa: F821
    """Each row's arm; tables written before the controls existed hold group edits only."""
    import pandas as pd

    if "arm" not in df:
        return pd.Series(COUNTERFACTUAL, index=df.index)
    return df["arm"].fillna(COUNTERFACTUAL).astype(str)


def group_rows(responses) -> "pd.DataFrame":  # noqa: F821
    """The REFLECT answers the group analyses read: about the group edits (arm counterfactual), real tasks
    only (not the placebo tasks, not the null-edit control's rows)."""
    placebo = responses["placebo"].fillna(False).astype(bool) if "placebo" in responses else False
    return responses[(arm_of(responses) == COUNTERFACTUAL) & ~placebo]
