"""The package's layers: no import circle (imports inside functions count: they hide one, they do not
remove it), and the analysis stages reach no module that runs models or work items."""

from __future__ import annotations

import ast

import pytest

from .closure import SRC, _imports, module_file, notebook_closure
from .conftest import ROOT


def module_name(path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module → the biasaudit modules it imports (anywhere in its source); edges to a module's own
    parent packages are left out (a package __init__ running first is not a dependency circle)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((SRC / "biasaudit").rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imports(ast.parse(path.read_text(encoding="utf-8")), package):
            file = module_file(imported)
            if file is not None:
                target = module_name(file)
                if target != name and not name.startswith(target + ".") and target != "biasaudit":
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_the_package():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("notebook", ["t2i_analyze", "vlm_reflect_analysis"])
def test_analysis_stages_reach_no_engine_runner_model_or_backend(notebook):
    reached = {str(p) for p in notebook_closure(ROOT / "notebooks" / f"{notebook}.py")}
    banned = [p for p in reached if any(p.startswith(f"src/biasaudit/{layer}") for layer in
                                        ("engine.py", "work.py", "scale/", "tiny/", "backends/"))]
    assert not banned, banned


def test_method_b_does_not_reach_into_method_a():
    graph = import_graph()
    crossing = {m: sorted(t for t in targets if t.startswith("biasaudit.t2i"))
                for m, targets in graph.items() if m.startswith("biasaudit.vlm")}
    assert not any(crossing.values()), crossing
