"""A leaderboard as tables of text (terminal, Markdown), CSV and JSON.

One table per model × task instance, rows in rank order; every number printed by
:mod:`kdeval.jobs.reports.render.units`, as the report prints it (scores and Δ in points, ``†`` on a CI from
fewer than 10 pairs, KV bytes in MiB or GiB, seconds and rates to 3 significant digits). A column whose value is
the same on every row of the whole leaderboard (one protocol, no quantized store) moves into the caption. JSON
and CSV carry every field of every row, raw (:class:`~kdeval.jobs.reports.leaderboard.build.LeaderboardRow`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections import defaultdict

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.interop.csv_safe import safe_cell
from kdeval.jobs.reports.leaderboard.build import OTHER_CODE, Leaderboard, LeaderboardRow
from kdeval.jobs.reports.report_rows import State, format_value
from kdeval.jobs.reports.render.formats import _md_cell, md_table
from kdeval.jobs.reports.render.layout import Column, TableView
from kdeval.jobs.reports.render.units import MIN_CI_SAMPLES, bytes_unit, few_samples_legend, interval, points, text
from kdeval.jobs.reports.render.views import budget_text

#: Every field of a row, in order (the CSV header).
FIELDS = [f.name for f in dataclasses.fields(LeaderboardRow)]


def delta_text(r: LeaderboardRow) -> str:
    """``-12.50 [-20.00, -5.00]``, ``reference`` (the full cache itself) or ``no full cache``."""
    if r.state == State.REFERENCE:
        return "reference"
    if r.delta is None:
        return "no full cache" if r.state == State.MISSING else "no pairs"
    return f"{points(r.delta, signed=True)} {interval(r.ci_low, r.ci_high, 'delta', r.n_paired)}"


def short_code(code: str) -> str:
    """The hash of a code version (``0.1.0+1a2b3c4d5e6f`` -> ``1a2b3c4d``); the text itself when it has none."""
    return code.split("+", 1)[1][:8] if "+" in code else code[:12]


#: The marks of the terminal's note column, and what they mean (the caption's legend).
VARIANT_MARK, FOREIGN_MARK = "‡", "§"
MARKS = {VARIANT_MARK: "another cell of this configuration was computed by other code or settings (its own row; "
                       "md, json and html say what differs)",
         FOREIGN_MARK: "paired with a full cache of another run whose code differs or was not recorded"}


def note_text(r: LeaderboardRow, long: bool = True) -> str:
    """The row's flags: another code version of its configuration, how its reference was chosen. ``long``
    False: the marks of :data:`MARKS` only (the terminal, whose caption explains them)."""
    foreign = r.ref_note.startswith(OTHER_CODE)
    if not long:
        return "".join(m for m, on in ((VARIANT_MARK, bool(r.variant)), (FOREIGN_MARK, foreign)) if on)
    parts = []
    if r.variant:
        parts.append(f"{VARIANT_MARK} code {short_code(r.code)}: {r.variant}")
    if r.ref_note and r.state != State.MISSING:
        parts.append(f"{FOREIGN_MARK} {r.ref_note.removeprefix(OTHER_CODE + ': ')}" if foreign else r.ref_note)
    return "; ".join(parts)


def groups(board: Leaderboard) -> dict[tuple[str, str], list[LeaderboardRow]]:
    """Rows by (model, task instance), in the leaderboard's order."""
    out: dict[tuple[str, str], list[LeaderboardRow]] = defaultdict(list)
    for r in board.rows:
        out[(r.model, r.task)].append(r)
    return dict(out)


def constant_columns(board: Leaderboard) -> dict[str, str]:
    """Protocol and KV store when every row has the same one (they go into the caption): name -> value."""
    out = {}
    for name in ("protocol", "kv_quant"):
        values = {getattr(r, name) for r in board.rows}
        if len(values) == 1:
            out[name] = values.pop()
    return out


def table_view(board: Leaderboard, model: str, task: str, rows: list[LeaderboardRow],
               with_code: bool = False, long: bool = True) -> TableView:
    """One model × task instance as a table (``with_code``: the code version column on every table; ``long``
    False: notes as marks, for the terminal). The caption (:func:`caption`) is said once, under every table."""
    unit_name, unit = bytes_unit([r.peak_kv_bytes for r in board.rows])
    const = constant_columns(board)
    chunks = {r.chunk for r in rows}
    code = with_code or any(r.variant for r in rows)
    cols = [Column("#", numeric=True), Column("policy", key=True), Column("N", numeric=True)]
    cols += [Column("B", numeric=True)] if len(chunks) > 1 else []
    cols += [Column("n", numeric=True), Column("score", numeric=True), Column("Δ vs full [95% CI]", numeric=True),
             Column(f"KV {unit_name}", numeric=True), Column("KV ×full", numeric=True),
             Column("TTFT s", numeric=True), Column("tok/s", numeric=True)]
    cols += [Column("protocol", key=True)] if "protocol" not in const else []
    cols += [Column("kv_quant", key=True)] if "kv_quant" not in const else []
    cols += [Column("code", key=True)] if code else []
    cols += [Column("cell", key=True), Column("note", fold=True)]
    body = []
    for r in rows:
        cells = [str(r.rank), r.policy, budget_text(r.budget)] + ([chunk_text(r.chunk)] if len(chunks) > 1 else [])
        cells += [str(r.n), points(r.value), delta_text(r), text(r.peak_kv_bytes, "peak_kv_bytes", unit),
                  text(r.kv_bytes_ratio, "kv_bytes_ratio"), text(r.ttft_median_s, "ttft_median_s"),
                  text(r.decode_tok_s, "decode_tok_s")]
        cells += [r.protocol] if "protocol" not in const else []
        cells += [r.kv_quant or "-"] if "kv_quant" not in const else []
        cells += [short_code(r.code)] if code else []
        cells += [r.cell[:8], note_text(r, long)]
        body.append(cells)
    chunk = f", B={chunk_text(next(iter(chunks)))}" if len(chunks) == 1 else ""
    title = f"{model} — {task}{chunk} (ranked by {board.meta.order})"
    return TableView("leaderboard", title, cols, body, [r.state for r in rows], list(rows))


def caption(board: Leaderboard) -> str:
    """What every table's rows share, and the legends of their marks."""
    const = constant_columns(board)
    shared = []
    if "protocol" in const:
        shared.append(f"protocol {const['protocol']}")
    if "kv_quant" in const:
        shared.append(f"KV store {const['kv_quant'] or 'at the model width'}")
    parts = [f"every row: {', '.join(shared)}"] if shared else []
    if any(r.delta is not None and r.n_paired < MIN_CI_SAMPLES for r in board.rows):
        parts.append(few_samples_legend())
    for mark, meaning in MARKS.items():
        if any(mark in note_text(r, long=False) for r in board.rows):
            parts.append(f"{mark} {meaning}")
    return "; ".join(parts)


def table_views(board: Leaderboard, with_code: bool = False, long: bool = True) -> list[TableView]:
    """Every model × task instance's table, in order."""
    return [table_view(board, model, task, rows, with_code, long) for (model, task), rows in groups(board).items()]


def summary_line(board: Leaderboard) -> str:
    """``12 cells from 3 runs; 2 models × 4 task instances``."""
    g = groups(board)
    models = {m for m, _ in g}
    return (f"{board.meta.cells} cell(s) from {board.meta.runs} run(s) of the index; {len(models)} model(s), "
            f"{len(g)} task instance(s)")


def to_markdown(board: Leaderboard) -> str:
    """The leaderboard for reading: what it holds and how Δ is computed, then one table per model × task."""
    m = board.meta
    lines = ["# kdeval leaderboard", "", f"- {summary_line(board)}", f"- ranked by: {m.order}",
             f"- {m.method}", f"- created: {m.created}"]
    lines += [f"- filter {k}: {_md_cell(', '.join(v))}" for k, v in m.filters.items()]
    lines += [f"- note: {_md_cell(n)}" for n in m.notes] + [f"- **warning**: {_md_cell(w)}" for w in m.warnings]
    lines += [f"- {_md_cell(caption(board))}"]
    for view in table_views(board, with_code=True):
        lines += [""] + md_table(view)
    return "\n".join(lines) + "\n"


def to_json(board: Leaderboard) -> str:
    """Every field of the meta and of every row, raw."""
    return json.dumps({"meta": dataclasses.asdict(board.meta), "rows": [dataclasses.asdict(r) for r in board.rows]},
                      indent=2, ensure_ascii=False)


def to_csv(board: Leaderboard) -> str:
    """One line per row, every field (text a spreadsheet would run as a formula is quoted with ``'``)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(FIELDS)
    for r in board.rows:
        w.writerow([safe_cell(format_value(v)) for v in dataclasses.asdict(r).values()])
    return buf.getvalue()
