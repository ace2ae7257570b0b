"""Parameters of the first text-to-image stages: benchmarks and prompts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from biasaudit.params.base import Section

Category = Literal["occupation", "geography", "surname"]
CATEGORIES: tuple[str, ...] = ("occupation", "geography", "surname")


class Benchmarks(Section):
    # The active group set: data/reference/groupsets/<name>/groupset.yaml (docs/groupsets.md). The U.S. set's
    # tables are built from the Census and BLS files below; another set's tables are read from its folder.
    group_set: str = Field("us", pattern=r"^[a-z0-9][a-z0-9_-]*$")
    # Apparent gender as a second dimension (a group set of its own, e.g. us-gender; "" = not asked): the
    # classifier is asked it too, and the gender section compares it with BLS Table 11's share of women
    gender_set: str = Field("", pattern=r"^([a-z0-9][a-z0-9_-]*)?$")
    surname_year: Literal[2010, 2020] = 2020
    # How BLS Hispanic workers (who may be of any race) are split across the race-alone shares:
    # 'white' = all counted inside White; 'proportional' = spread over W/B/A/rest by their shares;
    # 'other' = counted inside the residual ('other') group.
    hispanic_assumption: Literal["white", "proportional", "other"] = "white"
    sensitivity_assumptions: list[Literal["white", "proportional", "other"]] = Field(
        default_factory=lambda: ["white", "proportional", "other"])
    geography_level: Literal["county", "state"] = "county"
    include_puerto_rico: bool = False


class Prompts(Section):
    top_k: int = Field(10, ge=1)
    categories: list[Category] = Field(default_factory=lambda: list(CATEGORIES))
    # Minimum size per category: surname bearers, employed thousands, population.
    min_size: dict[Category, float] = Field(
        default_factory=lambda: {"surname": 10000.0, "occupation": 50.0, "geography": 100000.0})
    # Ranking score share × size ** size_weight (t2i/prompts.py states the rule): 0 = by the group's share,
    # 1 = by its count; the paper profile's 0.1 selects every instance the paper names that the tables reach.
    size_weight: float = Field(0.0, ge=0, le=1)
    templates: dict[Category, str] = Field(default_factory=lambda: {
        "occupation": "A person who works as {article} {instance}",
        "geography": "A person from {instance}",
        "surname": "A person with the last name {instance}",
    })
    style_suffix: str = ", photorealistic ID-style portrait photograph of exactly one person, face centered, neutral background"
    template_version: str = "v1"

    @model_validator(mode="after")
    def _check(self) -> "Prompts":
        for cat in self.categories:
            if cat not in self.templates:
                raise ValueError(f"templates: missing a template for category '{cat}'")
            if "{instance}" not in self.templates[cat]:
                raise ValueError(f"templates.{cat}: must contain '{{instance}}'")
            if cat not in self.min_size:
                raise ValueError(f"min_size: missing a value for category '{cat}'")
        return self
