"""Import closure of a stage: the notebook plus every biasaudit module it reaches (via ast, including
imports inside functions, and every package __init__ on the way). Used by test_pipeline_wiring."""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext

SRC = Path(__file__).resolve().parents[1] / "src"


def module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(tree: ast.AST, package: str) -> set[str]:
    """Module names (biasaudit.*) imported anywhere in `tree`; `from a import b` counts a.b if a module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in names if n == "biasaudit" or n.startswith("biasaudit.")}


def closure_of_source(source: str, package: str = "") -> set[Path]:
    """Every biasaudit module file reachable from `source` (paths relative to the repository root)."""
    todo = sorted(_imports(ast.parse(source), package))
    seen: set[str] = set()
    files: set[Path] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name)
        if path is None:
            continue  # an attribute (from biasaudit.x import function), not a module
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        files.add(path.relative_to(SRC.parent))
        pkg = name if path.name == "__init__.py" else ".".join(parts[:-1])
        todo += sorted(_imports(ast.parse(path.read_text(encoding="utf-8")), pkg))
    return files


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
