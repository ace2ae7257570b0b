"""The architecture and contributing docs name code that exists: every module or folder path they cite."""

import re

import pytest

from .conftest import ROOT

PATH = re.compile(r"`([\w./<>-]+(?:\.py|/))`|(?<![\w`/])((?:src/)?biasaudit/[\w/]+\.py)")


def cited_paths(text: str) -> set[str]:
    out = set()
    for a, b in PATH.findall(text):
        p = a or b
        if "<" in p or p.startswith(("http", ".", "reports/", "data/")):
            continue  # a pattern (notebooks/<name>.py), a relative notion or a stage's output, not code
        out.add(p)
    return out


def resolve(p: str):
    for base in (ROOT, ROOT / "src" / "biasaudit", ROOT / "src"):
        if (base / p).exists():
            return base / p
    return None


def layout_paths(text: str) -> set[str]:
    """The tree of CONTRIBUTING.md's Layout block: entries at column 0 are under the repository root,
    indented ones under src/biasaudit/ (the one folder the tree opens)."""
    block = text.split("```", 2)[1]
    out = set()
    for line in block.splitlines()[1:]:
        indented = line.startswith("  ") and not line.startswith("      ")
        names = re.findall(r"^\s*((?:[\w.-]+/?\s)+?)\s{2,}", line + "  ")
        for name in (names[0].split() if names else []):
            if name.endswith((".py", "/")) or "." not in name:
                out.add(f"src/biasaudit/{name}" if indented else name)
    return out


@pytest.mark.parametrize("doc", ["docs/architecture.md", "CONTRIBUTING.md"])
def test_every_cited_module_exists(doc):
    text = (ROOT / doc).read_text()
    paths = cited_paths(text) | (layout_paths(text) if doc == "CONTRIBUTING.md" else set())
    assert len(paths) > 10
    missing = sorted(p for p in paths if resolve(p) is None)
    assert not missing, f"{doc} cites {missing}"
