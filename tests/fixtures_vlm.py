"""Method B's analysis on a responses table in tests: a config holding only the reflect_analysis section, and
one VLM's answers."""

from types import SimpleNamespace

import pandas as pd

from biasaudit.params.vlm import ReflectAnalysis
from biasaudit.vlm.analysis.inputs import Answers, Boot


def config(**analysis):
    """What the sections read of the validated config: reflect_analysis (its defaults, or these values)."""
    return SimpleNamespace(reflect_analysis=ReflectAnalysis(**analysis))


def boot(**analysis) -> Boot:
    return Boot.of(config(**analysis))


def answers(responses: pd.DataFrame, vlm: str = "v", planted=None) -> Answers:
    return Answers(vlm, responses, planted)
