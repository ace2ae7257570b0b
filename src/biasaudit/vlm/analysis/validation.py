"""Section `validation`: for a VLM with planted truth (a backend with the `planted` trait, SIMULATED answers
from declared effects), every estimate of the other sections beside its exact planted value
(biasaudit.vlm.recovery). No parameters of its own."""

from __future__ import annotations

from typing import Any

from biasaudit.pipeline.outputs import Result
from biasaudit.vlm.analysis import gaps, refusals, significance, two_afc
from biasaudit.vlm.analysis.inputs import Answers


def compute(answers: Answers, cfg: Any) -> Result | None:
    """The `<vlm>_validation` section, or None for a VLM without planted truth (nothing to compare)."""
    if answers.planted is None:
        return None
    from biasaudit.vlm.recovery import recovery

    def check() -> Result:
        single = gaps.estimates(answers, cfg) | {"ols": significance.estimates(answers, cfg)["ols"]}
        return recovery(answers.vlm, answers.responses, answers.planted, cfg, two_afc.estimates(answers, cfg), single,
                        refusals.estimates(answers, cfg))

    return answers.shared("validation", cfg, check)
