"""The biasaudit modules a piece of code reaches (imports anywhere in a module, functions included, and
each package __init__ on the way), read with `ast` without importing anything; and a fingerprint of
their code that ignores comments, docstrings and formatting.

Two users: dvc.yaml's deps (tests/closure.py checks that each stage lists its notebook's closure) and the
engine, whose record of an item is current only while the code that computed it is unchanged
(`code_fingerprint`, part of every stage's settings hash): a behaviour change redoes the items, a
comment-only edit redoes nothing.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]  # the folder holding the biasaudit package


def module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(tree: ast.AST, package: str) -> set[str]:
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


@lru_cache(maxsize=512)
def _parsed(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def parsed(path: Path) -> ast.Module:
    """The module's AST, parsed once per process while the file is unchanged (size and mtime)."""
    st = path.stat()
    return _parsed(path, st.st_mtime_ns, st.st_size)


def closure_of_names(names: set[str]) -> dict[str, Path]:
    """module name → file, for every biasaudit module reachable from `names`."""
    todo = sorted(names)
    seen: set[str] = set()
    files: dict[str, Path] = {}
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
        files[name] = path
        pkg = name if path.name == "__init__.py" else ".".join(parts[:-1])
        todo += sorted(imports_of(parsed(path), pkg))
    return files


def closure_of_source(source: str, package: str = "") -> set[Path]:
    """Every biasaudit module file reachable from `source` (paths relative to the repository root)."""
    return {p.relative_to(SRC.parent) for p in closure_of_names(imports_of(ast.parse(source), package)).values()}


@lru_cache(maxsize=512)
def _normalised_text(path: Path, mtime_ns: int, size: int) -> bytes:
    # a tree of its own, parsed again from the file (faster than a deep copy of the shared one, and the same tree)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False).encode()


def _normalised(path: Path) -> bytes:
    """The module's AST without docstrings: the same for any comment, docstring or layout edit. Computed once
    per process while the file is unchanged (size and mtime): the stages' closures share most modules."""
    st = path.stat()
    return _normalised_text(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=64)
def _fingerprint(names: tuple[str, ...], stamps: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for name, path in sorted(closure_of_names(set(names)).items()):
        h.update(name.encode())
        h.update(_normalised(path))
    return h.hexdigest()[:16]


def code_fingerprint(*modules: str) -> str:
    """A hash of the code of `modules` and everything they import (biasaudit only), comments, docstrings
    and formatting left out. Recomputed only when a file of the closure changes (size or mtime)."""
    files = closure_of_names(set(modules))
    stamps = tuple(sorted((n, p.stat().st_mtime_ns, p.stat().st_size) for n, p in files.items()))
    return _fingerprint(tuple(sorted(modules)), stamps)


__all__ = ["SRC", "closure_of_names", "closure_of_source", "code_fingerprint", "imports_of", "module_file"]
