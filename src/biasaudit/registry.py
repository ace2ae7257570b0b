"""The one registry of backends. A backend registers with one decorator where it is defined:

    @register("generator", "diffusers")
    class DiffusersGenerator(Generator): ...

    get("vlm", "gemini")(spec)          # the factory (class or function)
    names("editor")                     # ('diffusers', 'gemini', 'openai', 'tiny')

Kinds: "generator" (called as factory(name, spec, **optional)), "vlm" and "editor" (factory(spec)).
The params schema derives its allowed `backend` values from `names(kind)`.

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
_LOCK = threading.RLock()


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown backend kind '{kind}'; kinds: {', '.join(KINDS)}")


def register(kind: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make `factory` the backend `name` of `kind` (a second, different one is an error)."""
    _check_kind(kind)

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


def recomputes_cheaply(kind: str, name: str) -> bool:
    """Whether the backend's work is cheap local computation that may be redone after a code change (a
    stand-in: `stand_in = True` on its class) rather than paid or GPU work cached by request content."""
    try:
        return bool(getattr(get(kind, name), "stand_in", False))
    except ValueError:  # not a registered backend (e.g. the `folder` import of an existing FOCUS set)
        return False


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
        from biasaudit.params.base import embeds_secret

        allowed = names(kind) + tuple(extra)
        if value not in allowed:
            shown = "(a value that looks like a key, not shown)" if embeds_secret(value) else f"'{value}'"
            raise ValueError(f"unknown {kind} backend {shown}; available: {', '.join(sorted(allowed))}")
        return value

    return validate


__all__ = ["KINDS", "build", "check_name", "get", "module_of", "names", "recomputes_cheaply", "register"]
