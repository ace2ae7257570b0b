"""Every code pointer in docs/ resolves against the tree (#44 item 6): module paths, the functions and classes
named beside a module (`t2i/analysis/skin.py` `women_share_regression`), dotted names
(`biasaudit.report.replication.replication_table`), report pages (`pages/<name>.html`) and declared tables with
their columns (`tvd_summary.mean_tvd`). A pointer whose target moved or vanished fails here, naming the doc."""

import re
from pathlib import Path

import pytest

from biasaudit import contracts as C

from .conftest import ROOT
from .test_docs import cited_paths
from .test_docs import resolve as resolve_in_tree

OUTPUT_FOLDERS = {"html/", "pages/", "thumbs/"}  # folders of reports/ the docs list by their own name


def resolve(p: str) -> Path | None:
    """A cited path: under the root, src/biasaudit or src (test_docs), a file the docs list inside notebooks/,
    benchmarks/ or tests/ by its bare name, a folder of reports/, or a file of an installed package (DVC's own
    code)."""
    import sysconfig

    found = resolve_in_tree(p)
    if found is not None or p in OUTPUT_FOLDERS:
        return found or ROOT
    for base in (ROOT / "notebooks", ROOT / "benchmarks", ROOT / "tests", Path(sysconfig.get_paths()["purelib"])):
        if (base / p).exists():
            return base / p
    return None


DOCS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
IDENT = r"[A-Za-z_]\w*"
# a module path followed by the names it defines: `m.py` `f`, `m.py` (`f`, `g`), `m.py` `f`/`g`
NAME = r"`" + IDENT + r"(?:\([^`]*\))?`"  # `f` or `f(…, by=…)`, never a path or a dotted key
BESIDE = re.compile(r"`((?:[\w-]+/)*[\w-]+\.py)`((?:\s*[(,/]?\s*" + NAME + r")+)")
DOTTED = re.compile(r"`(biasaudit(?:\.\w+)+)`")
PAGE = re.compile(r"pages/([\w<>-]+)\.html")
TABLE_COLUMN = re.compile(r"`(" + IDENT + r")\.(" + IDENT + r")`")


def _defines(path: Path, name: str) -> bool:
    """Whether a module (or a package's modules) names `name`: defines it, or reads or writes it (a column,
    a constant, a table it writes)."""
    text = path.read_text() if path.is_file() else "".join(p.read_text() for p in path.rglob("*.py"))
    return re.search(rf"\b{name}\b", text) is not None


def module_names(text: str) -> list[tuple[str, str]]:
    """(module path, name) for each name written beside a module path."""
    out = []
    for path, tail in BESIDE.findall(text):
        for name in re.findall(r"`(" + IDENT + r")", tail):
            out.append((path, name))
    return out


def known_pages() -> list[str]:
    """Patterns of the pages the report writes: the blocks of report/front.py, one page per analysis section
    (a-<t2i section>, b-<vlm section>, with <vlm> for the per-VLM ones), the folder sections, and the pages
    of their own modules."""
    src = ROOT / "src/biasaudit"
    blocks = re.findall(r'Block\("(\w+)"', (src / "report/front.py").read_text())
    sections = []
    for method, folder in (("a", "t2i/analysis"), ("b", "vlm/analysis")):
        for f in (src / folder).glob("*.py"):
            for name in re.findall(r'Result\((f?)"([\w{}]+)"', f.read_text()):
                sections.append(f"{method}-" + name[1].replace("{vlm}", "<vlm>"))
    html = (src / "report/html.py").read_text()
    folders = [f"{'a' if 'T2I' in m or 't2i' in m else 'b'}-{n}" for m, n in
               re.findall(r'_folder_section\(([^,]+),[^"]*"(\w+)"', html)]
    folders += ["b-vlm_summary"]
    own = [Path(C.REPLICATION_PAGE).stem, "assumptions"]
    return blocks + sections + folders + own


@pytest.mark.parametrize("doc", DOCS)
def test_every_module_path_in_docs_exists(doc):
    text = (ROOT / doc).read_text()
    missing = sorted(p for p in cited_paths(text) if resolve(p) is None)
    assert not missing, f"{doc} cites {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_beside_a_module_is_defined_there(doc):
    text = (ROOT / doc).read_text()
    bad = []
    for path, name in module_names(text):
        target = resolve(path)
        if target is None:
            bad.append(f"{path} (no such module)")
        elif not _defines(target, name):
            bad.append(f"{path} {name}")
    assert not bad, f"{doc}: names not defined in the module beside them: {bad}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_dotted_name_in_docs_resolves(doc):
    bad = []
    for dotted in DOTTED.findall((ROOT / doc).read_text()):
        parts = dotted.split(".")
        for k in range(len(parts), 0, -1):  # the longest prefix that is a module or package
            base = ROOT / "src" / Path(*parts[:k])
            if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
                module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base
                rest = parts[k:]
                if rest and not _defines(module, rest[0]):
                    bad.append(dotted)
                break
        else:
            bad.append(dotted)
    assert not bad, f"{doc}: {bad}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_page_in_docs_is_a_page_the_report_writes(doc):
    pages = known_pages()
    patterns = [re.compile(re.escape(p).replace(re.escape("<vlm>"), r"[\w<>-]+") + "$") for p in pages]
    bad = sorted({p for p in PAGE.findall((ROOT / doc).read_text())
                  if not any(pt.match(p.replace("<vlm>", "x")) or pt.match(p) for pt in patterns)})
    assert not bad, f"{doc} names pages the report does not write: {bad} (it writes {sorted(pages)})"


@pytest.mark.parametrize("doc", DOCS)
def test_every_declared_table_column_in_docs_is_declared(doc):
    tables = {t.name: t for t in C.ANALYSIS_TABLES if "{" not in t.name}
    bad = []
    for table, column in TABLE_COLUMN.findall((ROOT / doc).read_text()):
        t = tables.get(table)
        if column in ("csv", "md", "json", "parquet", "html"):
            continue  # a file name, not a column
        if t is not None and not t.keeps(column):
            bad.append(f"{table}.{column}")
    assert not bad, f"{doc}: columns not declared in contracts.py: {bad}"


def test_the_pointer_checks_catch_a_rotten_pointer():
    """The checks fail where they should: a module that is now a package, a name not in its module, a page
    the report does not write."""
    assert resolve("vlm/analysis.py") is None
    assert ("t2i/analysis/skin.py", "no_such_function") in module_names("`t2i/analysis/skin.py` `no_such_function`")
    assert not _defines(ROOT / "src/biasaudit/t2i/analysis/skin.py", "no_such_function")
    assert _defines(ROOT / "src/biasaudit/t2i/analysis/skin.py", "women_share_regression")
    assert "a-skin" in known_pages() and "a-no_such_section" not in known_pages()


CSV = re.compile(r"`(?:<vlm>_)?(" + IDENT + r")\.csv`")


@pytest.mark.parametrize("doc", DOCS)
def test_every_table_file_in_docs_is_one_the_code_writes(doc):
    """`name.csv` (or `<vlm>_name.csv`): a declared table or a name the code under src/ or notebooks/ spells."""
    code = "".join(p.read_text() for base in ("src", "notebooks") for p in (ROOT / base).rglob("*.py"))
    declared = {t.name.replace("{vlm}_", "") for t in C.ANALYSIS_TABLES}
    bad = sorted({n for n in CSV.findall((ROOT / doc).read_text())
                  if n not in declared and not re.search(rf"\b{n}\b", code)})
    assert not bad, f"{doc} names tables no code writes: {bad}"
