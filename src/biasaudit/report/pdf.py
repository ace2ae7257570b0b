"""A PDF of each audit card, printed by headless Chromium (`biasaudit card --pdf`).

Chromium prints the card's own print stylesheet (audit_card.print_css: the banner in every page's top margin,
header rows repeated, no row split). `--no-pdf-header-footer` leaves out the browser's own header and footer
(the file's URL and the time of printing). Chromium still writes the time of printing into the PDF's
information dictionary (/CreationDate, /ModDate); those two entries are blanked in place (overwritten with
spaces, so every byte offset of the file's cross-reference table still holds), which makes two prints of one
card byte-identical with the same Chromium. The PDFs go to reports/print/, which no dvc stage declares:
they are copies for filing, made on demand, not pipeline outputs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from biasaudit.pipeline.io import atomic_write_bytes

AUDIT_DIR = Path("reports/audit")
PRINT_DIR = Path("reports/print")
DATES = re.compile(rb"/(?:CreationDate|ModDate)\s*\((?:[^()\\]|\\.)*\)")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def undated(pdf: bytes) -> bytes:
    """The PDF with its /CreationDate and /ModDate entries overwritten by spaces (same length: offsets hold)."""
    return DATES.sub(lambda m: b" " * len(m.group(0)), pdf)


def print_pdf(page: Path, out: Path, browser: str | None = None, timeout: float = 120) -> Path:
    """Print one HTML page to `out` with headless Chromium; the PDF carries no date of printing."""
    browser = browser or chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium on PATH to print with (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="biasaudit-print-") as tmp:
        target = Path(tmp) / "page.pdf"
        cmd = [browser, "--headless=new", "--disable-gpu", "--no-first-run", "--no-pdf-header-footer",
               f"--user-data-dir={Path(tmp) / 'profile'}", f"--print-to-pdf={target}", Path(page).resolve().as_uri()]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium will not start as root with its sandbox
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not target.exists():
            raise RuntimeError(f"Chromium could not print {page} (exit {done.returncode}): {done.stderr[-2000:]}")
        atomic_write_bytes(Path(out), undated(target.read_bytes()))
    return Path(out)


def card_pages(audit_dir: Path = AUDIT_DIR) -> list[Path]:
    """Every model's card page (the side-by-side index.html is not a card)."""
    return sorted(p for p in Path(audit_dir).glob("*.html") if p.name != "index.html")


def print_cards(audit_dir: Path = AUDIT_DIR, out_dir: Path = PRINT_DIR, browser: str | None = None) -> list[Path]:
    """A PDF of each card in `audit_dir`, as out_dir/<model>.pdf."""
    return [print_pdf(page, Path(out_dir) / f"{page.stem}.pdf", browser) for page in card_pages(audit_dir)]
