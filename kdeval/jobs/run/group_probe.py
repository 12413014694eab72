"""What a running group has done so far: the driver asks each worker running a group
(:meth:`kdeval.cluster.worker.CellWorker.group_news`), at most every ``every_s``, never waiting for the answer,
how many samples each (cell, shard) of it has finished and the outcomes of those finished since last asked. The
counts are the in-flight figures of :class:`RunProgress`; the outcomes are what :meth:`GroupProbes.poll` returns,
for the scheduler to store while the group goes on (so a group killed midway loses only what it had in flight,
and ``status`` shows its cells finishing one by one)."""
from __future__ import annotations

import math
from typing import Any

from kdeval.jobs.run.progress import RunProgress


class GroupProbes:
    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.asked: dict[Any, Any] = {}  # probe ref -> the group call's ref
        self.last: dict[Any, float] = {}  # group call's ref -> when its worker was last asked
        self.finished: dict[Any, list[int]] = {}  # group call's ref -> samples each of its shards has finished

    def poll(self, flights: dict[Any, list], now: float) -> list[tuple[Any, int, Any]]:
        """Take the answers that came and ask again where due, for the group calls in ``flights`` (call ref ->
        its :class:`~kdeval.jobs.run.outcomes.Flight` list). Returns the outcomes that came, ``(call ref, task
        index, CellOutcome)``, of calls still in ``flights``."""
        import ray

        news: list[tuple[Any, int, Any]] = []
        if self.asked:
            ready, _ = ray.wait(list(self.asked), num_returns=len(self.asked), timeout=0)
            for probe in ready:
                call = self.asked.pop(probe)
                try:
                    counts, outcomes = ray.get(probe, timeout=0)
                except Exception:  # noqa: BLE001 - a lost worker: its group's own outcome says so
                    continue
                self.finished[call] = [int(n) for n in counts]
                if call in flights:
                    news.extend((call, k, out) for k, out in sorted(outcomes.items()))
        waiting = set(self.asked.values())
        for call, group in flights.items():
            if len(group) > 1 and call not in waiting and now - self.last.get(call, -math.inf) >= self.every_s:
                self.asked[group[0].slot.actor.group_news.remote()] = call
                self.last[call] = now
        for kept in (self.finished, self.last):
            for call in [c for c in kept if c not in flights]:
                del kept[call]
        return news

    def count(self, flights: dict[Any, list], progress: RunProgress) -> None:
        """Set ``progress``'s in-flight counts: the samples the running groups' unsettled shards finished."""
        for cell in progress.cells.values():
            cell.samples_in_flight = 0
        progress.samples_in_flight = 0
        for call, counts in self.finished.items():
            for f, n in zip(flights[call], counts):  # a group's flights are in its tasks' order
                if f.settled:
                    continue
                k = min(n, f.shard.samples)
                if f.shard.cell.id in progress.cells:
                    progress.cells[f.shard.cell.id].samples_in_flight += k
                progress.samples_in_flight += k
