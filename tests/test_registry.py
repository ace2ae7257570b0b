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
