"""The typed schema of params.yaml: one section per stage, each owned by its stage's module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from biasaudit.params.base import Section
from biasaudit.params.t2i import Benchmarks, Prompts


class Params(Section):
    profile: Literal["offline", "paper"] = "offline"
    seed: int = 20260111
    benchmarks: Benchmarks = Field(default_factory=Benchmarks)
    prompts: Prompts = Field(default_factory=Prompts)


__all__ = ["Params", "Section"]
