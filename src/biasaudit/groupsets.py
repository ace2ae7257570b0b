"""Benchmark sets as data: a group set (labels, display names, colours, the classifier's wording), its proxy
categories (templates, instance tables with per-group shares, source, year, licence, or an explicit instance
list) and the alternative reference distributions a user declares beside the benchmark.

A set is one YAML file, `data/reference/groupsets/<name>/groupset.yaml`, validated by `GroupSet` (extra keys are
errors); its instance tables are CSV files beside it. The format is documented in docs/groupsets.md. The U.S. set
(`us`) is the first set: its instance tables are built by the benchmarks stage from the Census and BLS files
(each category names its `builder`), and its labels are `contracts.GROUPS` (tested equal). Any other set carries its
tables itself, and `benchmark_table` turns one into the benchmarks' format: `instance, <one share column per
label>, size` (shares sum to 1), which `t2i.prompts.select_instances(..., groups=labels)` and the analysis read.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from biasaudit.contracts import GROUPSETS_DIR, UNKNOWN

if TYPE_CHECKING:
    import pandas as pd

LABEL = re.compile(r"^[a-z][a-z0-9_]*$")
COLOUR = re.compile(r"^#[0-9a-fA-F]{6}$")
SHARE_TOLERANCE = 1e-6  # a stated target's shares must sum to 1 within this


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Group(Strict):
    label: str          # the column name in every table and the classifier's answer (lower case)
    display: str        # how the report names it
    colour: str         # '#rrggbb' in figures and pages


class Source(Strict):
    publisher: str
    table: str
    year: int = Field(ge=1800, le=2100)
    url: str
    licence: str
    note: str = ""      # what was done to the published figures (e.g. which published groups were summed)


class Category(Strict):
    template: str                       # must contain {instance}; {article} where the instance needs one
    table: str = ""                     # CSV beside groupset.yaml: instance, <label> columns, optional size
    values: Literal["counts", "percent", "shares"] = "counts"  # what the label columns of the table hold
    builder: str = ""                   # instead of a table: a named builder of the benchmarks stage
    source: Source | None = None
    instances: list[str] = Field(default_factory=list)  # explicit instances instead of the top-k selection

    @model_validator(mode="after")
    def _check(self) -> "Category":
        if "{instance}" not in self.template:
            raise ValueError("template must contain '{instance}'")
        if bool(self.table) == bool(self.builder):
            raise ValueError("give exactly one of table (a CSV beside the set) or builder")
        if self.table and self.source is None:
            raise ValueError(f"table {self.table}: a source (publisher, table, year, url, licence) is required")
        return self


class Classifier(Strict):
    instruction: str                    # names every label; the classifier answers with one of them
    version: str = "v1"


class GroupSet(Strict):
    name: str
    country: str
    description: str
    groups: list[Group] = Field(min_length=2)
    classifier: Classifier
    categories: dict[str, Category] = Field(min_length=1)
    # Alternative reference distributions ({name: {label: share}}), reported beside the benchmark (never
    # instead of it); parity (1/G each) is always reported.
    targets: dict[str, dict[str, float]] = Field(default_factory=dict)
    limitations: list[str] = Field(default_factory=list)  # what this set cannot do (stated on the report)

    @model_validator(mode="after")
    def _check(self) -> "GroupSet":
        labels = [g.label for g in self.groups]
        for g in self.groups:
            if not LABEL.match(g.label):
                raise ValueError(f"group label {g.label!r}: lower-case letters, digits and _ only")
            if not COLOUR.match(g.colour):
                raise ValueError(f"group {g.label}: colour {g.colour!r} is not '#rrggbb'")
        if len(set(labels)) != len(labels):
            raise ValueError(f"group labels repeat: {labels}")
        if UNKNOWN in labels:
            raise ValueError(f"'{UNKNOWN}' is the abstention label, not a group")
        missing = [g for g in labels if g not in self.classifier.instruction.lower()]
        if missing:
            raise ValueError(f"classifier.instruction does not name the labels {missing}")
        for name, shares in self.targets.items():
            if set(shares) != set(labels):
                raise ValueError(f"target {name}: shares for exactly the labels {labels}, got {sorted(shares)}")
            if any(v < 0 for v in shares.values()) or abs(sum(shares.values()) - 1.0) > SHARE_TOLERANCE:
                raise ValueError(f"target {name}: shares must be ≥ 0 and sum to 1, got {sum(shares.values())}")
        if "parity" in self.targets:
            raise ValueError("target name 'parity' is reserved (parity is always reported)")
        return self

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(g.label for g in self.groups)

    @property
    def display(self) -> dict[str, str]:
        return {g.label: g.display for g in self.groups}

    @property
    def colours(self) -> dict[str, str]:
        return {g.label: g.colour for g in self.groups}


def set_path(name_or_path: str | Path, root: Path = GROUPSETS_DIR) -> Path:
    """A set's groupset.yaml: a name under data/reference/groupsets/, or a path to the file or its folder."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    if p.is_dir():
        return p / "groupset.yaml"
    return Path(root) / str(name_or_path) / "groupset.yaml"


def load(name_or_path: str | Path, root: Path = GROUPSETS_DIR) -> tuple[GroupSet, Path]:
    """(the validated set, its folder). Errors name the file."""
    path = set_path(name_or_path, root)
    if not path.exists():
        raise FileNotFoundError(f"group set {name_or_path!r}: {path} not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return GroupSet.model_validate(data), path.parent
    except Exception as e:  # a pydantic ValidationError or a YAML error, with the file named
        raise ValueError(f"{path}: {e}") from e


@lru_cache(maxsize=None)
def active(name: str) -> GroupSet:
    """The set `name` (cached): the one accessor every stage reads its groups through (`Params.groups`,
    `Params.group_colours`). A name is looked up under the working directory's data/reference/groupsets/ and,
    failing that, under the project's own (a test that runs elsewhere still finds the shipped sets)."""
    local = set_path(name)
    if not local.exists() and not Path(name).is_absolute():
        local = set_path(name, Path(__file__).resolve().parents[2] / GROUPSETS_DIR)
    return load(local)[0]


def labels(name: str) -> tuple[str, ...]:
    """The labels of the set `name` in its canonical column order."""
    return active(name).labels


def benchmark_table(gs: GroupSet, category: str, folder: Path) -> pd.DataFrame:
    """One category's instance table in the benchmarks' format: instance, <label shares summing to 1>, size,
    and the source columns. Counts are divided by their row total over the labels; percent by 100 and then
    rescaled (a published percentage row rarely sums to exactly 100)."""
    import pandas as pd  # not at import: validating params loads the set without pandas

    cat = gs.categories[category]
    if not cat.table:
        raise ValueError(f"category {category}: built by {cat.builder!r}, not a table of the set")
    path = folder / cat.table
    raw = pd.read_csv(path, dtype={"instance": str})
    missing = [c for c in ("instance", *gs.labels) if c not in raw.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    values = raw[list(gs.labels)].to_numpy(float)
    if (values < 0).any() or np.isnan(values).any():
        raise ValueError(f"{path}: negative or empty group values")
    totals = values.sum(axis=1, keepdims=True)
    if (totals <= 0).any():
        raise ValueError(f"{path}: a row with no members in any group")
    out = pd.DataFrame({"instance": raw["instance"].to_numpy()})
    out[list(gs.labels)] = values / totals
    if "size" in raw:
        out["size"] = raw["size"].astype(float).to_numpy()
    elif cat.values == "counts":
        out["size"] = totals[:, 0]
    else:
        raise ValueError(f"{path}: a table of {cat.values} needs a size column")
    src = cat.source
    return out.assign(source=f"{src.publisher}, {src.table} ({src.year})", licence=src.licence, url=src.url)
