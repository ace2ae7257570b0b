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
                                        ("pipeline/engine.py", "pipeline/work.py", "pipeline/scale/", "tiny/", "backends/"))]
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
    banned = ("src/biasaudit/pipeline/engine.py", "src/biasaudit/pipeline/work.py", "src/biasaudit/pipeline/scale", "src/biasaudit/tiny",
              "src/biasaudit/backends")
    assert [d for d in deps if d.startswith(banned)] == []


# The floors of the package, ground first: a package imports only from its own floor and the floors below
# (docs/architecture.md, "Floors"). `pipeline/` (its process pool and Ray runner under `pipeline/scale/`)
# is the ground floor above the declarations of contracts.py: it imports nothing else of biasaudit.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("contracts",),
    ("pipeline",),
    ("registry", "lifecycle", "groupsets", "known_truth", "gpu_extra"),
    ("params", "config", "notebook", "weights", "tiny"),
    ("faces", "stats"),
    ("backends",),
    ("t2i", "vlm"),
    ("report", "check", "referee"),
    ("cli", "__main__", "biasaudit"),
)
MAX_ARROWS_UP = 3
MAX_MUTUAL_PAIRS = 2


def package_of(module: str) -> str:
    """`biasaudit.vlm.analysis.gaps` → `vlm`; a top-level module is its own package; the root is `biasaudit`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(importing package, imported package) → the module edges behind it; a package's own edges left out."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b:
                edges.setdefault((a, b), set()).add((module, target))
    return edges


def floor_of(package: str) -> int:
    for k, floor in enumerate(FLOORS):
        if package in floor:
            return k
    raise AssertionError(f"package {package} is on no floor: add it to FLOORS (tests/test_layering.py)")


def arrows_up(edges) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in edges if floor_of(a) < floor_of(b))


def mutual_pairs(edges) -> list[tuple[str, str]]:
    return sorted((a, b) for a, b in edges if a < b and (b, a) in edges)


def package_circles(edges) -> list[list[str]]:
    """Circles through three or more packages: the package graph's strongly connected components of more
    than two packages (one of two is a mutual pair, counted by mutual_pairs)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    return [c for c in cycles(graph) if len(c) > 2]


def test_the_graph_counters_count_on_a_planted_graph():
    edges = {("pipeline", "config"): set(), ("config", "pipeline"): set(), ("faces", "backends"): set(),
             ("backends", "stats"): set(), ("stats", "faces"): set(), ("cli", "report"): set()}
    assert arrows_up(edges) == [("faces", "backends"), ("pipeline", "config")]
    assert mutual_pairs(edges) == [("config", "pipeline")]
    assert package_circles(edges) == [["backends", "faces", "stats"]]
    assert package_of("biasaudit.vlm.analysis.gaps") == "vlm" and package_of("biasaudit") == "biasaudit"


def test_pipeline_is_the_ground_floor():
    """`pipeline/` imports nothing of biasaudit above it: only contracts.py and its own modules."""
    edges = package_graph(import_graph())
    above = {b: sorted(e) for (a, b), e in edges.items() if a == "pipeline" and floor_of(b) > floor_of("pipeline")}
    assert above == {}
    assert not (SRC / "biasaudit" / "scale").exists()  # the process pool and Ray runner live under pipeline/


def test_the_import_graph_holds_its_numbers():
    """At most MAX_ARROWS_UP arrows from a floor to one above it, at most MAX_MUTUAL_PAIRS pairs of packages
    that import each other, no circle through three or more packages and none between modules."""
    graph = import_graph()
    edges = package_graph(graph)
    up = arrows_up(edges)
    assert len(up) <= MAX_ARROWS_UP, {e: sorted(edges[e])[:3] for e in up}
    pairs = mutual_pairs(edges)
    assert len(pairs) <= MAX_MUTUAL_PAIRS, {p: (sorted(edges[p])[:2], sorted(edges[p[::-1]])[:2]) for p in pairs}
    assert package_circles(edges) == []
    assert cycles(graph) == []
