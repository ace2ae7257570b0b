"""The typed schema of params.yaml: one section per stage, each owned by its stage's module."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from biasaudit.params.analysis import Analyze, Report
from biasaudit.params.base import Section
from biasaudit.params.classify import Classify, Reliability, VLMSpec
from biasaudit.params.execution import Execution
from biasaudit.params.faces import Baseline, Faces, Instruments
from biasaudit.params.generate import Generate, Models
from biasaudit.params.t2i import Benchmarks, Prompts
from biasaudit.params.vlm import Counterfactuals, Reflect, ReflectAnalysis, Sources, ValidateEdits


class Params(Section):
    # the profile params.yaml is in (profiles/<name>.yaml; offline = params.yaml itself, paper = the published setup)
    profile: str = Field("offline", pattern=r"^[a-z0-9][a-z0-9_-]*$")
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

    @property
    def groups(self) -> tuple[str, ...]:
        """Method A's groups: the labels of the active group set (`benchmarks.group_set`), in table order. Every
        stage after benchmarks reads its groups here (Method B keeps its race × gender targets, vlm/groups.py)."""
        from biasaudit import groupsets

        return groupsets.labels(self.benchmarks.group_set)

    @property
    def genders(self) -> tuple[str, ...]:
        """The apparent-gender labels of `benchmarks.gender_set` (a group set of its own), or () when gender is
        not asked."""
        from biasaudit import groupsets

        return groupsets.labels(self.benchmarks.gender_set) if self.benchmarks.gender_set else ()

    # the keys stand_ins() reads: a stage that shows the banner lists them among its dvc params
    STAND_IN_KEYS: ClassVar[tuple[str, ...]] = ("models", "classify.vlm.backend", "vlms", "counterfactuals.backend", "reliability.simulate",
                     "sources.source", "baseline.source", "faces.clip_pretrained", "faces.detector",
                     "faces.insightface_root")

    def backends(self) -> list[tuple[str, str, str, Any]]:
        """(registry kind, params key, dvc stage, spec) of every model backend the parameters name."""
        return ([("generator", f"models.{name}", f"generate@{name}", spec) for name, spec in self.models.items()]
                + [("vlm", "classify.vlm", "classify@*", self.classify.vlm)]
                + [("vlm", f"vlms.{name}", f"reflect@{name}", spec) for name, spec in self.vlms.items()]
                + [("editor", "counterfactuals", "counterfactuals", self.counterfactuals)])

    # the switches that turn a measurement off ('none'), and what is then not measured; skipped() reads them
    # (the paper and current profiles keep them on)
    SKIPS: ClassVar[dict[str, str]] = {
        "faces.cross_detector": "no second face detector: the cross-detector table is empty",
        "validate_edits.lpips_weights": "LPIPS not measured"}
    SKIP_KEYS: ClassVar[tuple[str, ...]] = tuple(SKIPS)

    def skipped(self) -> list[str]:
        """The measurements these parameters switch off, one line each: the banner of every notebook and report
        page lists them (the offline demo skips what measures nothing there; the paper profile keeps them)."""
        switches = {"faces.cross_detector": self.faces.cross_detector,
                    "validate_edits.lpips_weights": self.validate_edits.lpips_weights}
        return [f"{key}: none ({what})" for key, what in self.SKIPS.items() if switches[key] == "none"]

    def stand_ins(self) -> list[str]:
        """What in these parameters is not a real model or real data: every stand-in, planted or simulated
        backend, simulated raters, packaged stand-in photos and random-weight embedders, one line each. A run
        is real only when this is empty; every page, notebook and audit card carries the banner otherwise,
        under any profile."""
        from biasaudit import registry

        def fake(kind: str, backend: str) -> bool:
            return any(registry.trait(kind, backend, t, False) for t in ("stand_in", "planted", "answers_from_confusion"))

        out = [f"{key}: {spec.backend}" for kind, key, _, spec in self.backends() if fake(kind, spec.backend)]
        out += ["reliability.simulate: SIMULATED raters"] if self.reliability.simulate else []
        out += ["sources.source: packaged STAND-IN photos"] if self.sources.source == "packaged" else []
        out += ["baseline.source: packaged STAND-IN portraits"] if self.baseline.source == "packaged" else []
        out += ["faces.clip_pretrained: random-weight CLIP"] if self.faces.clip_pretrained == "tiny" else []
        if self.faces.detector == "insightface" and self.faces.insightface_root == "tiny":
            out.append("faces.insightface_root: random-weight ONNX stand-in")
        out += ["validate_edits.lpips_weights: random-weight LPIPS trunk"] if self.validate_edits.lpips_weights == "random" else []
        return out

    @property
    def group_colours(self) -> dict[str, str]:
        """label → '#rrggbb' of the active group set, in its label order (figures and pages)."""
        from biasaudit import groupsets

        return groupsets.active(self.benchmarks.group_set).colours

    @model_validator(mode="after")
    def _keys_are_the_active_groups(self) -> "Params":
        """Every per-group key names a label of the active group set."""
        try:
            groups = self.groups
        except (OSError, ValueError) as e:
            raise ValueError(f"benchmarks.group_set: {e}") from None
        try:
            genders = self.genders
        except (OSError, ValueError) as e:
            raise ValueError(f"benchmarks.gender_set: {e}") from None
        spec = self.classify.vlm
        if genders and registry_reads(spec.backend) and set(spec.sim_gender_confusion) != set(genders):
            raise ValueError(f"classify.vlm.sim_gender_confusion: rows must be the gender labels {list(genders)}")
        for name, spec in self.models.items():
            if spec.planted is not None:
                try:
                    spec.planted.check_groups(groups, genders)
                except ValueError as e:
                    raise ValueError(f"models.{name}.{e}") from None
        self.classify.check_groups(groups)
        self.analyze.check_groups(groups)
        unknown = set(self.reliability.sim_group_accuracy) - set(groups)
        if unknown:
            raise ValueError(f"reliability.sim_group_accuracy: {sorted(unknown)} are not groups of {list(groups)}")
        return self


__all__ = ["Params", "Section", "VLMSpec"]


def registry_reads(backend: str) -> bool:
    """Whether a classifier backend reads its declared confusion (the simulated one)."""
    from biasaudit.registry import backend_reads

    return backend_reads("vlm", backend, "sim_confusion")
