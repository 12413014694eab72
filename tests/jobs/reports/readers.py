"""Readers of written reports, for the tests: CSV files and the HTML page's ``data-table`` rows."""
from __future__ import annotations

import csv
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from kdeval.jobs.reports.report_rows import TABLES, row_from_dict


def read_csv(out_dir: Path) -> dict[str, list[Any]]:
    """The tables written by ``kdeval.jobs.reports.render.formats.write_csv``."""
    out = {}
    for name, cls in TABLES.items():
        with open(out_dir / f"{name}.csv", newline="", encoding="utf-8") as fh:
            out[name] = [row_from_dict(cls, r) for r in csv.DictReader(fh)]
    return out


class _TableParser(HTMLParser):
    """Collects the ``data-row`` of every row of every ``<table data-table=...>``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("data-table")
        elif tag == "tr" and self._table is not None and a.get("data-row"):
            self.tables.setdefault(self._table, []).append(json.loads(a["data-row"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None


def read_html_tables(text: str) -> dict[str, list[Any]]:
    """The rows of every ``data-table`` table of an HTML report (tables of one name concatenated)."""
    p = _TableParser()
    p.feed(text)
    out: dict[str, list[Any]] = {name: [] for name in TABLES}
    for name, rows in p.tables.items():
        if name in TABLES:
            out[name] += [row_from_dict(TABLES[name], r) for r in rows]
    return out
