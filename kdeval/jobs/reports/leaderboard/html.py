"""The leaderboard as one self-contained HTML page (inline CSS and script, figures as PNG data URIs, no URL).

Top to bottom: what it holds (cells, runs, how Δ is computed, filters, notes and warnings); a search box that
keeps the rows holding every word typed (model, task, policy, cell id, run ...); one table of every row whose
column headers sort it (numbers by their raw value, blanks last; a second click reverses); then per model × task
instance the score-vs-budget and score-vs-KV-bytes figures (:mod:`.leaderboard_plots`). Each row carries its raw
row as JSON (``data-row``) and each numeric cell its raw value (``data-v``), so the page reads back exactly.
"""
from __future__ import annotations

import base64
import dataclasses
import html
import json

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports.leaderboard.build import Leaderboard, LeaderboardRow
from kdeval.jobs.reports.render.html import _CSS
from kdeval.jobs.reports.leaderboard.plots import task_figure
from kdeval.jobs.reports.leaderboard.views import (caption, delta_text, groups, note_text, short_code,
                                                          summary_line)
from kdeval.jobs.reports.render.units import bytes_unit, points, text
from kdeval.jobs.reports.render.views import budget_text

_EXTRA_CSS = """
#search { font: inherit; padding: .35em .6em; width: 28em; max-width: 100%; border: 1px solid #d0d7de;
          border-radius: 6px; margin: .4em 0 .2em; }
#shown { color: #57606a; margin-left: .8em; }
table.sortable thead th { cursor: pointer; user-select: none; }
table.sortable thead th[aria-sort="ascending"]:after { content: " ▲"; }
table.sortable thead th[aria-sort="descending"]:after { content: " ▼"; }
tr.reference td { background: #f6f8fa; }
"""

_SCRIPT = """
(function () {
  const table = document.getElementById('board');
  const body = table.tBodies[0];
  const search = document.getElementById('search');
  const shown = document.getElementById('shown');
  function count() {
    const all = body.rows.length;
    const visible = Array.from(body.rows).filter(r => r.style.display !== 'none').length;
    shown.textContent = visible + ' of ' + all + ' rows';
  }
  search.addEventListener('input', function () {
    const words = search.value.toLowerCase().split(/\\s+/).filter(Boolean);
    for (const row of body.rows) {
      const hay = row.textContent.toLowerCase() + ' ' + (row.dataset.search || '');
      row.style.display = words.every(w => hay.includes(w)) ? '' : 'none';
    }
    count();
  });
  const heads = table.tHead.rows[0].cells;
  Array.from(heads).forEach(function (th, col) {
    th.addEventListener('click', function () {
      const descending = th.getAttribute('aria-sort') === 'ascending';
      Array.from(heads).forEach(h => h.removeAttribute('aria-sort'));
      th.setAttribute('aria-sort', descending ? 'descending' : 'ascending');
      const numeric = th.classList.contains('num');
      const key = function (row) {
        const cell = row.cells[col];
        if (numeric) { const v = cell.dataset.v; return v === undefined || v === '' ? null : parseFloat(v); }
        return cell.textContent.toLowerCase();
      };
      const rows = Array.from(body.rows);
      rows.sort(function (a, b) {
        const x = key(a), y = key(b);
        if (x === null && y === null) return 0;
        if (x === null) return 1;
        if (y === null) return -1;
        const c = x < y ? -1 : x > y ? 1 : 0;
        return descending ? -c : c;
      });
      rows.forEach(r => body.appendChild(r));
    });
  });
  count();
})();
"""


def _columns(r: LeaderboardRow, unit: int, unit_name: str) -> list[tuple[str, bool, str, object]]:
    """(header, numeric, text, raw sort value or None) of each column of a row."""
    budget = r.budget if isinstance(r.budget, (int, float)) else None
    runs = r.runs.split()
    return [("model", False, r.model, None), ("task", False, r.task, None), ("#", True, str(r.rank), r.rank),
            ("policy", False, r.policy, None), ("N", True, budget_text(r.budget), budget),
            ("B", True, chunk_text(r.chunk), r.chunk), ("n", True, str(r.n), r.n),
            ("score", True, points(r.value), r.value), ("Δ vs full [95% CI]", True, delta_text(r), r.delta),
            (f"KV {unit_name}", True, text(r.peak_kv_bytes, "peak_kv_bytes", unit), r.peak_kv_bytes),
            ("KV ×full", True, text(r.kv_bytes_ratio, "kv_bytes_ratio"), r.kv_bytes_ratio),
            ("TTFT s", True, text(r.ttft_median_s, "ttft_median_s"), r.ttft_median_s),
            ("tok/s", True, text(r.decode_tok_s, "decode_tok_s"), r.decode_tok_s),
            ("protocol", False, r.protocol, None), ("kv_quant", False, r.kv_quant or "-", None),
            ("code", False, short_code(r.code), None), ("cell", False, r.cell[:8], None),
            ("runs", False, runs[0] + (f" +{len(runs) - 1}" if len(runs) > 1 else "") if runs else "", None),
            ("note", False, note_text(r), None)]


#: Columns left out of the page's table when every row holds the same text (the header says it instead).
CONSTANT = ("model", "B", "protocol", "kv_quant")


def board_table(board: Leaderboard) -> tuple[str, list[str]]:
    """Every row as one sortable ``<table id="board">`` (numeric cells carry ``data-v``, rows ``data-row``), and
    what every row shares (``model m``: the columns left out)."""
    unit_name, unit = bytes_unit([r.peak_kv_bytes for r in board.rows])
    table = [_columns(r, unit, unit_name) for r in board.rows]
    heads = [c[0] for c in table[0]]
    same = [j for j, h in enumerate(heads) if h in CONSTANT and len({row[j][2] for row in table}) == 1]
    shared = [f"{heads[j]}={table[0][j][2] if table[0][j][2] != '-' else 'none'}" for j in same]
    empty = [j for j, h in enumerate(heads) if h == "note" and not any(row[j][2] for row in table)]
    keep = [j for j in range(len(heads)) if j not in same and j not in empty]
    head = "".join(f'<th class="{"num" if table[0][j][1] else "txt"}" scope="col">{html.escape(heads[j])}</th>'
                   for j in keep)
    body = []
    for r, cols in zip(board.rows, table):
        tds = []
        for j in keep:
            _, num, value, raw = cols[j]
            attr = f' data-v="{html.escape(json.dumps(raw))}"' if num and raw is not None else ""
            css = "num" if num else "txt" if heads[j] == "note" else "txt key"
            title = f' title="{html.escape(r.runs)}"' if heads[j] == "runs" else ""
            tds.append(f'<td class="{css}"{attr}{title}>{html.escape(value)}</td>')
        raw_row = html.escape(json.dumps(dataclasses.asdict(r), ensure_ascii=False))
        search = html.escape(f"{r.cell} {r.runs} {r.code} {r.variant} {r.ref_note}".lower())
        body.append(f'<tr class="{html.escape(r.state)}" data-row="{raw_row}" data-search="{search}">'
                    f'{"".join(tds)}</tr>')
    return (f'<table id="board" class="sortable" data-table="leaderboard"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>'), shared


def figures(board: Leaderboard) -> list[str]:
    """One figure per model × task instance (score vs budget, score vs KV bytes) as ``<figure>`` elements."""
    out = []
    for (model, task), rows in groups(board).items():
        title = f"{model} — {task}"
        png = base64.b64encode(task_figure(title, rows)).decode("ascii")
        out.append(f'<figure class="wide" data-figure="{html.escape(title, quote=True)}">'
                   f'<img alt="{html.escape(title, quote=True)}: score vs budget and vs KV bytes" '
                   f'src="data:image/png;base64,{png}"><figcaption>{html.escape(title)}: score vs budget N (bars: '
                   f'95% CI of Δ vs the full cache, dashed: the full cache) and score vs peak KV-cache bytes'
                   f'</figcaption></figure>')
    return out


def render_page(board: Leaderboard, title: str = "kdeval leaderboard") -> str:
    """The whole page (see the module's docstring)."""
    m = board.meta
    meta = [summary_line(board), f"ranked by {m.order}", f"created {m.created}"]
    meta += [f"{k}: {', '.join(v)}" for k, v in m.filters.items()]
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{html.escape(title)}</title><style>{_CSS}{_EXTRA_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             "<ul class='meta'>" + "".join(f"<li>{html.escape(x)}</li>" for x in meta) + "</ul>",
             f"<p class='caption'>{html.escape(m.method)}. {html.escape(caption(board))}.</p>"]
    parts += [f"<p class='warning'>{html.escape(w)}</p>" for w in m.warnings]
    parts += [f"<p class='caption'>{html.escape(n)}</p>" for n in m.notes]
    if not board.rows:
        return "".join(parts) + "<p>No done cell matches.</p></body></html>"
    table, shared = board_table(board)
    parts += ["<label for='search'>Search </label><input id='search' type='search' "
              "placeholder='policy, task, cell, run … (all words)'><span id='shown'></span>",
              f"<p class='caption'>every row: {html.escape(', '.join(shared))}</p>" if shared else "",
              table, "<h2>Figures per task</h2><div class='figures'>", *figures(board), "</div>",
              f"<script>{_SCRIPT}</script></body></html>"]
    return "\n".join(parts)
