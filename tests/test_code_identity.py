"""A record depends on the code that computed it: the code fingerprint follows behaviour, not comments,
and the engine redoes items whose code changed."""

import textwrap

import pytest

from biasaudit.params.execution import Execution
from biasaudit.pipeline import closure
from biasaudit.pipeline.engine import Stage, run_stage


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A throwaway `biasaudit` package (two modules) that the closure reads instead of the real one."""
    pkg = tmp_path / "biasaudit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "colour.py").write_text(textwrap.dedent('''
        """Colour maths."""

        def L(x):
            return x  # identity for now
    '''))
    (pkg / "stage.py").write_text("from biasaudit.sub.colour import L\n\n\ndef make():\n    return L\n")
    monkeypatch.setattr(closure, "SRC", tmp_path)
    closure._fingerprint.cache_clear()
    return pkg


def test_the_fingerprint_follows_behaviour_not_comments(package):
    first = closure.code_fingerprint("biasaudit.stage")
    colour = package / "sub" / "colour.py"
    colour.write_text(colour.read_text().replace("# identity for now", "# still the identity") + "\n\n# a note\n")
    colour.write_text(colour.read_text().replace('"""Colour maths."""', '"""Colour maths, documented."""'))
    assert closure.code_fingerprint("biasaudit.stage") == first  # comments and docstrings: the same code
    colour.write_text(colour.read_text().replace("return x", "return x + 10"))
    assert closure.code_fingerprint("biasaudit.stage") != first  # a module it imports behaves differently


def test_the_engine_redoes_items_whose_code_changed(tmp_path, monkeypatch):
    import biasaudit.pipeline.engine as engine

    calls = []

    def make_fn():
        def fn(items):
            calls.extend(i["id"] for i in items)
            return [{"id": i["id"], "status": "ok"} for i in items]
        return fn

    items = [{"id": f"i{k}"} for k in range(5)]
    ex = Execution()
    version = {"code": "v1"}
    monkeypatch.setattr(engine, "code_fingerprint", lambda *m: version["code"])

    def stage():
        return Stage("s", items, "id", "settings", make_fn, tmp_path / "log.jsonl", lambda i: i["id"],
                     code=("biasaudit.faces.colour",))

    run_stage(stage(), ex, progress=False)
    run_stage(stage(), ex, progress=False)
    assert len(calls) == 5  # nothing changed: nothing redone
    version["code"] = "v2"
    again = run_stage(stage(), ex, progress=False)
    assert len(calls) == 10 and again.summary.stale["settings"] == 5
    free = Stage("s", items, "id", "settings", make_fn, tmp_path / "other.jsonl", code=None)
    assert free.code_hash == "" and free.record_settings == "settings"  # paid work: keyed by its request only
