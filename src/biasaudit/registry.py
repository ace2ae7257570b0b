"""The one registry of backends. A backend registers with one decorator where it is defined:

    @register("generator", "diffusers")
    class DiffusersGenerator(Generator): ...

    get("vlm", "gemini")(spec)          # the factory (class or function)
    names("editor")                     # ('diffusers', 'gemini', 'openai', 'tiny')

Kinds: "generator" (called as factory(name, spec, **optional)), "vlm" and "editor" (factory(spec)).
The params schema derives its allowed `backend` values from `names(kind)`.

A backend describes itself with class attributes holding literals (`trait`): what it needs that is not in
the repository (`needs`), the input files the check stage fingerprints (`inputs`), the spec fields it
requires (`requires_all`, `requires_any`) and reads (`reads`), whether it is a stand-in (`stand_in`),
batches (`batches`) or is CPU-bound (`cpu_bound`). They are read from the source like the decorators,
so validating params and listing needs import no backend: along the class's method resolution order,
bases in other modules read from their source too. A trait the reader cannot read exactly (a module
constant, a computed value, an assignment outside the class body, a base it cannot follow) raises
TraitError rather than reading as unset; tests/test_registry.py checks every backend's traits against its
imported class.

Discovery reads the `@register(kind, name)` decorators from the source of biasaudit.backends.<kind
package> without importing it (validating params.yaml, which every stage runner does first, then costs
milliseconds instead of the ~1 s of importing pandas, scipy and httpx); `get` imports the one module
that declares the name. A backend registered at run time (a test, a plug-in) counts as well.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS: dict[str, str] = {"generator": "biasaudit.backends.generators", "vlm": "biasaudit.backends.vlm",
                         "editor": "biasaudit.backends.editors"}

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}
_DISCOVERED: set[str] = set()
_DECLARED: dict[str, dict[str, str]] = {}
_TRAITS: dict[tuple[str, str], dict[str, Any]] = {}
_RUNTIME_TRAITS: dict[tuple[str, str], dict[str, Any]] = {}
_SOURCES: dict[str, Path] = {}  # declaring module → its source file (read for traits, not imported)
_LOCK = threading.RLock()


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind '{kind}'; kinds: {', '.join(KINDS)}")


def register(kind: str, name: str, **traits: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make `factory` the backend `name` of `kind` (a second, different one is an error).
    `traits` (literals) describe a function factory the way class attributes describe a class."""
    _check_kind(kind)
    if traits:
        _RUNTIME_TRAITS[(kind, name)] = traits

    def deco(factory: Callable[..., Any]) -> Callable[..., Any]:
        with _LOCK:
            existing = _REGISTRY[kind].get(name)
            if existing is not None and _qualname(existing) != _qualname(factory):
                raise ValueError(f"{kind} backend '{name}' is registered twice ({_qualname(existing)}, "
                                 f"{_qualname(factory)})")
            _REGISTRY[kind][name] = factory
        return factory

    return deco


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _declared_in(source: str) -> list[tuple[str, str]]:
    """(kind, name) of every `@register("kind", "name")` decorator in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for deco in getattr(node, "decorator_list", ()):
            if (isinstance(deco, ast.Call) and getattr(deco.func, "id", getattr(deco.func, "attr", "")) == "register"
                    and len(deco.args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                                    for a in deco.args)):
                found.append((deco.args[0].value, deco.args[1].value))
    return found


class TraitError(ValueError):
    """A trait the source reader cannot read exactly (a name, a computed value, a base it cannot follow)."""


# The class attributes read through `trait`: the reader raises on any of them it cannot read as a literal.
TRAITS = frozenset({"needs", "inputs", "requires_all", "requires_any", "reads", "stand_in", "recomputes_cheaply",
                    "batches", "cpu_bound", "side_multiple", "sizes_by", "sizes", "no_response_format",
                    "imports_existing", "answers_from_confusion", "planted"})
# Bases that hold no trait: followed no further.
_TRAITLESS_BASES = {("abc", "ABC"), ("builtins", "object"), ("typing", "Generic"), ("typing", "Protocol")}
_PARSED: dict[str, ast.Module] = {}  # module → its parsed source (read, never imported)


def _module_file(module: str) -> Path | None:
    """The source file of `module`, found on sys.path without importing it (nor its packages)."""
    from importlib.machinery import PathFinder

    spec, parts = None, module.split(".")
    for i in range(len(parts)):
        where = None if spec is None else spec.submodule_search_locations
        if i and not where:
            return None
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), where)
        if spec is None:
            return None
    origin = spec.origin if spec else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _parsed(module: str, source: str | None = None) -> ast.Module:
    with _LOCK:
        if module not in _PARSED or source is not None:
            if source is None:
                path = _SOURCES.get(module) or _module_file(module)
                if path is None:
                    raise TraitError(f"{module}: no Python source to read backend traits from")
                source = path.read_text(encoding="utf-8")
            _PARSED[module] = ast.parse(source)
        return _PARSED[module]


def _imported_names(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """{local name: (module, name)} of the module's top-level imports (`import a.b as m` maps m to (a.b, ''))."""
    path = _SOURCES.get(module) or _module_file(module)
    package = module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]
    out: dict[str, tuple[str, str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                anchor = ".".join(package.split(".")[:len(package.split(".")) - stmt.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in stmt.names:
                out[alias.asname or alias.name] = (base, alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                out[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else alias.name.split(".")[0], "")
    return out


def _where(module: str, node: ast.AST) -> str:
    return f"{module}:{getattr(node, 'lineno', '?')}"


def _resolve_class(module: str, name: str, seen: frozenset[tuple[str, str]] = frozenset()) -> tuple[str, ast.ClassDef] | None:
    """The class `name` as seen from `module`: defined there, or imported (followed through re-exports);
    None for a trait-less base (ABC, object); a TraitError for anything else."""
    if (module, name) in _TRAITLESS_BASES or (module, name) in seen:
        return None
    tree = _parsed(module)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return module, stmt
    imported = _imported_names(tree, module).get(name)
    if imported and imported[1]:
        return _resolve_class(imported[0], imported[1], seen | {(module, name)})
    if name == "object" and not imported:
        return None
    raise TraitError(f"{module}: base class '{name}' is neither defined nor imported there: its traits cannot be read")


def _base_classes(module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
    found = []
    for base in node.bases:
        expr = base.value if isinstance(base, ast.Subscript) else base  # Generic[T]
        if isinstance(expr, ast.Name):
            resolved = _resolve_class(module, expr.id)
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            target = _imported_names(_parsed(module), module).get(expr.value.id)
            if target is None:
                raise TraitError(f"{_where(module, base)}: base {ast.unparse(base)} cannot be followed")
            resolved = _resolve_class(f"{target[0]}.{target[1]}".strip(".") if target[1] else target[0], expr.attr)
        else:
            raise TraitError(f"{_where(module, base)}: base {ast.unparse(base)} cannot be followed")
        if resolved is not None:
            found.append(resolved)
    return found


def _c3(module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
    """The class's method resolution order (C3, as Python computes it), trait-less bases left out."""
    bases = _base_classes(module, node)
    sequences = [_c3(*b) for b in bases] + [bases]
    order = [(module, node)]
    while any(sequences):
        sequences = [s for s in sequences if s]
        for seq in sequences:
            head = seq[0]
            if not any(head in s[1:] for s in sequences):
                break
        else:
            raise TraitError(f"{module}.{node.name}: no consistent method resolution order")
        order.append(head)
        sequences = [[c for c in s if c != head] for s in sequences]
    return order


def _own_traits(module: str, node: ast.ClassDef) -> dict[str, Any]:
    """The literal class attributes a class body assigns; a TraitError for a trait it assigns otherwise."""
    found: dict[str, Any] = {}
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        target = (stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  else stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else None)
        if isinstance(target, ast.Name):
            try:
                found[target.id] = ast.literal_eval(stmt.value)  # type: ignore[union-attr, arg-type]
            except ValueError:
                if target.id in TRAITS:
                    raise TraitError(f"{_where(module, stmt)}: trait {target.id} of {node.name} is not a literal "
                                     f"({ast.unparse(stmt.value)}): write the value itself") from None  # type: ignore[union-attr, arg-type]
            continue
        stored = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        if stored & TRAITS:
            raise TraitError(f"{_where(module, stmt)}: trait {', '.join(sorted(stored & TRAITS))} of {node.name} is "
                             "not assigned as `trait = <literal>`")
    return found


def _set_after(tree: ast.Module, module: str, classes: set[str]) -> None:
    """A TraitError for a trait assigned to a backend class outside its body (`Cls.needs = ...`, setattr)."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in TRAITS and getattr(t.value, "id", None) in classes:
                raise TraitError(f"{_where(module, node)}: trait {t.attr} set outside the class body")
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and node.args
                and getattr(node.args[0], "id", None) in classes):
            raise TraitError(f"{_where(module, node)}: setattr on a backend class: its traits cannot be read")


def _literal_traits(source: str, kind: str, name: str, module: str = "<source>") -> dict[str, Any]:
    """The traits of the factory decorated `@register(kind, name, **traits)` in `source` (the module
    `module`): the decorator's keywords over the literal class attributes along the class's method
    resolution order, bases in other modules read from their source too. Raises TraitError on a trait it
    cannot read exactly (a name, a computed value, an assignment outside the class body, a base it cannot
    follow), so a value read here is the value the imported class holds."""
    tree = _parsed(module, source)
    for node in ast.walk(tree):
        for deco in getattr(node, "decorator_list", ()):
            if (isinstance(deco, ast.Call) and len(deco.args) == 2
                    and [getattr(a, "value", None) for a in deco.args] == [kind, name]):
                body: dict[str, Any] = {}
                if isinstance(node, ast.ClassDef):
                    mro = _c3(module, node)
                    for where, cls in mro:
                        _set_after(_parsed(where), where, {cls.name})
                    for where, cls in reversed(mro):
                        body |= _own_traits(where, cls)
                keywords: dict[str, Any] = {}
                for k in deco.keywords:
                    try:
                        if k.arg is None:
                            raise ValueError
                        keywords[k.arg] = ast.literal_eval(k.value)
                    except ValueError:
                        raise TraitError(f"{_where(module, deco)}: register(...) keyword "
                                         f"{ast.unparse(k)} is not a literal") from None
                return body | keywords
    return {}


def declared_traits(kind: str, name: str) -> dict[str, Any]:
    """Every trait backend `name` declares, read from source (see `_literal_traits`); {} for one registered at
    run time."""
    _check_kind(kind)
    module = _declared(kind).get(name)
    if module is None:
        return {}
    with _LOCK:
        if (kind, name) not in _TRAITS:
            _TRAITS[(kind, name)] = _literal_traits(_SOURCES[module].read_text(encoding="utf-8"), kind, name, module)
        return _TRAITS[(kind, name)]


def _declared(kind: str) -> dict[str, str]:
    """{backend name: module} declared in the kind's package, read from source (nothing imported)."""
    with _LOCK:
        if kind not in _DECLARED:
            spec = importlib.util.find_spec(KINDS[kind])  # imports the parent package only
            declared: dict[str, str] = {}
            for info in pkgutil.iter_modules(spec.submodule_search_locations if spec else []):
                path = Path(info.module_finder.path) / f"{info.name}.py"  # type: ignore[union-attr]
                if path.is_file():
                    for declared_kind, name in _declared_in(path.read_text(encoding="utf-8")):
                        if declared_kind == kind:
                            declared[name] = f"{KINDS[kind]}.{info.name}"
                            _SOURCES[declared[name]] = path
            _DECLARED[kind] = declared
        return _DECLARED[kind]


def _discover(kind: str) -> None:
    """Import every module of the kind's package (where the source scan cannot tell: no .py files)."""
    with _LOCK:
        if kind in _DISCOVERED:
            return
        package = importlib.import_module(KINDS[kind])
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{KINDS[kind]}.{info.name}")
        _DISCOVERED.add(kind)


def names(kind: str) -> tuple[str, ...]:
    """Every backend name of `kind` (declared in its package or registered at run time), sorted."""
    _check_kind(kind)
    declared = _declared(kind)
    if not declared:
        _discover(kind)
    return tuple(sorted(set(declared) | set(_REGISTRY[kind])))


def get(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as `name` (importing the module that declares it); a ValueError naming
    what is available otherwise."""
    _check_kind(kind)
    if name not in _REGISTRY[kind]:
        module = _declared(kind).get(name)
        if module is not None:
            importlib.import_module(module)
        if name not in _REGISTRY[kind]:
            _discover(kind)
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        raise ValueError(f"unknown {kind} backend '{name}'; available: {', '.join(names(kind))}") from None


def module_of(kind: str, name: str) -> str:
    """The module that declares backend `name` (read from source; imports nothing), or the registered
    factory's module for one registered at run time."""
    _check_kind(kind)
    declared = _declared(kind).get(name)
    if declared:
        return declared
    return getattr(get(kind, name), "__module__", "")


def trait(kind: str, name: str, attr: str, default: Any = None) -> Any:
    """A backend's literal class attribute `attr` (see the module docstring), read from its source
    without importing it; a backend registered at run time answers with getattr."""
    _check_kind(kind)
    module = _declared(kind).get(name)
    if module is None:  # registered at run time (a test, a plug-in), or no backend of that name
        if name not in _REGISTRY[kind]:
            return default
        return _RUNTIME_TRAITS.get((kind, name), {}).get(attr, getattr(_REGISTRY[kind][name], attr, default))
    return declared_traits(kind, name).get(attr, default)


def is_hosted(kind: str, name: str) -> bool:
    """Whether the backend calls a hosted API (it declares the `("hosted",)` need): its stage probes the
    model before the first batch and checks who answered."""
    return ("hosted",) in tuple(tuple(n) for n in trait(kind, name, "needs", ()))


def check_backend_requirements(kind: str, spec: Any) -> None:
    """The spec fields its backend declares it requires (registry traits `requires_all`, `requires_any`):
    a ValueError naming them when unset."""
    required = trait(kind, spec.backend, "requires_all", ())
    missing = [f for f in required if not getattr(spec, f)]
    if missing:
        raise ValueError(f"{', '.join(missing)}: required for backend '{spec.backend}'")
    one_of = trait(kind, spec.backend, "requires_any", ())
    if one_of and not any(getattr(spec, f) for f in one_of):
        raise ValueError(f"{one_of[0]}: required for backend '{spec.backend}' (or {', '.join(one_of[1:])})")


def backend_reads(kind: str, backend: str, field: str) -> bool:
    """Whether the backend declares that it reads `field` (registry trait `reads`): a field is checked
    only for the backends that use it."""
    return field in trait(kind, backend, "reads", ())


def recomputes_cheaply(kind: str, name: str) -> bool:
    """Whether the backend's work is cheap local computation that may be redone after a code change (a
    stand-in: `stand_in = True` on its class) rather than paid or GPU work cached by request content."""
    return bool(trait(kind, name, "stand_in", False))


def build(kind: str, name: str, *args: Any, **optional: Any) -> Any:
    """Call the factory with `args` and those `optional` keywords its signature accepts (so a new
    backend needs no boiler-plate for arguments it does not use)."""
    factory = get(kind, name)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory(*args, **optional)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return factory(*args, **optional)
    return factory(*args, **{k: v for k, v in optional.items() if k in params})


def check_name(kind: str, extra: tuple[str, ...] = ()) -> Callable[[str], str]:
    """A pydantic AfterValidator: the value must be a registered `kind` backend (or one of `extra`)."""
    def validate(value: str) -> str:
        from biasaudit.pipeline.secrets import embeds_secret

        allowed = names(kind) + tuple(extra)
        if value not in allowed:
            shown = "(a value that looks like a key, not shown)" if embeds_secret(value) else f"'{value}'"
            raise ValueError(f"unknown {kind} backend {shown}; available: {', '.join(sorted(allowed))}")
        return value

    return validate


__all__ = ["KINDS", "TRAITS", "TraitError", "backend_reads", "build", "check_backend_requirements", "check_name",
           "declared_traits", "get", "is_hosted", "module_of", "names", "recomputes_cheaply", "register", "trait"]
