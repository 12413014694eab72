"""Writing a report as JSON, CSV, Markdown or HTML tables, and reading each back (round trip).

Every format carries every field of every row (:mod:`kdeval.jobs.reports.model`), printed by
:func:`~kdeval.jobs.reports.model.format_value`, so each one parses back to the same rows.

* JSON: one file ``{"meta": ..., "scores": [...], "perf": [...], "cells": [...], "provenance": [...]}``
  (``meta.warnings``: one line each, e.g. the compared cells ran on different devices).
* CSV: one file per table (``scores.csv``, ``perf.csv``, ``cells.csv``, ``provenance.csv``).
* Markdown: one file, a section per table (``## scores``).
* HTML tables: ``<table data-table="scores">`` (the HTML report embeds them, see ``html.py``).
"""
from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from kdeval.jobs.reports.model import (
    TABLES, Report, ReportMeta, format_value, row_from_dict,
)


def _fields(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(TABLES[name])]


def _rows(report: Report, name: str) -> list[Any]:
    return getattr(report, name)


# ------------------------------------------------------------------ JSON
def to_json(report: Report) -> str:
    """The report as JSON text."""
    data: dict[str, Any] = {"meta": dataclasses.asdict(report.meta)}
    for name in TABLES:
        data[name] = [dataclasses.asdict(r) for r in _rows(report, name)]
    return json.dumps(data, indent=2, ensure_ascii=False)


def from_json(text: str) -> Report:
    """A report from :func:`to_json` text."""
    data = json.loads(text)
    tables = {name: [row_from_dict(cls, r) for r in data.get(name, [])] for name, cls in TABLES.items()}
    return Report(meta=ReportMeta(**data["meta"]), **tables)


# ------------------------------------------------------------------ CSV
def write_csv(report: Report, out_dir: Path) -> list[Path]:
    """One ``<table>.csv`` per table (scores first) in ``out_dir``; returns their paths."""
    paths = []
    for name in TABLES:
        path = out_dir / f"{name}.csv"
        with open(path, "w", newline="", encoding="utf-8") as fh:
            fh.write(csv_text(report, name))
        paths.append(path)
    return paths


def read_csv(out_dir: Path) -> dict[str, list[Any]]:
    """The tables written by :func:`write_csv`."""
    out = {}
    for name, cls in TABLES.items():
        with open(out_dir / f"{name}.csv", newline="", encoding="utf-8") as fh:
            out[name] = [row_from_dict(cls, r) for r in csv.DictReader(fh)]
    return out


# ------------------------------------------------------------------ Markdown
def _md_cell(value: Any) -> str:
    return format_value(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(report: Report) -> str:
    """The report as Markdown: a header with what was compared, then one table per kind of row."""
    m = report.meta
    lines = ["# kdeval report", "",
             f"- runs: {', '.join(m.runs)}", f"- compared with: {m.compare}",
             f"- delta: {m.method}", f"- created: {m.created}"]
    lines += [f"- note: {n}" for n in m.notes]
    lines += [f"- **warning**: {w}" for w in m.warnings]
    for name in TABLES:
        fields = _fields(name)
        lines += ["", f"## {name}", "", "| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
        for r in _rows(report, name):
            lines.append("| " + " | ".join(_md_cell(v) for v in dataclasses.asdict(r).values()) + " |")
    return "\n".join(lines) + "\n"


def _split_md_row(line: str) -> list[str]:
    cells, cur, i = [], "", 1
    body = line.strip()
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            cur += body[i + 1]
            i += 2
            continue
        if ch == "|":
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    return cells


def read_markdown(text: str) -> dict[str, list[Any]]:
    """The tables of :func:`to_markdown` text."""
    out: dict[str, list[Any]] = {name: [] for name in TABLES}
    current, header = None, None
    for line in text.splitlines():
        if line.startswith("## "):
            current, header = line[3:].strip(), None
        elif current in TABLES and line.startswith("|"):
            cells = _split_md_row(line)
            if header is None:
                header = cells
            elif not set(line.replace("|", "").strip()) <= {"-"}:
                out[current].append(row_from_dict(TABLES[current], dict(zip(header, cells))))
    return out


# ------------------------------------------------------------------ HTML tables
def html_table(name: str, rows: list[Any], *, css_class: str = "") -> str:
    """One ``<table data-table=name>`` with every field (row state as a class, for colouring)."""
    fields = _fields(name)
    head = "".join(f"<th>{html.escape(f)}</th>" for f in fields)
    body = []
    for r in rows:
        d = dataclasses.asdict(r)
        cls = html.escape(str(d.get("state", "")))
        tds = "".join(f"<td>{html.escape(format_value(v))}</td>" for v in d.values())
        body.append(f'<tr class="{cls}">{tds}</tr>')
    return (f'<table data-table="{name}" class="{css_class}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


class _TableParser(HTMLParser):
    """Collects the rows of every ``<table data-table=...>``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.headers: dict[str, list[str]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: str | None = None
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._table = dict(attrs).get("data-table")
        elif self._table is None:
            return
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag: str) -> None:
        if self._table is None:
            return
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._in_head:
                self.headers[self._table] = self._row
            else:
                self.tables.setdefault(self._table, []).append(self._row)
            self._row = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data


def read_html_tables(text: str) -> dict[str, list[Any]]:
    """The rows of every ``data-table`` table in an HTML document (tables of one name concatenated)."""
    p = _TableParser()
    p.feed(text)
    out: dict[str, list[Any]] = {name: [] for name in TABLES}
    for name, rows in p.tables.items():
        if name in TABLES:
            out[name] += [row_from_dict(TABLES[name], dict(zip(p.headers[name], r))) for r in rows]
    return out


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) into an existing directory."""
    path.write_text(text, encoding="utf-8")
    return path


def csv_text(report: Report, name: str) -> str:
    """One table as CSV text (stdout output of ``--format csv`` without ``--out``)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(_fields(name))
    for r in _rows(report, name):
        w.writerow([format_value(v) for v in dataclasses.asdict(r).values()])
    return buf.getvalue()
