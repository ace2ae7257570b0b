"""The typed schema of params.yaml: one section per stage, each owned by its stage's module."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from biasaudit.params.analysis import Analyze, Report
from biasaudit.params.base import Section
from biasaudit.params.classify import Classify, Reliability, VLMSpec
from biasaudit.params.execution import Execution
from biasaudit.params.faces import Baseline, Faces, Instruments
from biasaudit.params.generate import Generate, Models
from biasaudit.params.t2i import Benchmarks, Prompts
from biasaudit.params.vlm import Counterfactuals, Reflect, ReflectAnalysis, Sources, ValidateEdits


class Params(Section):
    profile: Literal["offline", "paper"] = "offline"
    seed: int = 20260111
    execution: Execution = Field(default_factory=Execution)  # local | ray, shard i of n (per-image stages)
    benchmarks: Benchmarks = Field(default_factory=Benchmarks)
    prompts: Prompts = Field(default_factory=Prompts)
    models: Models = Field(default_factory=dict)  # generator name → spec (foreach of generate@<model>)
    generate: Generate = Field(default_factory=Generate)
    faces: Faces = Field(default_factory=Faces)
    baseline: Baseline = Field(default_factory=Baseline)  # real-portrait baseline of the homogeneity gap
    instruments: Instruments = Field(default_factory=Instruments)  # detector/mask bias over an L* sweep
    analyze: Analyze = Field(default_factory=Analyze)
    report: Report = Field(default_factory=Report)
    classify: Classify = Field(default_factory=Classify)
    reliability: Reliability = Field(default_factory=Reliability)
    # Method B (FOCUS/REFLECT): vlm name → spec (foreach of reflect@<vlm>)
    vlms: dict[str, VLMSpec] = Field(default_factory=dict)
    sources: Sources = Field(default_factory=Sources)
    counterfactuals: Counterfactuals = Field(default_factory=Counterfactuals)
    validate_edits: ValidateEdits = Field(default_factory=ValidateEdits)
    reflect: Reflect = Field(default_factory=Reflect)
    reflect_analysis: ReflectAnalysis = Field(default_factory=ReflectAnalysis)


__all__ = ["Params", "Section", "VLMSpec"]
