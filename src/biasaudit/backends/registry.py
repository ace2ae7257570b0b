"""The one registry of backends. A backend registers with one decorator where it is defined:

    @register("generator", "diffusers")
    class DiffusersGenerator(Generator): ...

    get("vlm", "gemini")(spec)          # the factory (class or function)
    names("editor")                     # ('diffusers', 'gemini', 'openai', 'tiny')

Kinds: "generator" (called as factory(name, spec, **optional)), "vlm" and "editor" (factory(spec)).
The params schema derives its allowed `backend` values from `names(kind)`.

Discovery imports every module of biasaudit.backends.<kind package> once; backend modules import
their heavy SDKs (torch, google-genai, openai) inside the factory, so discovery stays cheap.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import threading
from collections.abc import Callable
from typing import Any

KINDS: dict[str, str] = {"generator": "biasaudit.backends.generators", "vlm": "biasaudit.backends.vlm",
                         "editor": "biasaudit.backends.editors"}

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {kind: {} for kind in KINDS}
_DISCOVERED: set[str] = set()
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


def _discover(kind: str) -> None:
    with _LOCK:
        if kind in _DISCOVERED:
            return
        package = importlib.import_module(KINDS[kind])
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{KINDS[kind]}.{info.name}")
        _DISCOVERED.add(kind)


def names(kind: str) -> tuple[str, ...]:
    """Every registered backend name of `kind`, sorted."""
    _check_kind(kind)
    _discover(kind)
    return tuple(sorted(_REGISTRY[kind]))


def get(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as `name`; a ValueError naming what is available otherwise."""
    _check_kind(kind)
    _discover(kind)
    try:
        return _REGISTRY[kind][name]
    except KeyError:
        raise ValueError(f"unknown {kind} backend '{name}'; available: {', '.join(names(kind))}") from None


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
        allowed = names(kind) + tuple(extra)
        if value not in allowed:
            raise ValueError(f"unknown {kind} backend '{value}'; available: {', '.join(sorted(allowed))}")
        return value

    return validate


__all__ = ["KINDS", "build", "check_name", "get", "names", "register"]
