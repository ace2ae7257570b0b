"""The architecture and contributing docs name code that exists: every module or folder path they cite."""

import re

import pytest
import yaml

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
    stages = set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    for stage in re.findall(r"dvc\s+repro\s+(?:--downstream\s+)?(\w[\w@-]*)", text):  # every stage it tells you to run
        assert stage.split("@")[0] in stages, f"README.md: dvc repro {stage}: no such stage"
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for target in re.findall(r"\bmake ([\w-]+)", text):
        assert target in targets, f"README.md: make {target}: no such target"
    params = yaml.safe_load((ROOT / "params.yaml").read_text())

    def value(key: str) -> str:  # dvc.yaml's ${a.b} templating, from params.yaml
        node = params
        for part in key.split("."):
            node = node[part]
        return str(node)

    outs = {re.sub(r"\$\{([\w.]+)\}", lambda m: value(m.group(1)), str(next(iter(o)) if isinstance(o, dict) else o))
            for st in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values() for o in st.get("outs", [])}
    examples = "".join(re.findall(r"```yaml\n(.*?)```", text, re.S))  # the reader's own files, not ours
    for path in set(re.findall(r"`(data/[\w./<>-]+)`", text)) - set(re.findall(r"data/[\w./-]+", examples)):
        assert "<" in path or resolve(path) or any(path.startswith(o.rstrip("/")) for o in outs), (
            f"README.md names {path}: neither in git nor an output of a stage")


def readme_commands(text: str) -> list[str]:
    """Every `biasaudit …` command the README shows: in code blocks (comments cut) and inline code."""
    code = [ln.split(" #")[0] for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S)
            for ln in block.splitlines()]
    inline = re.findall(r"`([^`\n]*biasaudit [^`\n]*)`", text)
    found = []
    for line in code + inline:
        m = re.search(r"(?:\.venv/bin/)?biasaudit (.+)$", line.strip())
        if m:
            found.append(m.group(1).strip())
    return found


def test_every_biasaudit_command_in_the_readme_parses():
    """Each command the README gives parses with the real command line (a misspelt subcommand or option fails)."""
    import shlex

    from biasaudit.cli import build_parser

    commands = readme_commands((ROOT / "README.md").read_text())
    assert len(commands) >= 4
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command))
        except SystemExit:
            pytest.fail(f"README.md: `biasaudit {command}` does not parse")


@pytest.mark.parametrize("chapter", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_every_docs_link_resolves(chapter):
    text = (ROOT / "docs" / chapter).read_text()
    links = [p for p in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in p]
    missing = [p for p in links if not (ROOT / "docs" / p).exists()]
    assert not missing, f"docs/{chapter} links {missing}"
