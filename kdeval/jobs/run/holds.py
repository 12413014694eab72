"""One driver per cell, from one driver's side: taking cells, and the cells other live drivers hold.

A driver takes a cell through the index's lease (``RunIndex.claim_cell``). When another run holds it, that
run's driver is looked up (:func:`kdeval.jobs.run.drivers.driver_alive`, at most once per heartbeat): a dead one's
hold is taken over (its running attempts at the cell become lost), a live one's is respected: the cell is set
aside, and either waited for (checked at every heartbeat until that driver stored it, gave it back, or died)
or left to it.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable

from kdeval.jobs.grid.cells import CellSpec
from kdeval.jobs.run.drivers import describe_driver, driver_alive
from kdeval.storage import CellView, RunIndex

log = logging.getLogger(__name__)


class Holds:
    """Cells of run ``run_id`` that other live drivers hold (waited for, or left when ``wait`` is False)."""

    def __init__(self, index: RunIndex, run_id: str, *, wait: bool, recheck_s: float) -> None:
        self.index, self.run_id, self.wait, self.recheck_s = index, run_id, wait, recheck_s
        self.waiting: dict[str, tuple[CellSpec, str]] = {}  # cell id -> (cell, run holding it)
        self.not_waited: dict[str, str] = {}  # cell id -> run holding it
        self._alive_seen: dict[str, tuple[float, bool]] = {}

    def alive(self, run_id: str) -> bool:
        """Whether ``run_id``'s driver is alive (looked up at most once per ``recheck_s``)."""
        now = time.monotonic()
        seen = self._alive_seen.get(run_id)
        if seen is None or now - seen[0] > self.recheck_s:
            view = self.index.get_run(run_id)
            seen = (now, view is not None and driver_alive(view))
            self._alive_seen[run_id] = seen
        return seen[1]

    def claim(self, cell_id: str) -> str | None:
        """Take a cell: None when this run holds it, else the live run holding it (a dead one's hold is
        taken over)."""
        holder = self.index.claim_cell(cell_id, self.run_id)
        while holder is not None and not self.alive(holder):
            log.warning("cell %s was held by run %s, whose driver is gone: taking it over", cell_id, holder)
            dead, holder = holder, self.index.claim_cell(cell_id, self.run_id, takeover=[holder])
            if holder == dead:
                break
        return holder

    def set_aside(self, cell: CellSpec, holder: str) -> None:
        """A cell another live driver holds: wait for it, or leave it."""
        if self.wait:
            self.waiting[cell.id] = (cell, holder)
        else:
            self.not_waited[cell.id] = holder

    def counts(self) -> dict[str, int]:
        """Cells waited for, per run holding them."""
        return dict(Counter(holder for _, holder in self.waiting.values()))

    def recheck(self, done_elsewhere: Callable[[CellSpec, CellView], bool]) -> list[CellSpec]:
        """Look at the cells waited for again: those ``done_elsewhere`` (stored by their driver, files checked;
        it counts them) are dropped, those nobody holds any more or whose holder died are returned, to be
        taken."""
        if not self.waiting:
            return []
        views = self.index.get_cells(list(self.waiting))
        free = []
        for cid, (cell, holder) in list(self.waiting.items()):
            view = views.get(cid)
            if view is None:
                continue
            if view.held_by is None and done_elsewhere(cell, view):
                del self.waiting[cid]
            elif view.held_by is None or view.held_by == self.run_id or not self.alive(view.held_by):
                del self.waiting[cid]
                free.append(cell)
            elif view.held_by != holder:
                self.waiting[cid] = (cell, view.held_by)
        return free

    def message(self) -> str | None:
        """Which runs hold the cells left to them (None when none was left)."""
        if not self.not_waited:
            return None
        parts = []
        for rid, n in Counter(self.not_waited.values()).items():
            view = self.index.get_run(rid)
            parts.append(f"{n} cell(s) held by {describe_driver(view) if view else 'run ' + rid}")
        return "not waited for: " + "; ".join(parts) + "; resume this run when they are done (they are reused)"
