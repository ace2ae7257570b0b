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
    """The tree of CONTRIBUTING.md's Layout block: entries at column 0 are under the repository root, those
    indented by 2 under src/biasaudit/ (the one folder the tree opens), those indented by 6 under the last
    folder above them; deeper lines continue a description."""
    block = text.split("```", 2)[1]
    out = set()
    folder = ""
    for line in block.splitlines()[1:]:
        depth = len(line) - len(line.lstrip(" "))
        if depth not in (0, 2, 6):
            continue
        names = re.findall(r"^\s*((?:[\w.-]+/?\s)+?)\s{2,}", line + "  ")
        for name in (names[0].split() if names else []):
            if name.endswith((".py", "/")) or "." not in name:
                path = {0: name, 2: f"src/biasaudit/{name}", 6: f"src/biasaudit/{folder}{name}"}[depth]
                out.add(path)
                if depth == 2 and name.endswith("/"):
                    folder = name
    return out


@pytest.mark.parametrize("doc", ["docs/architecture.md", "CONTRIBUTING.md"])
def test_every_cited_module_exists(doc):
    text = (ROOT / doc).read_text()
    paths = cited_paths(text) | (layout_paths(text) if doc == "CONTRIBUTING.md" else set())
    assert len(paths) > 10
    missing = sorted(p for p in paths if resolve(p) is None)
    assert not missing, f"{doc} cites {missing}"


def test_the_readme_is_short_and_every_path_and_link_it_names_exists():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = set(re.findall(r"\]\(([^)#]+)\)", text)) - {p for p in re.findall(r"\]\(([^)]+)\)", text) if "://" in p}
    paths = cited_paths(text) | {p for p in re.findall(r"`((?:notebooks|docs|src|tests|benchmarks|data/reference)/[\w./-]+)`", text)}
    missing = sorted(p for p in links | paths if resolve(p) is None)
    assert not missing, f"README.md names {missing}"
    for stage in re.findall(r"dvc repro (?:--downstream )?(\w+)", text):  # every stage it tells you to run
        assert stage in (ROOT / "dvc.yaml").read_text(), stage


@pytest.mark.parametrize("chapter", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_docs_link_resolves(chapter):
    text = (ROOT / "docs" / chapter).read_text()
    links = [p for p in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in p]
    missing = [p for p in links if not (ROOT / "docs" / p).exists()]
    assert not missing, f"docs/{chapter} links {missing}"
