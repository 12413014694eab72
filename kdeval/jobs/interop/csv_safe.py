"""CSV cells a spreadsheet will not run: text that opens as a formula gets a leading ``'``.

Spreadsheets read a cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return as a formula
(CSV injection; OWASP's advice: prefix such cells with a single quote). A model's prediction or a run name is
anybody's text, so every text cell of kdeval's spreadsheet exports (``export --format csv``, ``report --format
csv``) goes through :func:`safe_cell`; a number written as text (``-1.5``, ``-inf``) stays as it is.
"""
from __future__ import annotations

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet evaluates: ``'`` before a formula-like start."""
    if not text.startswith(_FORMULA_START):
        return text
    if text[0] in "+-":
        try:
            float(text)
            return text  # a number, not a formula
        except ValueError:
            pass
    return "'" + text
