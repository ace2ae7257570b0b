"""The offline report: `reports/index.html` (front page), `images.html`, `focus.html`, the notebooks'
HTML, and the quiet stage runner behind `scripts/run-notebook` (`execute`)."""

from __future__ import annotations

from typing import Any

__all__ = ["build_index"]


def __getattr__(name: str) -> Any:  # lazy: `scripts/run-notebook` imports execute without pandas
    if name == "build_index":
        from biasaudit.report.html import build_index

        return build_index
    raise AttributeError(name)
