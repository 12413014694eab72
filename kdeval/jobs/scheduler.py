"""The scheduler: one loop over ``ray.wait`` that hands cells to worker actors and records everything.

Rules:

* **Model affinity** — an idle worker gets a cell of the model it already holds; otherwise a model
  held by the fewest workers (ties: most cells left), but only when that model has more cells queued
  than workers holding it — so each model is loaded at most once per worker, usually less.
* **Dead workers** (process or node died, or a cell exceeded ``cell_timeout_s``) are replaced; their
  cell's attempt is recorded ``lost``/``timeout`` and the cell requeued until ``max_attempts``.
* **Cell errors** (the cell's own code raised, out-of-memory included) mark that cell failed with the
  error text; the run goes on.
* Only this loop (the driver) writes the index; per-sample rows, with the cell's identity columns added
  (:func:`kdeval.jobs.export.self_describing`), are written to Parquet (temp + rename) *before* the cell
  is marked done, with the provenance the worker reported.
* A cell another run finished meanwhile is skipped only if its Parquet file checks out
  (:func:`kdeval.storage.verify_cell`); otherwise it is recomputed.
* ``kdeval cancel`` is noticed at each heartbeat: dispatching stops, workers are killed, in-flight
  cells go back to pending.
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import ray
from ray import exceptions as rex

from kdeval.cluster.raysetup import WorkerResources, missing_resources
from kdeval.cluster.worker import worker_actor_class
from kdeval.cluster.workload import CellOutcome, WorkerInfo, Workload
from kdeval.jobs.cells import CellSpec
from kdeval.jobs.export import self_describing
from kdeval.storage import AttemptState, CellState, RunIndex, RunState, verify_cell, write_cell_rows

log = logging.getLogger(__name__)

#: Ray errors meaning "the worker (or its node) is gone", not "the cell is wrong".
WORKER_LOST_ERRORS = (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError,
                      rex.OwnerDiedError, rex.GetTimeoutError)


@dataclass(frozen=True)
class SchedulerConfig:
    """How many workers, what each holds, and the reliability knobs."""

    workers: int = 1
    resources: WorkerResources = WorkerResources()
    max_attempts: int = 3
    cell_timeout_s: float | None = None
    poll_s: float = 0.25
    heartbeat_s: float = 1.0
    worker_start_timeout_s: float = 300.0
    max_replacements: int | None = None  # default: 2 x workers + 2


@dataclass
class RunProgress:
    """Counters passed to the progress callback after every event."""

    total: int
    done: int = 0
    failed: int = 0
    running: int = 0  # cells in flight (set from the scheduler's flights before each callback)
    workers_lost: int = 0


@dataclass
class RunOutcome:
    """What a scheduler run did."""

    done: int
    failed: int
    left: int  # cells neither done nor failed (cancelled or no worker could start)
    attempts: int
    model_loads: int
    workers_lost: int
    cancelled: bool
    message: str | None = None
    model_loads_by_worker: dict[str, int] = field(default_factory=dict)


@dataclass
class _Slot:
    name: str
    actor: Any
    info: WorkerInfo | None = None
    loaded_key: str | None = None
    busy: bool = False
    alive: bool = True
    loads: int = 0


@dataclass
class _Flight:
    slot: _Slot
    cell: CellSpec
    attempt_id: int
    started: float


class Scheduler:
    """Runs ``cells`` of ``run_id`` on Ray workers (``ray`` must already be connected)."""

    def __init__(self, index: RunIndex, run_id: str, cells: list[CellSpec], workload: Workload,
                 results_dir: str, config: SchedulerConfig,
                 on_progress: Callable[[RunProgress], None] | None = None) -> None:
        self.index, self.run_id, self.workload = index, run_id, workload
        self.results_dir, self.cfg = results_dir, config
        self.on_progress = on_progress or (lambda p: None)
        self.queue: dict[str, deque[CellSpec]] = {}
        for c in cells:
            self.queue.setdefault(c.model_key, deque()).append(c)
        self.progress = RunProgress(total=len(cells))
        self.slots: list[_Slot] = []
        self.starting: dict[Any, _Slot] = {}  # info() ref -> slot not yet ready
        self.flights: dict[Any, _Flight] = {}
        self.session_attempts: Counter[str] = Counter()
        self.replacements = 0
        self.max_replacements = (config.max_replacements if config.max_replacements is not None
                                 else 2 * config.workers + 2)
        self.skipped_done = 0

    # ------------------------------------------------------------------ workers
    def _spawn(self) -> None:
        name = f"w{len(self.slots)}"
        actor = worker_actor_class().options(**self.cfg.resources.actor_options()).remote(self.workload, name)
        slot = _Slot(name=name, actor=actor)
        self.slots.append(slot)
        self.starting[actor.info.remote()] = slot

    def _lose(self, slot: _Slot, why: str) -> None:
        """Forget a dead worker and start a replacement (within the cap)."""
        if not slot.alive:
            return
        slot.alive, slot.busy = False, False
        self.progress.workers_lost += 1
        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass
        log.warning("worker %s lost: %s", slot.name, why)
        if self.replacements < self.max_replacements and self._pending_cells():
            self.replacements += 1
            self._spawn()

    def _live(self) -> list[_Slot]:
        return [s for s in self.slots if s.alive]

    # ------------------------------------------------------------------ queue
    def _pending_cells(self) -> int:
        return sum(len(q) for q in self.queue.values())

    def _pick(self, slot: _Slot) -> CellSpec | None:
        """Next cell for an idle worker: its own model's first; else a model nobody holds, or one with
        more cells queued than workers holding it (otherwise wait: loading costs more than waiting)."""
        if slot.loaded_key and self.queue.get(slot.loaded_key):
            return self.queue[slot.loaded_key].popleft()
        holders = Counter(s.loaded_key for s in self._live() if s.info is not None and s is not slot)
        keys = [k for k, q in self.queue.items() if q and len(q) > holders[k]]
        if not keys:
            return None
        key = min(keys, key=lambda k: (holders[k], -len(self.queue[k])))
        return self.queue[key].popleft()

    def _requeue(self, cell: CellSpec) -> None:
        self.queue.setdefault(cell.model_key, deque()).appendleft(cell)

    def _done_elsewhere(self, cell: CellSpec) -> bool:
        """True (and counted done) when another run sharing this cell finished it meanwhile and its Parquet
        file is the cell's own (one that fails the check is recomputed)."""
        view = self.index.get_cell(cell.id)
        if view is None or view.state != CellState.DONE.value:
            return False
        problem = verify_cell(view)
        if problem is not None:
            log.warning("cell %s is done but its result file is not usable (%s): recomputing", cell.id, problem)
            return False
        self.progress.done += 1
        self.skipped_done += 1
        return True

    def _dispatch(self) -> None:
        for slot in self._live():
            if slot.busy or slot.info is None:
                continue
            cell = self._pick(slot)
            while cell is not None and self._done_elsewhere(cell):
                cell = self._pick(slot)
            if cell is None:
                continue
            self.session_attempts[cell.id] += 1
            att = self.index.start_attempt(self.run_id, cell.id, slot.name, slot.info.node_id)
            ref = slot.actor.run_cell.remote(cell.to_task())
            slot.busy, slot.loaded_key = True, cell.model_key
            self.flights[ref] = _Flight(slot, cell, att, time.monotonic())

    # ------------------------------------------------------------------ outcomes
    def _retry_or_fail(self, f: _Flight, state: AttemptState, error: str) -> None:
        final = self.session_attempts[f.cell.id] >= self.cfg.max_attempts
        if final:
            error = f"{error} (gave up after {self.session_attempts[f.cell.id]} attempts)"
        self.index.finish_attempt_failed(f.attempt_id, state=state, error=error, final=final,
                                         duration_s=time.monotonic() - f.started)
        if final:
            self.progress.failed += 1
        else:
            self._requeue(f.cell)

    def _finish(self, ref: Any) -> None:
        f = self.flights.pop(ref)
        f.slot.busy = False
        try:
            out: CellOutcome = ray.get(ref, timeout=60)
        except WORKER_LOST_ERRORS as e:
            self._retry_or_fail(f, AttemptState.LOST, f"worker {f.slot.name} lost: {type(e).__name__}")
            self._lose(f.slot, type(e).__name__)
            return
        except rex.RayError as e:  # unexpected Ray-side failure of the call itself
            self.index.finish_attempt_failed(f.attempt_id, state=AttemptState.FAILED, error=str(e), final=True)
            self.progress.failed += 1
            return
        f.slot.loads = out.model_loads
        if out.ok:
            try:
                table = self_describing(out.rows, f.cell, self.run_id)
            except (pa.ArrowException, ValueError) as e:  # rows Arrow cannot store: the same every attempt
                self.index.finish_attempt_failed(
                    f.attempt_id, state=AttemptState.FAILED, error=f"the rows cannot be stored: {e}", final=True,
                    duration_s=out.duration_s, worker=out.worker, node=out.node)
                self.progress.failed += 1
                return
            try:
                rel = write_cell_rows(self.results_dir, f.cell.id, table)
            except OSError as e:  # e.g. disk full: the cell is not done; retry within the cap
                self._retry_or_fail(f, AttemptState.FAILED, f"writing the results failed: {e}")
                return
            self.index.finish_attempt_done(
                f.attempt_id, results_dir=self.results_dir, result_path=rel, n_rows=table.num_rows,
                summary=out.summary, duration_s=out.duration_s, peak_memory_bytes=out.peak_memory_bytes,
                worker=out.worker, node=out.node, provenance=out.provenance or None)
            self.progress.done += 1
        else:
            self.index.finish_attempt_failed(
                f.attempt_id, state=AttemptState.FAILED, error=out.error or "unknown error", final=True,
                duration_s=out.duration_s, worker=out.worker, node=out.node)
            self.progress.failed += 1

    def _started(self, ref: Any) -> None:
        slot = self.starting.pop(ref)
        try:
            slot.info = ray.get(ref, timeout=60)
        except rex.RayError as e:
            self._lose(slot, f"failed to start: {type(e).__name__}")

    def _check_timeouts(self) -> None:
        limit = self.cfg.cell_timeout_s
        if limit is None:
            return
        now = time.monotonic()
        for ref, f in list(self.flights.items()):
            if now - f.started > limit:
                self.flights.pop(ref)
                self._retry_or_fail(f, AttemptState.TIMEOUT, f"cell exceeded cell_timeout_s={limit:g}")
                self._lose(f.slot, "cell timeout")

    def _cancel(self) -> None:
        for f in self.flights.values():
            self.index.finish_attempt_failed(f.attempt_id, state=AttemptState.LOST,
                                             error="run cancelled", final=False)
        self.flights.clear()

    def _report(self) -> None:
        self.progress.running = len(self.flights)
        self.on_progress(self.progress)

    # ------------------------------------------------------------------ loop
    def run(self) -> RunOutcome:
        """Run until every cell is done or failed, the run is cancelled, or no worker can start."""
        for _ in range(min(self.cfg.workers, max(self._pending_cells(), 1))):
            self._spawn()
        cancelled, message = False, None
        last_beat = t_no_worker = time.monotonic()
        try:
            while self._pending_cells() or self.flights:
                self._dispatch()
                refs = list(self.flights) + list(self.starting)
                if not refs:
                    message = "no worker left to run the remaining cells"
                    break
                ready, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.poll_s)
                for ref in ready:
                    (self._finish if ref in self.flights else self._started)(ref)
                self._check_timeouts()
                self._report()
                now = time.monotonic()
                if any(s.info is not None for s in self._live()):
                    t_no_worker = now
                elif now - t_no_worker > self.cfg.worker_start_timeout_s:
                    why = missing_resources(self.cfg.resources) or "workers did not start in time"
                    message = f"no worker could start within {self.cfg.worker_start_timeout_s:g}s: {why}"
                    break
                if now - last_beat >= self.cfg.heartbeat_s:
                    last_beat = now
                    if self.index.heartbeat(self.run_id) == RunState.CANCELLED.value:
                        cancelled = True
                        self._cancel()
                        break
        finally:
            loads = {s.name: s.loads for s in self.slots}
            for s in self.slots:
                try:
                    ray.kill(s.actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
        left = self._pending_cells() + len(self.flights)
        self._report()
        return RunOutcome(done=self.progress.done, failed=self.progress.failed, left=left,
                          attempts=sum(self.session_attempts.values()), model_loads=sum(loads.values()),
                          workers_lost=self.progress.workers_lost, cancelled=cancelled,
                          message=message, model_loads_by_worker=loads)
