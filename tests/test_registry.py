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


TRAITS = ("needs", "inputs", "requires_all", "requires_any", "reads", "sizes_by", "sizes", "no_response_format",
          "side_multiple", "stand_in", "recomputes_cheaply", "planted", "answers_from_confusion", "batches",
          "cpu_bound", "imports_existing", "prompt_field")
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
        for attr in TRAITS:
            runtime = getattr(cls, attr, MISSING)
            if runtime is MISSING or attr == "prompt_field" or attr in declared:
                continue
            read = registry.trait(kind, name, attr, MISSING)
            default_false = read is MISSING and runtime in (False, (), "", 0)  # an unset trait reads as its default
            assert default_false or read == runtime, f"{kind} {name}: trait {attr} reads {read!r}, the class holds {runtime!r}"
