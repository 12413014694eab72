"""How far a running group has got: the driver asks each worker running a group how many samples each cell of
it has finished (:meth:`kdeval.cluster.worker.CellWorker.samples_done_in_group`), at most every ``every_s``,
never waiting for the answer; the answers are the in-flight counts of :class:`RunProgress` (a group's rows are
stored only when it returns, so a group of 40 cells would otherwise show 0% until it ends)."""
from __future__ import annotations

import math
from typing import Any

from kdeval.jobs.run.progress import RunProgress


class GroupProbes:
    def __init__(self, every_s: float = 2.0) -> None:
        self.every_s = every_s
        self.asked: dict[Any, Any] = {}  # probe ref -> the group call's ref
        self.last: dict[Any, float] = {}  # group call's ref -> when its worker was last asked
        self.finished: dict[Any, list[int]] = {}  # group call's ref -> samples each of its cells has finished

    def poll(self, flights: dict[Any, list], progress: RunProgress, now: float) -> None:
        """Take the answers that came, ask again where due, and set ``progress``'s in-flight counts from the
        group calls still in ``flights`` (call ref -> its :class:`~kdeval.jobs.run.outcomes.Flight` list)."""
        import ray

        if self.asked:
            ready, _ = ray.wait(list(self.asked), num_returns=len(self.asked), timeout=0)
            for probe in ready:
                call = self.asked.pop(probe)
                try:
                    self.finished[call] = [int(n) for n in ray.get(probe, timeout=0)]
                except Exception:  # noqa: BLE001 - a lost worker: its group's own outcome says so
                    pass
        waiting = set(self.asked.values())
        for call, group in flights.items():
            if len(group) > 1 and call not in waiting and now - self.last.get(call, -math.inf) >= self.every_s:
                self.asked[group[0].slot.actor.samples_done_in_group.remote()] = call
                self.last[call] = now
        for kept in (self.finished, self.last):
            for call in [c for c in kept if c not in flights]:
                del kept[call]
        for cell in progress.cells.values():
            cell.samples_in_flight = 0
        progress.samples_in_flight = 0
        for call, counts in self.finished.items():
            for f, n in zip(flights[call], counts):  # a group's flights are in its tasks' order
                k = min(n, f.shard.samples)
                if f.shard.cell.id in progress.cells:
                    progress.cells[f.shard.cell.id].samples_in_flight += k
                progress.samples_in_flight += k
