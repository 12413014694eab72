"""Writing a report as JSON, CSV, Markdown or HTML tables.

JSON and CSV are for programs: every field of every row (:mod:`kdeval.jobs.reports.report_rows`), raw numbers,
units in the field names (``ttft_median_s``, ``peak_kv_bytes``; scores in points); both parse back to the
same rows. Markdown and HTML are for readers: the tables of :mod:`kdeval.jobs.reports.render.views`, printed
as the terminal prints them; HTML rows also carry their raw row (``data-row``), so a page reads back too.

* JSON: one file ``{"meta": ..., "scores": [...], "perf": [...], "cells": [...], "provenance": [...]}``
  (``meta.warnings``: one line each, e.g. the compared cells ran on different devices).
* CSV: one file per table (``scores.csv``, ``perf.csv``, ``cells.csv``, ``provenance.csv``).
* Markdown: one file: the headline table, then scores, contrasts, conversations by turn, what compression broke,
  speed, answer length, memory, cells, provenance, slices.
* HTML tables: ``<table data-table="scores">`` (the HTML report embeds them, see ``html.py``).
"""
from __future__ import annotations

import csv
import dataclasses
import html
import io
import json
from pathlib import Path
from typing import Any

from kdeval.jobs.interop.csv_safe import safe_cell
from kdeval.jobs.reports.report_rows import TABLES, Report, ReportMeta, format_value, row_from_dict
from kdeval.jobs.reports.render import turn_views, views
from kdeval.jobs.reports.render.layout import Column, TableView


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


# ------------------------------------------------------------------ Markdown
def _md_cell(value: str) -> str:
    """``value`` as text inside a Markdown table cell or line: HTML in it is escaped (a model id such as
    ``<img src=x onerror=...>`` shows as text in every viewer), ``|`` cannot end the cell, a newline the line."""
    return html.escape(value, quote=False).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_table(view: TableView) -> list[str]:
    """A view as a Markdown pipe table (numbers right-aligned), with its title and caption."""
    lines = [f"**{_md_cell(view.title)}**", "", "| " + " | ".join(_md_cell(c.header) for c in view.columns) + " |",
             "|" + "|".join("---:" if c.numeric else "---" for c in view.columns) + "|"]
    lines += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in view.rows]
    return lines + (["", f"_{_md_cell(view.caption)}_"] if view.caption and view.rows else [])


def to_markdown(report: Report) -> str:
    """The report as Markdown for reading: what was compared, the headline table, then scores, speed, memory,
    cells not done, provenance and slices, printed as the terminal prints them (JSON and CSV hold the raw
    numbers)."""
    m = report.meta
    lines = ["# kdeval report", "",
             f"- runs: {_md_cell(', '.join(m.runs))}", f"- compared with: {_md_cell(m.compare)}",
             f"- delta: {_md_cell(m.method)}", f"- created: {m.created}"]
    lines += [f"- note: {_md_cell(n)}" for n in m.notes]
    lines += [f"- **warning**: {_md_cell(w)}" for w in m.warnings]
    headline = [r for r in report.scores if r.level != "detail"]
    detail = [r for r in report.scores if r.level == "detail"]
    cells = views.cells_view(report)
    setups = views.provenance_view(report)
    sections: list[tuple[str, list[TableView]]] = [
        ("Headline", [h.as_table() for h in views.headline_views(report)]),
        ("Scores", [views.scores_view(report, headline)]),
        *_contrast_sections(report),
        ("Conversations by turn", turn_views.conversation_views(report)),
        ("What compression broke", [v] if (v := turn_views.broken_view(report)) is not None else []),
        ("Speed", [views.speed_view(report)] if report.perf else []),
        ("Answer length", [v] if (v := turn_views.length_view(report)) is not None else []),
        ("Memory", [views.memory_view(report)] if report.perf else []),
        ("Cells not done or missing", [cells] if cells is not None else []),
        ("Provenance", [setups] if setups is not None else []),
        ("Slices", [views.scores_view(report, detail)] if detail else []),
    ]
    for title, tables in sections:
        if not tables:
            continue
        lines += ["", f"## {title}"]
        for view in tables:
            lines += [""] + md_table(view)
    return "\n".join(lines) + "\n"


def _contrast_sections(report: Report) -> list[tuple[str, list[TableView]]]:
    """The cost-of-chunking and query-dependence sections (empty when the runs lack a side), and the accuracy per
    KV byte (empty when no cell is quantized)."""
    from kdeval.jobs.reports.render.contrast_views import CONTRASTS, contrast_view
    from kdeval.jobs.reports.render.frontier_views import TITLE, frontier_view

    frontier = frontier_view(report)
    return [(title, [v] if (v := contrast_view(report, name)) is not None else [])
            for name, (title, _, _) in CONTRASTS.items()] + [(TITLE, [frontier] if frontier is not None else [])]


def fields_view(name: str, rows: list[Any]) -> TableView:
    """Every field of ``rows`` as it is stored (for tables of text such as provenance)."""
    fields = _fields(name)
    body = [[format_value(v) for v in dataclasses.asdict(r).values()] for r in rows]
    return TableView(name, name, [Column(f) for f in fields], body, [""] * len(rows), list(rows))


# ------------------------------------------------------------------ HTML tables
def _cell_class(column: Column) -> str:
    """A cell's CSS classes as :class:`Column` says it reads: ``num``; ``txt key`` (whole on one line), ``txt fold``
    (a long word may break anywhere) or ``txt`` (wraps at spaces)."""
    if column.numeric:
        return "num"
    return "txt key" if column.key else "txt fold" if column.fold else "txt"


def html_table(view: TableView, *, source: str | None = None, css_class: str = "") -> str:
    """A view as ``<table data-table=...>``: readable headers and cells (numbers right-aligned, class ``num``),
    each row's state as its class and, with ``source`` (the report table the rows come from), the raw row
    as JSON in ``data-row``, so the page can be read back exactly."""
    name = source or view.name
    head = "".join(f'<th class="{"num" if c.numeric else "txt"}">{html.escape(c.header)}</th>' for c in view.columns)
    body = []
    for i, cells in enumerate(view.rows):
        state = html.escape(view.states[i] if i < len(view.states) else "")
        raw = ""
        if source is not None:
            raw = f' data-row="{html.escape(json.dumps(dataclasses.asdict(view.raw[i]), ensure_ascii=False))}"'
        tds = "".join(f'<td class="{_cell_class(c)}">{html.escape(x)}</td>' for c, x in zip(view.columns, cells))
        body.append(f'<tr class="{state}"{raw}>{tds}</tr>')
    return (f'<table data-table="{html.escape(name)}" class="{css_class}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


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
        w.writerow([safe_cell(format_value(v)) for v in dataclasses.asdict(r).values()])
    return buf.getvalue()
