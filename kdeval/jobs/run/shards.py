"""Sample shards: how a cell's samples are split into units of work, and what a held cell has done so far.

Shard ``i`` of a cell with shard size ``S`` is its samples ``[i*S, min((i+1)*S, samples))`` (the samples are
the task's first ``samples``, in the task's order). A cell's plan is fixed when a driver first takes it: a
later driver (resume, another run) keeps the recorded done shards whose parts are in its results directory
and check out, with their shard size; it recomputes the others. Shard size is not part of a cell's identity:
rows do not depend on it (see ``kdeval.cluster.execute`` for the shared-context groups a boundary splits).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from kdeval.cluster.workload import CellTask
from kdeval.jobs.grid.cells import CellSpec
from kdeval.storage import ShardView, verify_cell_file

#: Longest worker/node text stored for a cell computed by several workers (the index's column size).
_NAMES_MAX = 200


def shard_ranges(samples: int, size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the shards of ``samples`` samples in shards of ``size`` (one empty shard
    for a cell of no samples)."""
    if size < 1:
        raise ValueError(f"shard_size: expected a number of samples >= 1, got {size}")
    return [(a, min(a + size, samples)) for a in range(0, samples, size)] or [(0, 0)]


@dataclass(frozen=True)
class Shard:
    """One unit of work: shard ``index`` of ``cell``, its samples ``[start, stop)``."""

    cell: CellSpec
    index: int
    start: int
    stop: int

    @property
    def model_key(self) -> str:
        return self.cell.model_key

    @property
    def samples(self) -> int:
        return self.stop - self.start

    def to_task(self) -> CellTask:
        """What the worker runs."""
        return dataclasses.replace(self.cell.to_task(), shard=self.index, sample_start=self.start,
                                   sample_stop=self.stop)


@dataclass(frozen=True)
class ShardDone:
    """What the driver keeps of a stored shard until its cell is complete."""

    samples: int
    n_rows: int
    duration_s: float | None
    peak_memory_bytes: int | None
    worker: str | None
    node: str | None
    provenance: dict[str, Any] | None

    @classmethod
    def of(cls, view: ShardView) -> "ShardDone":
        return cls(samples=view.stop - view.start, n_rows=view.n_rows, duration_s=view.duration_s,
                   peak_memory_bytes=view.peak_memory_bytes, worker=view.worker, node=view.node,
                   provenance=view.provenance)


@dataclass
class HeldCell:
    """A cell this driver holds: its shard plan, the shards stored so far and those in flight."""

    cell: CellSpec
    shard_size: int
    ranges: list[tuple[int, int]]
    done: dict[int, ShardDone] = field(default_factory=dict)
    in_flight: int = 0
    failed: bool = False  # failed, or taken over by another driver: nothing more of it runs here

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.ranges)

    def missing(self) -> list[Shard]:
        """The shards not stored yet, in order."""
        return [Shard(self.cell, i, a, b) for i, (a, b) in enumerate(self.ranges) if i not in self.done]

    def n_rows(self) -> int:
        return sum(d.n_rows for d in self.done.values())

    def duration_s(self) -> float:
        """Worker seconds over all shards (the cell's cost, whatever ran in parallel)."""
        return sum(d.duration_s or 0.0 for d in self.done.values())

    def peak_memory_bytes(self) -> int | None:
        peaks = [d.peak_memory_bytes for d in self.done.values() if d.peak_memory_bytes is not None]
        return max(peaks) if peaks else None

    def where(self) -> tuple[str | None, str | None]:
        """(worker, node) that computed the cell: one name, or the distinct names joined by ``,``."""
        ordered = [self.done[i] for i in sorted(self.done)]
        return (_names(d.worker for d in ordered), _names(d.node for d in ordered))

    def provenance(self) -> dict[str, Any] | None:
        """The shards' provenance: each key's value when they agree, else their distinct values joined by
        ``; `` (e.g. two hosts), so reports show a cell computed on mixed devices."""
        return merge_provenance([self.done[i].provenance for i in sorted(self.done)])


def plan_cell(cell: CellSpec, existing: list[ShardView], shard_size: int, results_dir: str) -> HeldCell:
    """The plan of a cell taken by a driver writing to ``results_dir``: the recorded done shards it keeps
    (same directory, range of a single recorded shard size, part checks out) with their size, else a fresh
    plan of ``shard_size``."""
    sizes = {s.shard_size for s in existing}
    if len(sizes) == 1:
        size = sizes.pop()
        ranges = shard_ranges(cell.task.samples, size)
        keep = {s.shard: ShardDone.of(s) for s in existing
                if s.shard < len(ranges) and ranges[s.shard] == (s.start, s.stop) and s.results_dir == results_dir
                and verify_cell_file(s.results_dir, s.result_path, cell.id, s.n_rows) is None}
        if keep:
            return HeldCell(cell, size, ranges, done=keep)
    return HeldCell(cell, shard_size, shard_ranges(cell.task.samples, shard_size))


def _names(values) -> str | None:
    distinct = list(dict.fromkeys(v for v in values if v))
    if not distinct:
        return None
    text = ",".join(distinct)
    return text if len(text) <= _NAMES_MAX else text[:_NAMES_MAX - 3] + "..."


def merge_provenance(items: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One provenance for several shards: a key's value when all agree, else its distinct values joined."""
    items = [p for p in items if p]
    if not items:
        return None
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for p in items for k in p):
        distinct = list(dict.fromkeys(json.dumps(p.get(key), sort_keys=True, default=str) for p in items))
        out[key] = items[0].get(key) if len(distinct) == 1 else "; ".join(
            str(json.loads(v)) for v in distinct)
    return out
