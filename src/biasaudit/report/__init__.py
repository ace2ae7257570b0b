"""The offline HTML report (`reports/index.html`) that links every figure, table and notebook."""

from biasaudit.report.html import build_index

__all__ = ["build_index"]
