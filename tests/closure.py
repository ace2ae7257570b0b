"""Import closure of a stage: the notebook plus every biasaudit module it reaches (via ast, including
imports inside functions, and every package __init__ on the way). Used by test_pipeline_wiring."""

from __future__ import annotations

from pathlib import Path

import jupytext

# the closure itself lives in the package (the engine fingerprints the code a record depends on with it)
from biasaudit.pipeline.closure import SRC, closure_of_source, module_file  # noqa: F401  (used by the tests)
from biasaudit.pipeline.closure import imports_of as _imports  # noqa: F401


def notebook_closure(notebook: Path) -> set[Path]:
    nb = jupytext.read(notebook)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and not c.source.lstrip().startswith(("%", "!")))
    return closure_of_source(code)


def collapsed(files: set[Path], root: Path = SRC.parent) -> list[str]:
    """The files as dvc.yaml deps: a directory whose every module is in `files` becomes one entry."""
    out: list[str] = []
    dirs = sorted({p.parent for p in files}, key=lambda d: len(d.parts))
    covered: set[Path] = set()
    for d in dirs:
        if any(d == c or c in d.parents for c in covered) or d.name in ("biasaudit", "src"):
            continue
        modules = {p.relative_to(root) for p in (root / d).rglob("*.py")}
        if modules <= files:
            covered.add(d)
            out.append(d.as_posix())
    out += [p.as_posix() for p in sorted(files) if not any(c in p.parents for c in covered)]
    return sorted(out)


if __name__ == "__main__":  # print each notebook's code deps for dvc.yaml
    import sys

    for nb in sys.argv[1:]:
        print(nb, *collapsed(notebook_closure(Path(nb))), sep="\n  - ")
