"""Method B's declared tasks (`reflect.task_specs`, params.vlm.TaskSpec: one entry per task) as every stage reads
them: which are asked, each single-image task's answer values, each task's unit, and which may be primary endpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from biasaudit.params.vlm import KINDS, parse_endpoint, task_name

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import Reflect, TaskSpec


def asked(reflect: Reflect) -> dict[str, TaskSpec]:
    """The declared tasks asked (their kind or their label listed in reflect.tasks), in declared order."""
    return {label: spec for label, spec in reflect.task_specs.items() if spec.kind in reflect.tasks or label in reflect.tasks}


def of_kind(reflect: Reflect, kind: str, placebo: bool | None = False) -> list[str]:
    """The names of the asked tasks of one kind: the real ones, the placebo ones, or (None) both."""
    return [task_name(label) for label, spec in asked(reflect).items()
            if spec.kind == kind and (placebo is None or spec.placebo == placebo)]


def answer_values(reflect: Reflect, placebo: bool | None = None) -> dict[str, dict[str, float] | None]:
    """The numeric value of each answer per single-image task `<kind>_<task>`, in declared order: each MCQ
    task's letter values; None for a salary task (its value is the salary). `placebo` False: the real
    tasks only (True: the placebo ones; None: both)."""
    return {label: (dict(spec.values) if spec.kind == "mcq" else None) for label, spec in reflect.task_specs.items()
            if spec.kind != "2afc" and (placebo is None or spec.placebo == placebo)}


def task_units(reflect: Reflect) -> dict[str, str]:
    """What one unit of a difference in each declared task's value is (`<kind>_<task>` → its `unit`)."""
    return {label: spec.unit for label, spec in reflect.task_specs.items() if spec.unit}


def check_endpoints(endpoints: list[str], reflect: Reflect) -> None:
    """Every primary endpoint (grammar: params.vlm.parse_endpoint) names a declared task marked primary."""
    for text in endpoints:
        e = parse_endpoint(text)
        label = e["measure"] if e["estimate"] == "delta_g" else f"2afc_{e['task']}"
        spec = reflect.task_specs.get(label)
        if spec is None or not spec.primary:
            raise ValueError(f"reflect_analysis.primary_endpoints: {text!r} names {label}, not a declared "
                             "primary task (reflect.task_specs: primary true)")


__all__ = ["KINDS", "asked", "of_kind", "answer_values", "task_units", "check_endpoints"]
