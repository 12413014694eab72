"""Tables of text laid out for a terminal's width: nothing a reader types or must read is cut.

A :class:`TableView` is a table as text cells. :func:`render` lays it out for a console ``width`` cells
wide: names and ids (``Column.key``) stay whole on one line; numbers are never split (a cell such as
``1.01 [0.913, 1.10]`` wraps before its interval, or, only if that cannot fit, at the interval's space);
notes and errors wrap, and fold only a word longer than their column. When even that is wider than the
console, the rows are grouped under headings by their widest name column (task, say), which leaves that
column out; the groups share column widths and the first one's header, so they read as one table. Still too wide, each row is
printed as a record: one "header  value" line per column.
Only rich is imported here (the CLI's listings use it too).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    """A column: its header; whether it holds numbers (right-aligned), names a user types (``key``: each cell
    whole on one line) or free text that may fold a long word (``fold``: notes, errors, paths). Other cells
    wrap at their spaces, never inside a word."""

    header: str
    numeric: bool = False
    key: bool = False
    fold: bool = False


@dataclass(frozen=True)
class TableView:
    """A table as text: ``rows[i][j]`` is the text of column ``j``; ``states[i]`` the row's state (for
    colour) and ``raw[i]`` the report row it shows (the HTML keeps it, so the page reads back exactly)."""

    name: str
    title: str
    columns: list[Column]
    rows: list[list[str]]
    states: list[str] = field(default_factory=list)
    raw: list[Any] = field(default_factory=list)
    caption: str = ""


#: Row colour by state (the report's row states, and a cell's ``running``).
_STYLE = {"partial": "yellow", "failed": "red", "pending": "dim", "missing": "red", "running": "dim"}
#: How titles and captions look (as rich's own table styles them).
_TITLE, _CAPTION = "bold", "table.caption"
#: Cells between two columns (one of padding, one of the box's blank divider).
GAP = 2
#: A note or error column may fold words longer than this rather than widen the table.
TEXT_MIN = 12


#: A word of a cell when intervals are kept whole: ``[a, b]`` (with its mark) is one word.
_WORD = re.compile(r"\[[^\]]*\]\S*|\S+")
_PLAIN = re.compile(r"\S+")


def _words(text: str, whole_intervals: bool) -> list[str]:
    return (_WORD if whole_intervals else _PLAIN).findall(text)


def _longest_word(texts: list[str], whole_intervals: bool = False) -> int:
    return max((cell_len(w) for t in texts for w in _words(t, whole_intervals)), default=0)


def pack(text: str, width: int, whole_intervals: bool = True) -> str:
    """``text`` wrapped at its spaces into lines of at most ``width`` cells, never inside a word (with
    ``whole_intervals``, an interval is one word); a word longer than ``width`` gets a line of its own."""
    lines: list[str] = []
    for word in _words(text, whole_intervals):
        if lines and cell_len(lines[-1]) + 1 + cell_len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def _bounds(column: Column, cells: list[str], whole_intervals: bool = True) -> tuple[int, int]:
    """(narrowest, natural) width of a column: names whole, words unsplit (intervals too, when asked),
    folding text down to :data:`TEXT_MIN`."""
    header_word = _longest_word([column.header])
    natural = max([cell_len(c) for c in cells] + [cell_len(column.header)])
    if column.key:
        narrowest = max([cell_len(c) for c in cells] + [header_word])
    elif column.fold:
        narrowest = min(max(_longest_word(cells), header_word), max(TEXT_MIN, header_word))
    else:
        narrowest = max(_longest_word(cells, whole_intervals and column.numeric), header_word)
    return narrowest, max(natural, narrowest)


def fit_widths(bounds: list[tuple[int, int]], width: int) -> list[int] | None:
    """Column widths that fit ``width`` (gaps included): every column at least its narrowest, the spare
    cells shared in proportion to what each still wants. None when even the narrowest widths do not fit."""
    room = width - GAP * (len(bounds) - 1)
    lows = [lo for lo, _ in bounds]
    if sum(lows) > room:
        return None
    wants = [hi - lo for lo, hi in bounds]
    spare = room - sum(lows)
    if sum(wants) <= spare:
        return [hi for _, hi in bounds]
    widths = [lo + spare * w // sum(wants) for lo, w in zip(lows, wants)]
    for j in sorted(range(len(bounds)), key=lambda j: -wants[j])[: room - sum(widths)]:
        widths[j] += 1
    return widths


def _text(text: str | None, style: str) -> Text | None:
    """A title or caption as plain text in its usual style (names in it are never read as rich markup)."""
    return None if text is None else Text(text, style=style)


def _table(view: TableView, columns: list[int], rows: list[int], widths: list[int] | None, title: str | None,
           caption: str | None, whole_intervals: bool = True, show_header: bool = True) -> Table:
    t = Table(title=_text(title, _TITLE), caption=_text(caption, _CAPTION), box=box.SIMPLE_HEAD,
              show_header=show_header,
              padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, title_justify="left", caption_justify="left", title_style="bold")
    for k, j in enumerate(columns):
        c = view.columns[j]
        t.add_column(Text(c.header), justify="right" if c.numeric else "left", overflow="fold", no_wrap=c.key,
                     header_style="bold", width=None if widths is None else widths[k])
    for i in rows:
        state = view.states[i] if i < len(view.states) else ""
        cells = [view.rows[i][j] for j in columns]
        if widths is not None:  # numbers wrap between words only (rich would split an interval at its space)
            cells = [pack(x, widths[k], whole_intervals) if view.columns[j].numeric else x
                     for k, (j, x) in enumerate(zip(columns, cells))]
        t.add_row(*(escape(x) for x in cells), style=_STYLE.get(state, ""))
    return t


def render(view: TableView, width: int) -> RenderableType:
    """``view`` laid out for a console ``width`` cells wide (see the module's docstring): intervals kept whole
    if that fits, split at their space if only that fits, else one record per row."""
    # A column empty on every row (no notes, say) only costs width: left out, as long as it names nothing.
    columns = [j for j, c in enumerate(view.columns) if c.key or any(row[j] for row in view.rows)]
    natural = [_bounds(view.columns[j], [row[j] for row in view.rows])[1] for j in columns]
    if sum(natural) + GAP * (len(natural) - 1) <= width:
        return _table(view, columns, list(range(len(view.rows))), None, view.title, view.caption or None)
    for whole_intervals in (True, False):
        laid = _fit(view, columns, width, whole_intervals)
        if laid is not None:
            return laid
    return records(view, columns, width)


def _fit(view: TableView, columns: list[int], width: int, whole_intervals: bool) -> RenderableType | None:
    """The table with its columns narrowed to fit, or grouped by its widest name column; None if neither fits."""
    rows = list(range(len(view.rows)))
    caption = view.caption or None

    def bounds(cols: list[int]) -> list[tuple[int, int]]:
        return [_bounds(view.columns[j], [view.rows[i][j] for i in rows], whole_intervals) for j in cols]

    flat = bounds(columns)
    widths = fit_widths(flat, width)
    if widths is not None:
        return _table(view, columns, rows, widths, view.title, caption, whole_intervals)
    keys = [k for k, j in enumerate(columns) if view.columns[j].key and k > 0]
    if not keys or not view.rows:
        return None
    by = columns[max(keys, key=lambda k: flat[k][1])]  # group by the widest name column (not the first)
    rest = [j for j in columns if j != by]
    grouped = fit_widths(bounds(rest), width)
    if grouped is None:
        return None
    groups: dict[str, list[int]] = {}
    for i in rows:
        groups.setdefault(view.rows[i][by], []).append(i)
    parts: list[RenderableType] = [Text(view.title, style="bold")]
    for k, (value, members) in enumerate(groups.items()):  # the heading spans the console, not the table
        parts += [Text(f"{view.columns[by].header} {value}", style="bold"),
                  _table(view, rest, members, grouped, None, None, whole_intervals, show_header=k == 0)]
    if caption:
        parts.append(Text(caption))
    return Group(*parts)


def records(view: TableView, columns: list[int], width: int) -> Table:
    """Each row as a record: one line per column (header, then the value, wrapped or folded to fit)."""
    label = max(cell_len(view.columns[j].header) for j in columns)
    t = Table(title=_text(view.title, _TITLE), caption=_text(view.caption or None, _CAPTION), box=box.SIMPLE,
              show_header=False, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False, title_justify="left", caption_justify="left",
              title_style="bold")
    t.add_column(style="bold", no_wrap=True, width=label)
    t.add_column(overflow="fold", width=max(1, width - label - GAP))
    for i, cells in enumerate(view.rows):
        style = _STYLE.get(view.states[i] if i < len(view.states) else "", "")
        for k, j in enumerate(columns):
            t.add_row(escape(view.columns[j].header), escape(cells[j]), style=style,
                      end_section=k == len(columns) - 1)
    return t


