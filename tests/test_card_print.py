"""The audit card in print: headless Chromium prints a card of several pages (`biasaudit card --pdf`), and the
text of each page of the PDF (tests/pdf_text.py) must show the banner, the header row of the table that runs
onto it, and every table row whole on one page; a reprint is byte-identical and carries no date of printing.
The stylesheet itself must be one Chromium keeps (no doubled braces). Skipped without Debian `chromium`."""

from __future__ import annotations

import html
import re
import unicodedata
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from biasaudit.cli import main
from biasaudit.report import audit_card as ac
from biasaudit.report import pdf

from .pdf_text import page_texts

BOOT = ac.Resampling(n_boot=50, level=0.95, method="percentile", seed=7)
DOUBLED = re.compile(r"@media[^{]*\{\{|@page[^{]*\{\{")  # what a str.format template left unformatted looks like
PARTS = ["planted generator gen-x"]


def flat(text: str) -> str:
    """Text compared without its white space (the PDF spaces glyph runs as drawn) and ligatures (ﬁ → fi)."""
    return unicodedata.normalize("NFKC", re.sub(r"\s+", "", text))


def long_card(tmp: Path, groups: int = 60, stand_in: bool = True) -> Path:
    """A Method A card whose representation tables (one row per group, three references) run over pages."""
    names = [f"g{i:02d}" for i in range(groups)]
    rng = np.random.default_rng(0)
    rows = []
    for p in range(4):
        counts, bench = rng.integers(1, 20, groups), rng.dirichlet(np.ones(groups))
        rows.append({"model": "gen-x", "prompt_id": f"p{p}", "n": int(counts.sum())}
                    | {f"n_{g}": int(c) for g, c in zip(names, counts)}
                    | {f"share_{g}": c / counts.sum() for g, c in zip(names, counts)}
                    | {f"bench_{g}": b for g, b in zip(names, bench)})
    tables = tmp / "reports" / "t2i" / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(tables / "tvd_per_prompt.csv", index=False)
    (tmp / "responses").mkdir()
    ac.build_cards(tmp / "reports", tmp / "responses", BOOT, BOOT, {"salary_salary": None}, stand_in=stand_in, out_dir=tmp / "audit",
                   stand_ins=PARTS if stand_in else [], run={"profile": "offline", "git_commit": "abc", "run_date": "d"})
    return tmp / "audit"


def table_rows(page: str) -> list[tuple[str, list[str]]]:
    """(header row, body rows) of each table on a card page, as flat text."""
    out = []
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        head = flat("".join(html.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)))
        body = [flat("".join(html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)))
                for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>", 1)[1], re.S)]
        out.append((head, body))
    return out


def test_no_card_page_has_a_stylesheet_chromium_drops(tmp_path):
    audit = long_card(tmp_path, groups=3)
    for page in audit.glob("*.html"):
        text = page.read_text()
        assert not DOUBLED.search(text), page.name
        assert "position:running" not in text and "@media print{" in text and "@top-center{content:" in text


def test_the_css_string_escapes_what_would_end_it():
    # \22 is '"', \5C the backslash, \3C '<' (a '</style>' inside the banner must not close the stylesheet)
    assert ac._css_string('a "b" \\ </style>') == '"a \\22 b\\22  \\5C  \\3C /style\\3E "'


@pytest.mark.skipif(pdf.chromium() is None, reason="Debian chromium not installed (apt-get install chromium)")
@pytest.mark.parametrize("stand_in", [True, False])
def test_a_printed_card_repeats_its_banner_and_headers_and_splits_no_row(tmp_path, stand_in):
    audit = long_card(tmp_path, stand_in=stand_in)
    out = tmp_path / "print"
    assert main(["card", "--pdf", "--audit-dir", str(audit), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["gen-x.pdf"]  # a card per model, not the index
    pages = [flat(t) for t in page_texts(out / "gen-x.pdf")]
    assert len(pages) >= 3, len(pages)
    banner = flat(ac.BANNER_TEXT.format(parts="; ".join(PARTS)) if stand_in else "Audit card: gen-x")
    for k, text in enumerate(pages, 1):
        assert text.startswith(banner), (k, text[:200])  # the top margin of every page
        assert flat(f"Audit card: gen-x · page {k} of {len(pages)}") in text, k
    tables = table_rows((audit / "gen-x.html").read_text())
    continued = 0
    for head, body in tables:
        for row in body:  # each row whole on exactly one page
            assert sum(row in t for t in pages) == 1, row
        on = [k for k, t in enumerate(pages) if any(row in t for row in body)]
        for k in on:  # the header row on every page the table reaches
            assert head in pages[k], (head, k)
        continued += len(on) - 1
    assert continued >= 3  # the test's tables do run over pages


@pytest.mark.skipif(pdf.chromium() is None, reason="Debian chromium not installed (apt-get install chromium)")
def test_a_reprint_is_byte_identical_and_undated(tmp_path):
    audit = long_card(tmp_path, groups=8)
    first = pdf.print_pdf(audit / "gen-x.html", tmp_path / "a.pdf").read_bytes()
    second = pdf.print_pdf(audit / "gen-x.html", tmp_path / "b.pdf").read_bytes()
    assert first == second
    assert b"/CreationDate" not in first and b"/ModDate" not in first
    assert first.startswith(b"%PDF-") and len(page_texts(tmp_path / "a.pdf")) >= 1


def test_undated_keeps_every_offset():
    raw = b"1 0 obj\n<</Title (t)\n/CreationDate (D:20261204130608+00'00')\n/ModDate (D:2026\\)x)>>\nendobj\n"
    out = pdf.undated(raw)
    assert len(out) == len(raw) and b"D:2026" not in out and out.startswith(b"1 0 obj\n<</Title (t)\n")


def test_card_without_pdf_or_cards(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["card", "--audit-dir", str(tmp_path)])
    assert main(["card", "--pdf", "--audit-dir", str(tmp_path), "--out", str(tmp_path / "p")]) == 1
    assert "no audit card" in capsys.readouterr().out
