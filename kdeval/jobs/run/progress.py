"""What a running scheduler reports after every event: cells and samples done, per running cell, and ETAs.

Samples count as done when the shard holding them is stored; the samples a running group's cells have all
finished count as in flight (:mod:`kdeval.jobs.run.group_probe`) until the group returns, and the figures shown
(``finished``) add them. ETAs come
from the rate at which this driver's workers computed samples since its first shard started (samples of
cells found done elsewhere, or of shards reused from an earlier driver, are done but not computed here).
A running cell's ETA gives it its share of that rate: the fraction of the shards in flight that are its own.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class CellProgress:
    """One cell this driver holds and has not finished."""

    label: str  # short description: id prefix, policy, N/B, task
    samples_total: int
    samples_done: int = 0
    shards_running: int = 0
    samples_in_flight: int = 0  # finished in a running group, not stored yet

    @property
    def samples_finished(self) -> int:
        return min(self.samples_done + self.samples_in_flight, self.samples_total)

    @property
    def samples_left(self) -> int:
        return max(self.samples_total - self.samples_finished, 0)


@dataclass
class RunProgress:
    """Counters passed to the progress callback after every event."""

    total: int  # cells of this session
    done: int = 0
    failed: int = 0
    running: int = 0  # cells with a shard in flight (set before each callback)
    workers_lost: int = 0
    samples_total: int = 0  # samples of this session's cells
    samples_done: int = 0  # of which done (computed here, reused, or done by another run)
    samples_computed: int = 0  # of which computed by this driver's workers (the rate behind the ETAs)
    samples_in_flight: int = 0  # not done: finished by the cells of running groups, stored when a group returns
    computing_since: float | None = None  # time.monotonic() when this driver's first shard started
    cells: dict[str, CellProgress] = field(default_factory=dict)  # cell id -> progress, cells held here
    waiting: dict[str, int] = field(default_factory=dict)  # run id -> cells it holds that this run waits for

    @property
    def samples_finished(self) -> int:
        """Samples done, and those finished in running groups: what progress lines show."""
        return min(self.samples_done + self.samples_in_flight, self.samples_total)

    def rate(self, now: float | None = None) -> float | None:
        """Samples per second computed by this driver's workers (None before the first is finished)."""
        computed = self.samples_computed + self.samples_in_flight
        if not computed or self.computing_since is None:
            return None
        elapsed = (time.monotonic() if now is None else now) - self.computing_since
        return computed / elapsed if elapsed > 0 else None

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds until every sample is done at the current rate (0 when none is left; None: no rate yet)."""
        left = max(self.samples_total - self.samples_finished, 0)
        if not left:
            return 0.0
        rate = self.rate(now)
        return left / rate if rate else None

    def cell_eta_s(self, cell_id: str, now: float | None = None) -> float | None:
        """Seconds until a running cell is done, at its share of the rate (None: no rate yet, or no shard of
        it in flight)."""
        cell = self.cells[cell_id]
        if not cell.samples_left:
            return 0.0
        rate = self.rate(now)
        in_flight = sum(c.shards_running for c in self.cells.values())
        if not rate or not cell.shards_running or not in_flight:
            return None
        return cell.samples_left / (rate * cell.shards_running / in_flight)
