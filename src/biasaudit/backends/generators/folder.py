"""Import images a user already has: a directory plus a CSV mapping each file to a prompt_id.

mapping CSV columns: `file` (relative to the directory), `prompt_id`, optional `index` (0-based;
default: order of appearance per prompt). Validation (before any work) reports every problem at once:
missing columns, missing files, mapped entries that are no readable file (a broken link, a link
loop, a folder: `biasaudit.pipeline.entries`), unknown prompt ids, duplicate (prompt_id, index) pairs. Each file is
loaded with biasaudit.pipeline.images.load_rgb (bad files become a `failed` row with the reason) and stored as
PNG like any generated image; the mapping file's hash is the model revision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.params.generate import GeneratorSpec
from biasaudit.pipeline.entries import entry_problem
from biasaudit.pipeline.images import load_rgb
from biasaudit.pipeline.provenance import sha256_file
from biasaudit.registry import register


def read_mapping(folder: str | Path, mapping_csv: str | Path, known_prompt_ids: set[str] | None = None
                 ) -> tuple[pd.DataFrame, list[str]]:
    """The validated mapping (columns file, prompt_id, index, path) and a list of problems."""
    folder, mapping_csv = Path(folder), Path(mapping_csv)
    problems: list[str] = []
    if not folder.is_dir():
        problems.append(f"folder: directory '{folder}' does not exist")
    if not mapping_csv.is_file():
        problems.append(f"mapping_csv: file '{mapping_csv}' does not exist")
    if problems:
        return pd.DataFrame(columns=["file", "prompt_id", "index", "path"]), problems
    table = pd.read_csv(mapping_csv, dtype={"file": str, "prompt_id": str})
    missing_cols = {"file", "prompt_id"} - set(table.columns)
    if missing_cols:
        return table, [f"mapping_csv: missing column(s) {sorted(missing_cols)}; needs file, prompt_id[, index]"]
    table = table.dropna(subset=["file", "prompt_id"]).copy()
    if "index" not in table.columns:
        table["index"] = table.groupby("prompt_id").cumcount()
    table["index"] = pd.to_numeric(table["index"], errors="coerce")
    if table["index"].isna().any() or (table["index"] < 0).any():
        problems.append("mapping_csv: column 'index' must hold non-negative integers")
    else:
        table["index"] = table["index"].astype(int)
    table["path"] = [str(folder / f) for f in table["file"]]
    why = {f: entry_problem(p, folder) for f, p in zip(table["file"], table["path"])}
    absent = [f for f, p in zip(table["file"], table["path"]) if not (Path(p).exists() or Path(p).is_symlink())]
    if absent:
        problems.append(f"mapping_csv: {len(absent)} file(s) not found in {folder}: {absent[:5]}")
    unusable = [f"{f} ({why[f]})" for f in table["file"] if why[f] and f not in absent]
    if unusable:  # there, but no file to read: a broken link, a link loop, a folder
        problems.append(f"mapping_csv: {len(unusable)} entr{'y' if len(unusable) == 1 else 'ies'} of {folder} "
                        f"cannot be read as an image file: {'; '.join(unusable[:5])}")
    if known_prompt_ids is not None:
        unknown = sorted(set(table["prompt_id"]) - known_prompt_ids)
        if unknown:
            problems.append(f"mapping_csv: {len(unknown)} prompt_id(s) not in the prompts table: {unknown[:5]}")
    dup = table[table.duplicated(["prompt_id", "index"], keep=False)]
    if len(dup):
        problems.append(f"mapping_csv: duplicate (prompt_id, index) pairs: {dup[['prompt_id', 'index']].values.tolist()[:5]}")
    return table, problems


@register("generator", "folder")
class FolderGenerator(Generator):
    backend = "folder"
    imports_existing = True
    requires_all = ("folder", "mapping_csv")
    inputs = ("folder", "mapping_csv")  # fingerprinted by the check stage
    needs = (("input", "folder", "put the images to import in this folder"),
             ("input", "mapping_csv", "write the CSV mapping each image file to a prompt_id (columns file, prompt_id)"))


    @classmethod
    def preflight(cls, spec: GeneratorSpec, key: str, prompts: Any = None) -> tuple[str, list[str]]:
        ids = set(prompts["prompt_id"].astype(str)) if prompts is not None and "prompt_id" in prompts else None
        _, problems = read_mapping(spec.folder, spec.mapping_csv, ids)  # type: ignore[arg-type]
        revision = "" if problems else "sha256:" + sha256_file(spec.mapping_csv)  # type: ignore[arg-type]
        return revision, [f"{key}.{p}" for p in problems]
    def __init__(self, name: str, spec: GeneratorSpec, known_prompt_ids: set[str] | None = None):
        assert spec.folder and spec.mapping_csv
        table, problems = read_mapping(spec.folder, spec.mapping_csv, known_prompt_ids)
        if problems:
            raise ValueError("; ".join(problems))
        super().__init__(name, spec.model_id or f"folder:{Path(spec.folder).name}",
                         "sha256:" + sha256_file(spec.mapping_csv))
        self.spec = spec
        self.files = {(r.prompt_id, int(r.index)): (r.path, r.file) for r in table.itertuples()}

    def settings(self) -> dict[str, Any]:
        return {"folder": self.spec.folder, "mapping_csv": self.spec.mapping_csv, "source": "user-supplied images"}

    def _one(self, req: GenRequest) -> GenResult:
        entry = self.files.get((req.prompt_id, req.index))
        if entry is None:
            return GenResult(None, "failed", f"no file mapped to ({req.prompt_id}, index {req.index})", seed_used=False)
        path, file = entry
        loaded = load_rgb(path)
        if not loaded.ok:
            return GenResult(None, "failed", f"{file}: {loaded.reason}", seed_used=False, extra={"source_file": file})
        extra = {"source_file": file, "source_sha256": sha256_file(path)}
        if loaded.note:
            extra["conversion"] = loaded.note
        return GenResult(loaded.rgb, seed_used=False, extra=extra)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]
