"""What a shard's attempt gave, recorded: a stored part, a retry, a failed cell, a completed cell.

:class:`ShardOutcomes` holds the scheduler's methods for it (:class:`kdeval.jobs.run.scheduler.Scheduler` is one):
it uses the scheduler's ``index``, ``run_id``, ``results_dir``, ``workload``, ``cfg``, ``queue``, ``held``,
``alone``, ``progress``, ``session_attempts`` and ``_requeue``. A group's shards (one call for several cells,
:mod:`kdeval.jobs.run.groups`) each have their own outcome; a group lost, timed out or failed as a whole has its
shards run alone next.

A shard's rows get the cell's identity columns and are written as its part (temp + rename) *before* the shard
is recorded, and only while this run holds the cell. When every shard of a cell is stored, the parts are read
back and checked, the workload's ``aggregate`` of all the rows becomes the cell's summary, and the cell is
marked done (its worker time is the sum over shards, its peak memory the largest). A results directory that
cannot be written (read-only, permission denied) stops the run with :class:`ResultsDirError`: no attempt could
pass; a full disk is retried within the cap.
"""
from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kdeval.cluster.workload import CellOutcome
from kdeval.jobs.grid.identity import self_describing
from kdeval.jobs.run.recovery import part_metadata
from kdeval.jobs.run.shards import HeldCell, Shard, ShardDone
from kdeval.storage import (
    AttemptState, cell_dir_relpath, read_cell_table, remove_single_file, verify_cell_file, write_part,
)


#: Why writing into the results directory failed, when no attempt can pass until someone changes it.
UNWRITABLE = {errno.EROFS: "it is on a read-only file system", errno.EACCES: "permission denied",
              errno.EPERM: "operation not permitted"}


class ResultsDirError(RuntimeError):
    """The results directory cannot be written (read-only, permission denied): a fault no further attempt can
    pass, so the run stops at once instead of spending every cell's attempts. The message names the directory
    and the cause in one line."""


@dataclass
class Flight:
    """A shard in flight on a worker (``slot``), with its attempt (a group's shards are one flight each, of one
    call)."""

    slot: Any
    shard: Shard
    attempt_id: int
    started: float
    settled: bool = False  # its outcome is recorded (a group's member streamed before the group returned)


class ShardOutcomes:
    """The scheduler's bookkeeping of attempts' outcomes (see the module docstring)."""

    def _land(self, f: Flight) -> HeldCell:
        """Bookkeeping when a flight ends, whatever its outcome."""
        held = self.held[f.shard.cell.id]
        held.in_flight -= 1
        cp = self.progress.cells.get(f.shard.cell.id)
        if cp is not None:
            cp.shards_running -= 1
        return held

    def _flight_lost(self, flights: list[Flight], helds: list[HeldCell], state: AttemptState, error: str,
                     group: int = 1) -> None:
        """A flight's worker is gone (or replaced after a timeout): each shard's attempt ends ``state`` and the
        shard is requeued within its attempts, to run alone when it was in a group (of ``group`` shards, those it
        had handed over not among ``flights``)."""
        if max(group, len(flights)) > 1:
            self.alone.update((f.shard.cell.id, f.shard.index) for f in flights)
            error = f"{error} (in a group of {max(group, len(flights))} cells; each runs alone next)"
        for f, held in zip(flights, helds):
            self._retry_or_fail(f, held, state, error)

    def _settle(self, f: Flight, held: HeldCell, out: CellOutcome, group: int) -> None:
        """One shard's outcome: stored, failed, discarded, or (a group that failed as a whole) run alone next."""
        if not out.ok and out.group_error and group > 1 and not held.failed:
            self.alone.add((f.shard.cell.id, f.shard.index))
            error = f"the group of {group} cells it ran in failed; it runs alone next: {out.error or 'unknown'}"
            self._fail_attempt(f, held, AttemptState.FAILED, error, final=False, out=out)
            return
        if not out.ok:
            self._fail_attempt(f, held, AttemptState.FAILED, out.error or "unknown error", final=True, out=out)
            return
        if held.failed or not self.index.holds(held.cell.id, self.run_id):
            self._discard(f, held, out)
            return
        self._store(f, held, out)

    def _forget_if_idle(self, held: HeldCell) -> None:
        if held.failed and not held.in_flight:
            self.held.pop(held.cell.id, None)

    def _fail_attempt(self, f: Flight, held: HeldCell, state: AttemptState, error: str, *, final: bool,
                      out: CellOutcome | None = None) -> None:
        """Record a failed attempt at a shard: the cell fails when ``final``, else the shard is requeued."""
        extra = {} if out is None else dict(duration_s=out.duration_s, worker=out.worker, node=out.node)
        if held.failed:  # the cell failed on another shard meanwhile: nothing to requeue
            self.index.finish_attempt_failed(f.attempt_id, state=state, error=error, final=False, **extra)
        else:
            self.index.finish_attempt_failed(f.attempt_id, state=state, error=error, final=final, **extra)
            if final:
                self._fail_cell(held)
            else:
                self._requeue(f.shard)
        self._forget_if_idle(held)

    def _fail_cell(self, held: HeldCell) -> None:
        """The cell failed (the index already says so): drop its queued shards."""
        self._drop(held)
        self.progress.failed += 1

    def _drop(self, held: HeldCell) -> None:
        """Run nothing more of a cell here (failed, or taken over by another driver)."""
        held.failed = True
        cid = held.cell.id
        q = self.queue.get(held.cell.model_key)
        if q:
            self.queue[held.cell.model_key] = deque(x for x in q if not (isinstance(x, Shard) and x.cell.id == cid))
        self.progress.cells.pop(cid, None)

    def _discard(self, f: Flight, held: HeldCell, out: CellOutcome) -> None:
        """A shard's result this run may not store: its cell failed on another shard, or another driver took
        the cell over (this run then leaves the cell to it)."""
        why = "the cell failed on another shard" if held.failed else "another driver took the cell over"
        if not held.failed:
            self._drop(held)
        self.index.finish_attempt_failed(f.attempt_id, state=AttemptState.FAILED, error=f"result discarded: {why}",
                                         final=False, duration_s=out.duration_s, worker=out.worker, node=out.node)
        self._forget_if_idle(held)

    def _retry_or_fail(self, f: Flight, held: HeldCell, state: AttemptState, error: str) -> None:
        n = self.session_attempts[(f.shard.cell.id, f.shard.index)]
        final = n >= self.cfg.max_attempts
        if final:
            error = f"{error} (gave up after {n} attempts)"
        self._fail_attempt(f, held, state, error, final=final)

    def _store(self, f: Flight, held: HeldCell, out: CellOutcome) -> None:
        """Write a shard's part, record it, and complete the cell when it was the last."""
        sh = f.shard
        try:
            table = self_describing(out.rows, sh.cell, self.run_id)
        except (pa.ArrowException, ValueError) as e:  # rows Arrow cannot store: the same every attempt
            self._fail_attempt(f, held, AttemptState.FAILED, f"the rows cannot be stored: {e}", final=True, out=out)
            return
        try:
            rel = write_part(self.results_dir, sh.cell.id, sh.index, table,
                             metadata=part_metadata(sh, held.shard_size, out))
        except OSError as e:  # e.g. disk full: the shard is not done; retry within the cap
            if e.errno in UNWRITABLE:  # no attempt can pass: the run stops (its cells go back; resume continues)
                why = f"{self.results_dir} cannot be written: {UNWRITABLE[e.errno]}"
                self.index.finish_attempt_failed(f.attempt_id, state=AttemptState.FAILED, final=False,
                                                 error=f"writing the results failed: {why}", duration_s=out.duration_s,
                                                 worker=out.worker, node=out.node)
                raise ResultsDirError(why) from None
            self._retry_or_fail(f, held, AttemptState.FAILED, f"writing the results failed: {e}")
            return
        provenance = out.provenance or None
        stored = self.index.finish_shard(
            f.attempt_id, shard_size=held.shard_size, start=sh.start, stop=sh.stop, results_dir=self.results_dir,
            result_path=rel, n_rows=table.num_rows, duration_s=out.duration_s,
            peak_memory_bytes=out.peak_memory_bytes, worker=out.worker, node=out.node, provenance=provenance)
        if not stored:  # lost the cell between the check and now
            self._discard(f, held, out)
            return
        held.done[sh.index] = ShardDone(sh.samples, table.num_rows, out.duration_s, out.peak_memory_bytes,
                                        out.worker, out.node, provenance)
        self.progress.samples_done += sh.samples
        self.progress.samples_computed += sh.samples
        self.progress.cells[sh.cell.id].samples_done += sh.samples
        if held.complete:
            self._complete(held)

    def _complete(self, held: HeldCell) -> None:
        """Every shard of a held cell is stored: check its parts, aggregate all its rows, mark it done."""
        cell = held.cell
        rel = cell_dir_relpath(cell.id)
        n_rows = held.n_rows()
        try:
            problem = verify_cell_file(self.results_dir, rel, cell.id, n_rows)
            if problem is not None:
                raise ValueError(f"its parts do not check out: {problem}")
            rows = read_cell_table(self.results_dir, rel).to_pylist()
            if not rows:
                raise ValueError("no samples to aggregate (the task has none here)")
            summary = self.workload.aggregate(cell.to_task(), rows)
        except Exception as e:  # noqa: BLE001 - the cell fails with the reason, the run goes on
            error = f"storing the cell's result failed: {type(e).__name__}: {e}"
            if self.index.fail_cell(cell.id, self.run_id, error):
                self._fail_cell(held)
            self.held.pop(cell.id, None)
            self.progress.cells.pop(cell.id, None)
            return
        worker, node = held.where()
        finished = self.index.finish_cell(
            cell.id, self.run_id, results_dir=self.results_dir, result_path=rel, n_rows=n_rows, summary=summary,
            duration_s=held.duration_s(), peak_memory_bytes=held.peak_memory_bytes(), worker=worker, node=node,
            provenance=held.provenance())
        self.held.pop(cell.id, None)
        self.progress.cells.pop(cell.id, None)
        if finished:
            remove_single_file(self.results_dir, cell.id)  # an older one-file result it replaces
            self.progress.done += 1
