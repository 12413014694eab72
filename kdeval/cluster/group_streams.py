"""A group's results as they come: which (cell, shard) of a group (``Workload.run_group``) the rows a member
finishes belong to, and each (cell, shard) handed over as soon as its rows are all in, so that a worker or driver
killed mid-group loses only what was in flight (the driver stores what was handed over while the group goes on).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from kdeval.cluster.workload import CellResult, CellTask, task_range


def shard_result(rows: list[dict[str, Any]], seconds: float | None = None) -> CellResult:
    """A shard's rows only (the driver aggregates the whole cell once every shard is in:
    ``EvalWorkload.aggregate``), with their largest peak memory."""
    peaks = [int(r["peak_memory_bytes"]) for r in rows if r.get("peak_memory_bytes") is not None]
    return CellResult(rows=rows, summary={}, peak_memory_bytes=max(peaks) if peaks else None, seconds=seconds)


class GroupStreams:
    """The tasks of one group (every cell of ``cells`` on the same consecutive shards; ``sample_ids``: the ids of
    the group's samples, in order, the first at sample index ``start``): :meth:`add` takes the rows a member has
    just finished (``group_run.run_group``'s ``on_rows``), counts them to their tasks (``on_samples(k, n)``)
    and hands each task whose samples are all in to ``on_result(k, result)``, once, rows in sample order."""

    def __init__(self, tasks: Sequence[CellTask], cells: Sequence[str], sample_ids: Sequence[str], start: int,
                 on_samples: Callable[[int, int], None] | None = None,
                 on_result: Callable[[int, CellResult], None] | None = None) -> None:
        self.tasks, self.on_samples, self.on_result = list(tasks), on_samples, on_result
        self.at = {sid: start + j for j, sid in enumerate(sample_ids)}  # sample id -> its index in the cell
        self.task_of: dict[tuple[str, int], int] = {}  # (cell id, sample index) -> task
        self.expected = [0] * len(self.tasks)
        for k, t in enumerate(self.tasks):
            a, b = task_range(t)
            for j in range(a, b):
                if j - start < len(sample_ids):
                    self.task_of[(t.cell_id, j)] = k
                    self.expected[k] += 1
        self.cells = list(cells)
        self.rows: list[list[dict[str, Any]]] = [[] for _ in self.tasks]
        #: per task, the samples whose rows are in (a conversation's sample has a row per turn, all handed at once)
        self.samples: list[set[str]] = [set() for _ in self.tasks]
        self.seconds = [0.0] * len(self.tasks)
        self.handed: dict[int, CellResult] = {}

    def add(self, member: int, rows: list[dict[str, Any]], seconds: float) -> None:
        """Member ``member`` (an index into ``cells``) finished ``rows`` in ``seconds`` of its own work."""
        cell = self.cells[member]
        counts: dict[int, int] = {}
        new: dict[int, int] = {}
        for row in rows:
            k = self.task_of[(cell, self.at[row["id"]])]
            self.rows[k].append(row)
            counts[k] = counts.get(k, 0) + 1
            if row["id"] not in self.samples[k]:
                self.samples[k].add(row["id"])
                new[k] = new.get(k, 0) + 1
        for k, n in counts.items():
            self.seconds[k] += seconds * n / len(rows)
            if self.on_samples is not None and new.get(k):
                self.on_samples(k, new[k])
            if len(self.samples[k]) >= self.expected[k] and k not in self.handed:
                self.handed[k] = self._result(k)
                if self.on_result is not None:
                    self.on_result(k, self.handed[k])

    def _result(self, k: int) -> CellResult:
        return shard_result(sorted(self.rows[k], key=lambda r: self.at[r["id"]]), self.seconds[k])

    def results(self) -> list[CellResult]:
        """One result per task, in order (those handed over as they were)."""
        missing = [k for k in range(len(self.tasks)) if k not in self.handed and len(self.samples[k]) < self.expected[k]]
        if missing:
            t = self.tasks[missing[0]]
            raise RuntimeError(f"run_group: cell {t.cell_id} has rows of {len(self.samples[missing[0]])} of its "
                               f"{self.expected[missing[0]]} samples {task_range(t)}")
        return [self.handed.get(k) or self._result(k) for k in range(len(self.tasks))]
