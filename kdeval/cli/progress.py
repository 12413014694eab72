"""Progress of a running ``submit`` / ``resume``: samples done / total with ETAs, per run and per running cell.

In a terminal: a rich progress display, one bar for the run and one per cell this driver is running. In a
log (stderr not a terminal): a plain line when the run starts, then at least every :data:`PLAIN_EVERY_S`
seconds and whenever another :data:`PLAIN_STEP` of the samples is done, and at the end.
Both say when cells are held by another driver and this run waits for them.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kdeval.jobs.run.progress import RunProgress

#: A plain progress line at least this often (seconds) ...
PLAIN_EVERY_S = 30.0
#: ... or whenever another tenth of the samples is done.
PLAIN_STEP = 0.10


def format_eta(seconds: float | None) -> str:
    """``1:02:03`` / ``4:05`` / ``?`` (unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def waiting_line(p: RunProgress, describe: Callable[[str], str]) -> str | None:
    """``waiting for 3 cell(s) held by run R (pid P on H)`` (None when nothing is waited for)."""
    if not p.waiting:
        return None
    return "waiting for " + "; ".join(f"{n} cell(s) held by {describe(rid)}" for rid, n in sorted(p.waiting.items()))


def progress_line(run_id: str, p: RunProgress, now: float | None = None) -> str:
    """One plain line: ``run R: samples 120/1000 (12%), cells 3/40 done, 1 failed, 2 running, ETA 5:10``."""
    pct = 100 * p.samples_finished // p.samples_total if p.samples_total else 100  # floored: 100% only when all are
    return (f"run {run_id}: samples {p.samples_finished}/{p.samples_total} ({pct}%), cells {p.done}/{p.total} done, "
            f"{p.failed} failed, {p.running} running, ETA {format_eta(p.eta_s(now))}")


class PlainProgress:
    """Plain lines for logs (see the module docstring)."""

    def __init__(self, console: Console, run_id: str, describe: Callable[[str], str],
                 every_s: float = PLAIN_EVERY_S, step: float = PLAIN_STEP,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.run_id, self.describe = console, run_id, describe
        self.every_s, self.step, self.clock = every_s, step, clock
        self.last_t: float | None = None
        self.last_step = -1
        self.last_done = -1
        self.last_waiting: dict[str, int] = {}

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def _print(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def update(self, p: RunProgress) -> None:
        now = self.clock()
        step = int(p.samples_finished / p.samples_total / self.step) if p.samples_total else 0
        if self.last_t is None or step > self.last_step or now - self.last_t >= self.every_s:
            self._print(progress_line(self.run_id, p, now))
            self.last_t, self.last_step, self.last_done = now, step, p.samples_finished
        if p.waiting and p.waiting != self.last_waiting:
            self._print(waiting_line(p, self.describe))
        self.last_waiting = dict(p.waiting)

    def close(self, p: RunProgress | None) -> None:
        if p is not None and p.samples_finished != self.last_done:
            self._print(progress_line(self.run_id, p, self.clock()))


class RichProgress:
    """Bars in a terminal: the run's samples, then one bar per running cell (added and removed as cells
    start and finish), each with its ETA."""

    def __init__(self, console: Console, run_id: str, describe: Callable[[str], str]) -> None:
        columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} samples"),
                   TextColumn("{task.fields[info]}"), TextColumn("ETA {task.fields[eta]}"), TimeElapsedColumn())
        self.bar = Progress(*columns, console=console, transient=False)
        self.run_id, self.describe = run_id, describe
        self.run_task = self.bar.add_task(f"[bold]{run_id}", total=None, info="", eta="?")
        self.cells: dict[str, TaskID] = {}
        self.last_waiting: dict[str, int] = {}

    def __enter__(self) -> "RichProgress":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, p: RunProgress) -> None:
        now = time.monotonic()
        info = f"cells {p.done}/{p.total} done, {p.failed} failed, {p.running} running"
        self.bar.update(self.run_task, total=p.samples_total, completed=p.samples_finished, info=info,
                        eta=format_eta(p.eta_s(now)))
        for cid in [c for c in self.cells if c not in p.cells]:
            self.bar.remove_task(self.cells.pop(cid))
        for cid, c in p.cells.items():
            if cid not in self.cells:
                self.cells[cid] = self.bar.add_task(f"  {escape(c.label)}", total=c.samples_total, info="", eta="?")
            self.bar.update(self.cells[cid], completed=c.samples_finished, info=f"{c.shards_running} shard(s) running",
                            eta=format_eta(p.cell_eta_s(cid, now)))
        if p.waiting and p.waiting != self.last_waiting:
            self.bar.console.print(waiting_line(p, self.describe), markup=False, highlight=False)
        self.last_waiting = dict(p.waiting)

    def close(self, p: RunProgress | None) -> None:
        for tid in self.cells.values():
            self.bar.remove_task(tid)
        self.cells.clear()
