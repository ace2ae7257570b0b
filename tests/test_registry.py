"""The backend registry: names read from the decorators' source agree with importing every module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from biasaudit import registry


def test_the_source_scan_names_what_importing_every_module_registers():
    scanned = {kind: registry.names(kind) for kind in registry.KINDS}
    for kind in registry.KINDS:
        registry._discover(kind)  # the oracle: import every module of the package
    assert scanned == {kind: tuple(sorted(registry._REGISTRY[kind])) for kind in registry.KINDS}
    assert "planted" in scanned["generator"] and "simulated" in scanned["vlm"]


def test_validating_params_imports_no_backend_module():
    code = ("import sys; from biasaudit.config import load_params; load_params(); "
            "print(sorted(m for m in sys.modules if m.startswith('biasaudit.backends.') and m.count('.') > 2 "
            "or m in ('pandas', 'scipy.ndimage', 'httpx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_get_imports_the_declaring_module_and_unknown_names_list_the_choices():
    assert registry.get("generator", "planted").__module__ == "biasaudit.backends.generators.planted"
    with pytest.raises(ValueError, match="available: .*planted"):
        registry.get("generator", "no-such-backend")


def test_a_backend_registered_at_run_time_counts():
    @registry.register("vlm", "runtime-test")
    def factory(spec):
        return spec

    try:
        assert "runtime-test" in registry.names("vlm")
        assert registry.get("vlm", "runtime-test") is factory
    finally:
        registry._REGISTRY["vlm"].pop("runtime-test")


def test_the_scan_reads_only_literal_register_decorators():
    source = '''
@register("vlm", "a")
class A: ...

@registry.register("editor", "b")
def b(): ...

@register("vlm", NAME)
class C: ...
# @register("vlm", "commented")
'''
    assert registry._declared_in(source) == [("vlm", "a"), ("editor", "b")]


MISSING = object()


def _product(factory):
    """What a backend's factory builds: the class itself, or the class a function factory's return annotation
    names (resolved in its module)."""
    import inspect
    import typing

    if inspect.isclass(factory):
        return factory
    hint = typing.get_type_hints(factory).get("return")
    assert inspect.isclass(hint), f"{factory.__qualname__}: annotate the class it returns, so its traits can be checked"
    return hint


@pytest.mark.parametrize("kind", list(registry.KINDS))
def test_the_traits_read_from_source_are_what_each_backend_class_holds(kind):
    """The oracle is the imported class (inheritance across modules included): a trait written as a module
    constant, inherited from a base in another module, or set on the class a function factory returns but not
    declared on the decorator would be read wrong from the source, and fails here."""
    import inspect

    for name in registry.names(kind):
        factory = registry.get(kind, name)
        cls = _product(factory)
        # a function factory's decorator keywords describe what it builds (they win over the class's defaults)
        declared = {} if inspect.isclass(factory) else registry._RUNTIME_TRAITS.get((kind, name), {})
        for attr in sorted(registry.TRAITS):
            runtime = getattr(cls, attr, MISSING)
            if attr in declared:
                continue
            read = registry.trait(kind, name, attr, MISSING)
            assert read == runtime, f"{kind} {name}: trait {attr} reads {read!r}, the class holds {runtime!r}"


PLUGIN_BASE = """
from abc import ABC


class HostedBase(ABC):
    needs = (("hosted",),)
    requires_any = ("api_key_env", "base_url")
    stand_in = False
"""

PLUGIN = """
from plugin_backends import base as base_module
from plugin_backends.base import HostedBase
from biasaudit.registry import register


class Middle(HostedBase):
    stand_in = True


@register("vlm", "inherits")
class Inherits(Middle):
    name = "inherits"


@register("vlm", "attribute-base")
class AttributeBase(base_module.HostedBase):
    requires_any = ("base_url",)
"""

UNREADABLE = {
    "module-constant": "NEEDS = (('hosted',),)\n\n\n@register('vlm', 'x')\nclass X:\n    needs = NEEDS\n",
    "computed": "@register('vlm', 'x')\nclass X:\n    requires_any = tuple(['api_key_env', 'base_url'])\n",
    "set-after": "@register('vlm', 'x')\nclass X:\n    pass\n\n\nX.needs = (('hosted',),)\n",
    "augmented": "@register('vlm', 'x')\nclass X:\n    reads = ()\n    reads += ('a',)\n",
    "keyword": "NEEDS = ()\n\n\n@register('vlm', 'x', needs=NEEDS)\ndef x(spec):\n    return spec\n",
    "computed-base": "@register('vlm', 'x')\nclass X(make_base()):\n    pass\n",
    "unknown-base": "@register('vlm', 'x')\nclass X(Undefined):\n    pass\n",
}


@pytest.fixture
def plugin_registry(tmp_path, monkeypatch):
    """A throwaway backend package (plugin_backends) standing in for biasaudit.backends.vlm, and a fresh
    registry state, so that nothing of the real backends is touched."""
    package = tmp_path / "plugin_backends"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(PLUGIN_BASE)
    (package / "plugin.py").write_text("from biasaudit.registry import register\n" + PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "KINDS", {**registry.KINDS, "vlm": "plugin_backends"})
    for state in ("_DECLARED", "_TRAITS", "_SOURCES", "_PARSED", "_RUNTIME_TRAITS"):
        monkeypatch.setattr(registry, state, {})
    monkeypatch.setattr(registry, "_REGISTRY", {kind: {} for kind in registry.KINDS})
    monkeypatch.setattr(registry, "_DISCOVERED", set())
    for name in [m for m in sys.modules if m.startswith("plugin_backends")]:
        monkeypatch.delitem(sys.modules, name)
    return package


def test_traits_inherited_from_a_base_in_another_module_are_read_and_enforced(plugin_registry):
    """The oracle: the imported classes' own attributes (Python's method resolution order)."""
    from types import SimpleNamespace

    read = {name: registry.declared_traits("vlm", name) for name in ("inherits", "attribute-base")}
    assert "plugin_backends.plugin" not in sys.modules  # read from source: nothing imported
    for name in read:
        cls = registry.get("vlm", name)
        assert {attr: read[name][attr] for attr in registry.TRAITS & set(read[name])} == {
            attr: getattr(cls, attr) for attr in registry.TRAITS if hasattr(cls, attr)}
    assert read["inherits"]["needs"] == (("hosted",),) and read["inherits"]["stand_in"] is True
    assert registry.is_hosted("vlm", "inherits")
    no_key = SimpleNamespace(backend="inherits", api_key_env="", base_url="")
    with pytest.raises(ValueError, match="api_key_env: required for backend 'inherits'"):
        registry.check_backend_requirements("vlm", no_key)
    registry.check_backend_requirements("vlm", SimpleNamespace(backend="inherits", api_key_env="", base_url="http://x"))
    assert read["attribute-base"]["requires_any"] == ("base_url",)


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_a_trait_the_reader_cannot_read_exactly_is_an_error_not_a_default(plugin_registry, case):
    (plugin_registry / "plugin.py").write_text("from biasaudit.registry import register\n\n\n" + UNREADABLE[case])
    with pytest.raises(registry.TraitError):
        registry.trait("vlm", "x", "needs", ())
