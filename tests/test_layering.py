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
    """module → the biasaudit modules it imports (anywhere in its source), and the packages whose
    __init__ each import runs on the way; edges to a module's own parent packages are left out."""
    graph: dict[str, set[str]] = {}
    for path in sorted((SRC / "biasaudit").rglob("*.py")):
        name = module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imports(ast.parse(path.read_text(encoding="utf-8")), package):
            file = module_file(imported)
            if file is not None:
                target = module_name(file)
                # importing a.b.c runs the __init__ of a.b first: an edge to every parent package too
                parts = target.split(".")
                for k in range(2, len(parts) + 1):
                    step = ".".join(parts[:k])
                    if step != name and not name.startswith(step + "."):
                        targets.add(step)
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
                                        ("pipeline/engine.py", "pipeline/work.py", "scale/", "tiny/", "backends/"))]
    assert not banned, banned


def test_method_b_does_not_reach_into_method_a():
    graph = import_graph()
    crossing = {m: sorted(t for t in targets if t.startswith("biasaudit.t2i"))
                for m, targets in graph.items() if m.startswith("biasaudit.vlm")}
    assert not any(crossing.values()), crossing


def _backend_names() -> set[str]:
    from biasaudit import registry

    return {n for kind in registry.KINDS for n in registry.names(kind)}


def _names_backend(node: ast.AST) -> bool:
    """Whether an expression reads a backend name: `x.backend`, `backend`, `x.get("backend")`, `x["backend"]`."""
    text = ast.unparse(node)
    return "backend" in text


def test_no_backend_name_is_compared_outside_its_own_module_and_the_registry():
    """A backend describes itself (registry traits): no code outside backends/ and registry.py branches on a
    backend's name, so adding a backend edits no if-chain anywhere."""
    names = _backend_names()
    files = [p for p in sorted((SRC / "biasaudit").rglob("*.py"))
             if "backends" not in p.relative_to(SRC).parts and p.name != "registry.py"]
    files += sorted((ROOT / "notebooks").glob("*.py"))
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("eq", "ne", "isin", "startswith"):
                sides = [node.func.value, *node.args]  # pandas' x["backend"].eq("planted") is a comparison too
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
            else:
                continue
            literals = {c.value for s in sides for c in ast.walk(s)
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names}
            if literals and any(_names_backend(s) for s in sides):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_every_backend_declares_only_known_traits():
    """Traits are read from source; a misspelt one would be silently ignored."""
    from biasaudit import registry

    known = registry.TRAITS | {"backend", "name", "model_id", "revision", "uses_mask", "prompt_field",
                               "answers_by_identity"}  # class attributes read at run time
    for kind in registry.KINDS:
        for name in registry.names(kind):
            declared = registry.declared_traits(kind, name)
            assert set(declared) <= known, (kind, name, set(declared) - known)


PER_ITEM_ITERATION = ("iterrows", "itertuples", "to_dict", "select_sources", "records", "build_items", "_items(",
                      "candidates")


def test_notebooks_hold_no_logic():
    """Notebooks are narratives: no function or class definitions, no lambdas, and no loop over items
    (rows, records, candidates); per-item work runs on the engine inside src/."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                found.append(f"{where}: {type(node).__name__}")
            elif isinstance(node, (ast.For, ast.comprehension)):
                iterated = ast.unparse(node.iter)
                if any(word in iterated for word in PER_ITEM_ITERATION):
                    found.append(f"{where}: loop over {iterated}")
    assert found == []


def test_the_analyze_stage_depends_on_no_runner_model_or_backend_module():
    """dvc.yaml's deps of `analyze` (what re-runs it) name no module of the engine, its runners, the tiny
    models or the backends: an edit to the Ray runner or a generator does not re-run the analysis."""
    import yaml

    deps = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["analyze"]["deps"]
    banned = ("src/biasaudit/pipeline/engine.py", "src/biasaudit/pipeline/work.py", "src/biasaudit/scale", "src/biasaudit/tiny",
              "src/biasaudit/backends")
    assert [d for d in deps if d.startswith(banned)] == []
