"""Method B's analysis on a responses table in tests: a config holding only the reflect_analysis section, and
one VLM's answers."""

from types import SimpleNamespace

import pandas as pd

from biasaudit.params.vlm import Reflect, ReflectAnalysis
from biasaudit.vlm.analysis.inputs import Answers, Boot

# a simulated design (vlm.planted.simulate_responses): the 2AFC income task and the real single-image tasks
WITH_INCOME = Reflect(tasks=["2afc_income", "mcq_salary", "mcq_education", "salary_salary"])


def config(reflect: Reflect | None = None, **analysis):
    """What the sections read of the validated config: reflect_analysis (its defaults, or these values) and
    reflect (the declared tasks: its defaults, or `reflect`)."""
    return SimpleNamespace(reflect_analysis=ReflectAnalysis(**analysis), reflect=reflect or Reflect())


def with_task_values(label: str, values: dict[str, float]) -> Reflect:
    """The default reflect section with one declared task's letter values replaced."""
    specs = dict(Reflect().task_specs)
    specs[label] = specs[label].model_copy(update={"values": values})
    return Reflect().model_copy(update={"task_specs": specs})


def boot(**analysis) -> Boot:
    return Boot.of(config(**analysis))


def answers(responses: pd.DataFrame, vlm: str = "v", planted=None) -> Answers:
    return Answers(vlm, responses, planted)
