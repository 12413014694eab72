"""What `kdeval status` and `kdeval ls` print: the runs table, one run's cell table, their JSON.

Names, tasks, errors and messages are printed with control, bidi and invisible characters as escapes
(:func:`kdeval.shown.shown`): an index written by an older kdeval may hold them.

A run that is not finished but has no driver left reads as such, never as ``pending`` or ``running`` for good:
``running (driver gone)`` when its driver stopped heartbeating, ``failed (driver gone)`` when the background
driver ``submit --detach`` started exited before it took the run; the caption says what the driver's log
said last and how to continue (:mod:`kdeval.jobs.run.drivers`).
"""
from __future__ import annotations

import json

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.grid.cells import policy_label, protocol_parts, protocol_tag
from kdeval.jobs.run.drivers import driver_alive, driver_gone, last_log_line, launch_gone
from kdeval.jobs.run.groups import execution_label
from kdeval.shown import shown
from kdeval.storage import CellState, RunIndex, RunState, RunView, age_seconds, to_jsonable

#: the widest a status table's policy column insists on (a longer label without spaces folds)
LABEL_WIDTH = 18  # "[query-agnostic]", "[kivi-4b-g32-w128]" (the default store) stay whole
#: the most cells one run's table shows unless asked for all (``status --all``): every failed, running and
#: pending cell first, then the rest in grid order (a 20,000-cell run is not 20,000 lines, nor a minute)
MAX_ROWS = 200
#: which cells a table cut to :data:`MAX_ROWS` keeps first
_FIRST = {CellState.FAILED.value: 0, CellState.RUNNING.value: 1, CellState.PENDING.value: 2}
#: cell-table columns whose texts are short and never fold ("34906c10", "25%/whole", "done shared (2)", "6.0")
SHORT_COLUMNS = ("cell", "N", "N/B", "state", "s")


def shown_state(run: RunView) -> str:
    """A run's state as status and ls print it (``running (driver gone)``, ``failed (driver gone)``)."""
    if launch_gone(run):
        return "failed (driver gone)"
    if run.state == RunState.RUNNING.value and not driver_alive(run):
        return "running (driver gone)"
    return run.state


def driver_caption(run: RunView) -> str | None:
    """Why a run without a driver is stuck and what to do (None when it has one, or is finished)."""
    if not driver_gone(run):
        return None
    last = last_log_line(run)
    said = f"; its log's last line: {last}" if last else ""
    if launch_gone(run):
        return (f"the background driver (pid {run.driver_pid} on {run.driver_host}) exited before it ran the run"
                f"{said}; `kdeval resume {run.id}` runs it")
    return (f"driver pid {run.driver_pid} on {run.driver_host} not seen for "
            f"{age_seconds(run.heartbeat_at) or 0:.0f}s{said}: `kdeval resume {run.id}` continues the run")


def counts_line(counts: dict[str, int]) -> str:
    order = [s.value for s in CellState]
    return "  ".join(f"{k} {counts.get(k, 0)}" for k in order)


def runs_table(index: RunIndex, width: int = 120) -> Table:
    """Every run, newest first, in ``width`` columns: the run id (what a user types next), the counts and the time
    whole, the state folding only past its own width, the name taking what is left (it folds past that)."""
    t = Table(title="runs (created UTC)", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    cols = ("run", "name", "state", "done", "failed", "left", "created")
    rows = []
    for r in index.list_runs():
        c = r.counts
        left = c.get("pending", 0) + c.get("running", 0)
        rows.append([r.id, shown(r.name), shown_state(r), str(c.get("done", 0)), str(c.get("failed", 0)), str(left),
                     r.created_at.strftime("%m-%d %H:%M")])
    natural = [max([len(col)] + [len(row[i]) for row in rows]) for i, col in enumerate(cols)]
    # each column pads one space on its right, and one separator stands between columns
    room = width - len(cols) - (len(cols) - 1) - sum(n for i, n in enumerate(natural) if cols[i] != "name")
    for i, col in enumerate(cols):
        t.add_column(col, overflow="fold", no_wrap=col != "name",
                     width=max(len(col), min(natural[i], room)) if col == "name" else natural[i],
                     justify="right" if col in ("done", "failed", "left") else "left")
    for row in rows:
        t.add_row(*row)
    return t


def _headline_parts(summary: dict | None, most: int = 3) -> list[tuple[str, str]]:
    """The cell's first ``most`` headline numbers as (metric, value) (scalar metrics, not counts, latencies or
    nested tables): the task's own headline comes first (``score``, ``contains``)."""
    if not summary:
        return []
    skip = ("n", "grid", "shared_rows")
    return [(k, f"{v:.2f}" if isinstance(v, float) else f"{v}") for k, v in summary.items()
            if isinstance(v, (int, float)) and k not in skip and not k.startswith(("mean_", "max_"))
            and not k.endswith("_bytes")][:most]


def _headline(summary: dict | None, most: int = 3) -> str:
    """:func:`_headline_parts` as ``score=50.00 contains=100.00``."""
    return " ".join(f"{k}={v}" for k, v in _headline_parts(summary, most))


def _metric_line(named: dict[str, set[str]], one_task: bool) -> Text | None:
    """What a narrow table's score column holds, said once under it (``score: contains``, or per task
    ``scores: score (needle), contains (ruler.niah_single_1)``), its rows then holding the values alone."""
    metrics = sorted({m for ms in named.values() for m in ms})
    if not metrics:
        return None
    if len(metrics) == 1 or one_task:
        return Text(f"score: {', '.join(metrics)}")
    per_task = [f"{'/'.join(sorted(ms))} ({task})" for task, ms in sorted(named.items())]
    return Text("scores: " + ", ".join(per_task))


def _common_suffix(tasks: list[str]) -> tuple[str, str]:
    """What every task label of a run ends with (``needle@1024#s0``, ``ruler.vt@1024#s0``): the length and the
    seed, each "" where the labels differ in it, so that the line under the table says them once."""
    seeds = {t[t.rfind("#s"):] if "#s" in t else "" for t in tasks}
    seed = seeds.pop() if len(seeds) == 1 else ""
    lengths = {t.removesuffix(seed)[t.rfind("@"):] if "@" in t else "" for t in tasks}
    length = lengths.pop() if len(lengths) == 1 else ""
    return length, seed


def _fit(cols: list[str], rows: list[list[str]], metrics: list[str], room: int) -> list[int] | None:
    """Each column's text width so that the table's texts take at most ``room`` characters a line, chosen here
    because rich's own collapse shrinks a column below its minimum and then crops the table's right edge. Short
    columns keep their texts whole on one line, the score column its every metric (``rouge_l_recall=52.50``), a
    policy its words up to :data:`LABEL_WIDTH` (the task, model and policy fold inside a word where the room is
    short); what is left goes to the task, the score, then the policy column, up to what their texts need. None
    when even that does not fit (rich then folds as it can)."""
    def words(i: int, texts: list[str]) -> int:
        return max([len(w) for w in cols[i].split()] + [len(w) for x in texts for w in x.split()])

    natural = [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(cols)]
    least = []
    for i, col in enumerate(cols):
        if col in SHORT_COLUMNS:
            least.append(natural[i])
        elif col.startswith("score"):
            least.append(words(i, metrics))
        else:  # policy, task, model: a word folds past LABEL_WIDTH
            least.append(min(words(i, [r[i] for r in rows]), LABEL_WIDTH))
    widths = list(least)
    spare = room - sum(widths)
    for col in ("task", "model", "policy"):  # too narrow: these fold inside a word first, down to 8
        if spare < 0 and col in cols:
            i = cols.index(col)
            give = min(-spare, max(widths[i] - 8, 0))
            widths[i] -= give
            spare += give
    if spare < 0:
        return None
    for col in ("task", "score / error", "score", "policy", "model"):
        if col in cols:
            i = cols.index(col)
            grow = min(spare, natural[i] - widths[i])
            widths[i] += grow
            spare -= grow
    return widths


def _common_protocol(cells: list) -> str:
    """The protocol words (:func:`protocol_parts`) of every cell that has some, when they all share them and the
    cells without any hold no budget (``full``, whose rows no protocol changes): then the line under the table says
    them once instead of every row's tag; else ""."""
    said = {", ".join(protocol_parts(c.spec)) for c in cells}
    budgeted = {", ".join(protocol_parts(c.spec)) for c in cells if c.grid_budget is not None}
    return budgeted.pop() if len(budgeted) == 1 and said <= budgeted | {""} else ""


def _cut(cells: list, limit: int | None) -> list:
    """At most ``limit`` of ``cells`` (None: all): failed, running and pending ones first, in grid order."""
    if limit is None or len(cells) <= limit:
        return cells
    order = sorted(range(len(cells)), key=lambda i: (_FIRST.get(cells[i].state, 3), i))[:limit]
    return [cells[i] for i in sorted(order)]


def status_table(index: RunIndex, run_id: str, width: int = 120, limit: int | None = MAX_ROWS) -> Group:
    """One run: a heading with per-state counts, one row per cell (worker@node when ``width`` allows, time,
    score or error) for at most ``limit`` cells (:data:`MAX_ROWS`; None: every cell), the driver's message.
    Columns fold instead of cutting what a user types next (ids, policies, tasks) or must read (errors)."""
    run = index.get_run(run_id)
    every = index.run_cells(run.id)
    cells = _cut(every, limit)
    caption = driver_caption(run) or run.message
    models = sorted({c.model for c in cells})
    one_model = len(models) == 1
    head = shown(f"run {run.id} ({run.name}{', ' + models[0] if one_model else ''}): {shown_state(run)}")
    counts = counts_line(run.counts)
    # too wide for one line: the counts go on their own line rather than wrap in the middle of the list
    title = f"{head} — {counts}" if len(head) + 3 + len(counts) <= width else f"{head}\n{counts}"
    tasks = sorted({c.task for c in cells})
    one_task = len(tasks) == 1  # then the task, or else the length and seed all share, is said under the table
    length, seed = _common_suffix(tasks)
    shared = ", ".join(([tasks[0].removesuffix(seed).removesuffix(length)] if one_task else [])
                       + ([f"{length[1:]} tokens"] if length else []) + ([f"seed {seed[2:]}"] if seed else []))
    wide = width >= 110
    chunks = {chunk_text(c.chunk_size) for c in cells}
    one_chunk = not wide and len(chunks) == 1  # narrow: one chunk size said under the table, N in the rows
    cols = ["cell"] + ([] if one_model else ["model"]) + ["policy", "N" if one_chunk else "N/B"] + (
        [] if one_task else ["task"]) + [
        "state"] + (["worker@node"] if wide else []) + ["s", "score / error" if any(
            c.state == CellState.FAILED.value for c in cells) else "score"]
    # the label reports and progress print: two settings of one policy must not read the same
    common = _common_protocol(cells)
    labels = {c.id: policy_label(c.policy, (c.spec or {}).get("policy_params") or {})
              + ("" if common else protocol_tag(c.spec)) for c in cells}
    rows, metrics = [], []
    named: dict[str, set[str]] = {}  # narrow: each task's headline metric, said once under the table
    for c in cells:
        # narrow: the task's headline value only, its metric named under the table (all in `--json` or wide)
        if c.state == CellState.FAILED.value:
            detail = c.error_line
        elif wide:
            detail = _headline(c.summary, 3)
        else:
            parts = _headline_parts(c.summary, 1)
            detail = parts[0][1] if parts else ""
            if parts:
                task = shown(c.task.removesuffix(seed).removesuffix(length))
                named.setdefault(task, set()).add(parts[0][0])
        if c.state != CellState.FAILED.value:
            metrics.append(detail)
        where = f"{c.worker or ''}@{(c.node or '')[:6]}" if c.worker else ""
        state = c.state if c.n_attempts <= 1 else f"{c.state} ({c.n_attempts})"
        state = " ".join(filter(None, [state, execution_label(c.summary, c.n_rows)]))  # "done shared": in a group
        nb = ("-" if c.grid_budget is None else str(c.grid_budget)) + (
            "" if one_chunk else f"/{chunk_text(c.chunk_size)}")
        rows.append([c.id[:8]] + ([] if one_model else [c.model]) + [labels[c.id], nb] + (
            [] if one_task else [c.task.removesuffix(seed).removesuffix(length)]) + [state] + (
            [where] if wide else []) + [f"{c.duration_s:.1f}" if c.duration_s is not None else "", detail or ""])
        rows[-1] = [shown(x) for x in rows[-1]]  # names, tasks and errors: terminal escapes shown, not obeyed
    # each column pads one space on its right, and one separator stands between columns
    room = width - len(cols) - (len(cols) - 1)
    widths = _fit(cols, rows, metrics, room)
    errors = []  # an error longer than its column is said whole under the table, not folded a word a line
    for c, row in zip(cells, rows):
        if c.state == CellState.FAILED.value and len(row[-1]) > (widths[-1] if widths else 0):
            errors.append(Text(f"cell {row[0]}: {row[-1]}"))
            row[-1] = "error below"
    if errors:  # the column no longer holds those errors: fit it to what it does hold
        widths = _fit(cols, rows, metrics, room)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    for i, col in enumerate(cols):
        t.add_column(col, overflow="fold", justify="right" if col in ("s", "score") else "left",
                     no_wrap=col in SHORT_COLUMNS,
                     width=widths[i] if widths else None)
    for row in rows:
        t.add_row(*row)
    said = [Text(f"{'task' if one_task else 'every task'}: {shared}")] if shared else []
    said += [line for line in [_metric_line(named, one_task)] if line is not None]
    if one_chunk:
        chunk = chunks.pop()
        said.append(Text("every cell: whole (one chunk)" if chunk == "whole" else
                         f"every cell: chunks of B={chunk}"))
    if common:
        budgetless = any(not protocol_parts(c.spec) for c in cells)
        said.append(Text(f"{'every cell with a budget' if budgetless else 'every cell'}: {common}"))
    if len(cells) < len(every):
        said.append(Text(f"{len(cells)} of {len(every)} cells shown (failed, running and pending ones "
                         f"first); `kdeval status {run.id} --all` lists every one, `--json` as JSON"))
    parts = [Text(title, style="bold"), t] + said + errors + ([Text(shown(caption))] if caption else [])
    return Group(*parts)


def status_json(index: RunIndex, run_id: str | None) -> str:
    if run_id is None:
        return json.dumps({"runs": [dict(to_jsonable(r, drop=("grid_yaml",)), shown_state=shown_state(r))
                                    for r in index.list_runs()]}, indent=2)
    run = index.get_run(run_id)
    cells = [dict(to_jsonable(c, drop=("spec",)), error_line=c.error_line) for c in index.run_cells(run.id)]
    run_json = dict(to_jsonable(run, drop=("grid_yaml",)), driver_alive=driver_alive(run),
                    driver_gone=driver_gone(run), shown_state=shown_state(run), driver_note=driver_caption(run),
                    heartbeat_age_s=age_seconds(run.heartbeat_at))
    return json.dumps({"run": run_json, "cells": cells}, indent=2)
