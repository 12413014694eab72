"""The scheduler: one loop over ``ray.wait`` that hands sample shards of cells to worker actors and records
everything.

Rules:

* **One driver per cell** — a driver takes a cell (``RunIndex.claim_cell``) before running any of it and
  gives it back when it is done or failed, or when the driver stops. A cell held by another live driver
  (:func:`kdeval.jobs.run.drivers.driver_alive`) is never started here: this run waits for it (``wait_for_held``)
  and counts it done once that driver stored it, or takes it over if that driver dies (its running attempts
  at the cell become ``lost``; nothing else of it is touched). Without waiting, such cells are left
  (:mod:`kdeval.jobs.run.holds`).
* **Sample shards** — a taken cell is split in shards of ``shard_size`` samples (:mod:`kdeval.jobs.run.shards`),
  each with its own attempts and its own Parquet part; idle workers take the next shard of a held cell
  first, so several workers run one large cell at once, and a killed worker loses at most its shard. A cell
  is done when all its shards are: its parts are read back and checked, and the workload's ``aggregate``
  of all its rows becomes the cell's summary (:mod:`kdeval.jobs.run.outcomes`). Shards stored by an earlier
  driver are kept.
* **Groups** (:mod:`kdeval.jobs.run.groups`, unless ``share`` is off: ``execution: {share: false}``) — the shard an
  idle worker picks goes out with the queued shards of the same consecutive sample ranges of the cells that can
  share with it (same model, task instance and generation length), cells not yet taken being taken for it: one
  call (``run_group``) computes what they compute alike once. Each shard keeps its own attempt, part and outcome;
  a group of one runs as ``run_cell``. A group *streams*: its fresh cells are planned in shards of at most
  ``stream_size`` samples, and the (cell, shard)s it finishes are taken from its worker while it runs
  (:class:`~kdeval.jobs.run.group_probe.GroupProbes`) and stored at once, so a kill loses only the shards in
  flight. A group whose worker is lost, that times out (its limit is
  ``cell_timeout_s`` per shard in it) or that fails as a whole (the workload raised for the group) has its
  shards not yet stored requeued to run alone: a lost or timed-out group counts an attempt at each of them, a failed group
  does not (each cell's own error shows alone). When the run's groups are fewer units of work than its
  workers, a fresh cell is planned in the smaller shard size of its share key
  (:func:`kdeval.jobs.run.groups.spread_shard_sizes`), so the groups' shards spread over the workers.
* **Model affinity** (:func:`kdeval.jobs.run.affinity.pick_model`) — an idle worker gets work of the model it
  already holds; otherwise a model held by the fewest workers (ties: most work left), but only when that model
  has more cells or shards queued than workers holding it — so each model is loaded at most once per worker,
  usually less.
* **Dead workers** (process or node died, or a shard exceeded ``cell_timeout_s``) are replaced, 2 x workers + 2
  times at most; their shard's attempt is recorded ``lost``/``timeout`` and the shard requeued until
  ``max_attempts``.
* **Cell errors** (the cell's own code raised, out-of-memory included) mark that cell failed with the
  error text; its other shards are dropped and the run goes on.
* Only drivers write the index; per-sample rows, with the cell's identity columns added
  (:func:`kdeval.jobs.grid.identity.self_describing`), are written to Parquet (temp + rename) *before* their shard
  is recorded, with the provenance the worker reported; a driver that lost a cell stores nothing of it.
* A cell another run finished meanwhile is skipped only if its Parquet files check out
  (:func:`kdeval.storage.verify_cell`); otherwise it is recomputed.
* ``kdeval cancel`` is noticed at each heartbeat: dispatching stops, workers are killed, in-flight
  shards' attempts become lost and the cells go back to pending.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, deque
from typing import Any, Callable

import ray
from ray import exceptions as rex

from kdeval.cluster.raysetup import WorkerResources, missing_resources
from kdeval.cluster.worker import worker_actor_class
from kdeval.cluster.workload import CellOutcome, Workload
from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.grid.cells import CellSpec, policy_label, protocol_tag
from kdeval.jobs.run.affinity import WorkerSlot, pick_model
from kdeval.jobs.run.group_probe import GroupProbes
from kdeval.jobs.run.groups import group_shard_sizes, share_key, take_group, units_of_work
from kdeval.jobs.run.holds import Holds
from kdeval.jobs.run.outcomes import Flight, ShardOutcomes
from kdeval.jobs.run.progress import CellProgress, RunProgress
from kdeval.jobs.run.run_config import RunOutcome, SchedulerConfig
from kdeval.jobs.run.shards import HeldCell, Shard, plan_cell
from kdeval.storage import (
    AttemptState, CellState, CellView, IndexStorageError, RunIndex, RunState, remove_parts, verify_cell,
)

__all__ = ["Scheduler", "WORKER_LOST_ERRORS"]

log = logging.getLogger(__name__)

#: Ray errors meaning "the worker (or its node) is gone", not "the cell is wrong".
WORKER_LOST_ERRORS = (rex.RayActorError, rex.WorkerCrashedError, rex.ObjectLostError,
                      rex.OwnerDiedError, rex.GetTimeoutError)


def _cell_label(cell: CellSpec) -> str:
    budget = "-" if cell.budget is None else cell.budget
    pol = policy_label(cell.policy, cell.policy_params) + protocol_tag(
        {"protocol": cell.protocol.model_dump(),
         "conversation": cell.conversation.model_dump() if cell.conversation else None,
         "kv_quant": cell.kv_quant and cell.kv_quant.model_dump()})
    return f"{cell.id[:8]} {pol} {budget}/{chunk_text(cell.chunk_size)} {cell.task.label}"


class Scheduler(ShardOutcomes):
    """Runs ``cells`` of ``run_id`` on Ray workers (``ray`` must already be connected)."""

    def __init__(self, index: RunIndex, run_id: str, cells: list[CellSpec], workload: Workload,
                 results_dir: str, config: SchedulerConfig,
                 on_progress: Callable[[RunProgress], None] | None = None) -> None:
        self.index, self.run_id, self.workload = index, run_id, workload
        self.results_dir, self.cfg = str(results_dir), config
        self.on_progress = on_progress or (lambda p: None)
        self.queue: dict[str, deque[CellSpec | Shard]] = {}  # per model: cells not taken, shards of held cells
        for c in cells:
            self.queue.setdefault(c.model_key, deque()).append(c)
        # share key -> shard size of its fresh cells: smaller than shard_size when the groups are fewer than workers
        self.shard_sizes = group_shard_sizes(cells, config.shard_size, config.workers) if config.share else {}
        self.progress = RunProgress(total=len(cells), samples_total=sum(c.task.samples for c in cells))
        self.slots: list[WorkerSlot] = []
        self.starting: dict[Any, WorkerSlot] = {}  # info() ref -> slot not yet ready
        self.flights: dict[Any, list[Flight]] = {}  # one call's ref -> its shards (several: a group)
        self.probes = GroupProbes()  # how far the running groups have got
        self.held: dict[str, HeldCell] = {}  # cells this driver holds and has not finished
        self.alone: set[tuple[str, int]] = set()  # (cell id, shard) to run by itself: its group was lost or failed
        self.holds = Holds(index, run_id, wait=config.wait_for_held, recheck_s=config.heartbeat_s)
        self.session_attempts: Counter[tuple[str, int]] = Counter()  # (cell id, shard) -> attempts here
        self.replacements = 0
        self.max_replacements = 2 * config.workers + 2  # dead workers replaced, at most
        self.skipped_done = 0

    # ------------------------------------------------------------------ workers
    def _spawn(self) -> None:
        name = f"w{len(self.slots)}"
        actor = worker_actor_class().options(**self.cfg.resources.actor_options()).remote(self.workload, name)
        slot = WorkerSlot(name=name, actor=actor)
        self.slots.append(slot)
        self.starting[actor.info.remote()] = slot

    def _lose(self, slot: WorkerSlot, why: str) -> None:
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
        if self.replacements < self.max_replacements and self._queued():
            self.replacements += 1
            self._spawn()

    def _live(self) -> list[WorkerSlot]:
        return [s for s in self.slots if s.alive]

    # ------------------------------------------------------------------ queue
    def _queued(self) -> int:
        """Cells not taken and shards not started, of every model."""
        return sum(len(q) for q in self.queue.values())

    def _pick(self, slot: WorkerSlot) -> CellSpec | Shard | None:
        """Next cell or shard for an idle worker (:func:`kdeval.jobs.run.affinity.pick_model`), or None: wait."""
        key = pick_model(self.queue, slot, self._live())
        return None if key is None else self.queue[key].popleft()

    def _requeue(self, item: CellSpec | Shard) -> None:
        self.queue.setdefault(item.model_key, deque()).appendleft(item)

    # ------------------------------------------------------------------ leases
    def done_elsewhere(self, cell: CellSpec, view: CellView | None = None) -> bool:
        """True (and counted done) when another run finished the cell meanwhile and its Parquet files are the
        cell's own (a done cell whose files fail the check is recomputed)."""
        view = view if view is not None else self.index.get_cell(cell.id)
        if view is None or view.state != CellState.DONE.value:
            return False
        problem = verify_cell(view)
        if problem is not None:
            log.warning("cell %s is done but its result file is not usable (%s): recomputing", cell.id, problem)
            return False
        self.progress.done += 1
        self.progress.samples_done += cell.task.samples
        self.skipped_done += 1
        return True

    def _take(self, cell: CellSpec) -> Shard | None:
        """Take a cell and plan its shards; its first shard to run, or None when there is none to run here
        (held by another driver, done meanwhile, or complete from shards already stored)."""
        holder = self.holds.claim(cell.id)
        if holder is not None:
            self.holds.set_aside(cell, holder)
            self.progress.waiting = self.holds.counts()
            return None
        if self.done_elsewhere(cell):
            self.index.release_cells(self.run_id, [cell.id])
            return None
        existing = self.index.cell_shards(cell.id)
        held = plan_cell(cell, existing, self._plan_size(cell), self.results_dir)
        if len(held.done) != len(existing):
            self.index.drop_shards(cell.id, keep=list(held.done))
        remove_parts(self.results_dir, cell.id, keep=held.done)
        self.held[cell.id] = held
        reused = sum(d.samples for d in held.done.values())
        self.progress.cells[cell.id] = CellProgress(_cell_label(cell), cell.task.samples, samples_done=reused)
        self.progress.samples_done += reused
        todo = held.missing()
        if not todo:
            self._complete(held)
            return None
        for shard in reversed(todo[1:]):
            self._requeue(shard)
        return todo[0]

    def _span(self, cell: CellSpec) -> int:
        """The samples a group of ``cell``'s share key runs in one call: its spread size
        (:func:`group_shard_sizes`), rounded up to whole shards of :meth:`_plan_size`."""
        plan = self._plan_size(cell)
        return plan * -(-self.shard_sizes.get(share_key(cell), self.cfg.shard_size) // plan)

    def _plan_size(self, cell: CellSpec) -> int:
        """The shard size of a fresh cell: when it runs in groups, its group's spread size split evenly in
        shards of at most ``stream_size`` (each stored as soon as the group finishes it), else ``shard_size``."""
        if not self.cfg.share:
            return self.cfg.shard_size
        spread = self.shard_sizes.get(share_key(cell), self.cfg.shard_size)
        return -(-spread // -(-spread // self.cfg.stream_size))

    def _check_waiting(self) -> None:
        """Cells waited for that their driver stored count done; those it gave back, or whose driver died, go
        back to the queue to be taken."""
        for cell in self.holds.recheck(self.done_elsewhere):
            self._requeue(cell)
        self.progress.waiting = self.holds.counts()

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self) -> None:
        for slot in self._live():
            if slot.busy or slot.info is None:
                continue
            work = self._pick(slot)
            while isinstance(work, CellSpec):
                work = self._take(work) or self._pick(slot)
            if work is None:
                continue
            group = [work]
            if self.cfg.share:
                group = take_group(work, self.queue[work.model_key], self._take, self._requeue, self.alone,
                                   span=self._span(work.cell))
            self._start(slot, group)

    def _start(self, slot: WorkerSlot, shards: list[Shard]) -> None:
        """One call on ``slot`` for ``shards`` (``run_cell`` for one, ``run_group`` for several), an attempt each."""
        flights = []
        for shard in shards:
            self.session_attempts[(shard.cell.id, shard.index)] += 1
            att = self.index.start_attempt(self.run_id, shard.cell.id, slot.name, slot.info.node_id,
                                           shard=shard.index)
            flights.append(Flight(slot, shard, att, time.monotonic()))
            self.held[shard.cell.id].in_flight += 1
            self.progress.cells[shard.cell.id].shards_running += 1
        tasks = [dataclasses.replace(sh.to_task(), time_first=self.cfg.time_first) for sh in shards]
        ref = slot.actor.run_cell.remote(tasks[0]) if len(tasks) == 1 else slot.actor.run_group.remote(tasks)
        slot.busy, slot.loaded_key = True, shards[0].model_key
        self.flights[ref] = flights
        if self.progress.computing_since is None:
            self.progress.computing_since = time.monotonic()

    # ------------------------------------------------------------------ outcomes
    def _finish(self, ref: Any) -> None:
        flights = self.flights.pop(ref)
        slot = flights[0].slot
        slot.busy = False
        size = len(flights)
        open_ = [f for f in flights if not f.settled]  # a group's members it streamed are stored already
        helds = [self._land(f) for f in open_]
        try:
            got = ray.get(ref, timeout=60)
        except WORKER_LOST_ERRORS as e:
            self._flight_lost(open_, helds, AttemptState.LOST, f"worker {slot.name} lost: {type(e).__name__}",
                              group=size)
            self._lose(slot, type(e).__name__)
            return
        except rex.RayError as e:  # unexpected Ray-side failure of the call itself
            for f, held in zip(open_, helds):
                self._fail_attempt(f, held, AttemptState.FAILED, str(e), final=True)
            return
        outs: list[CellOutcome] = got if isinstance(got, list) else [got]
        slot.loads = outs[0].model_loads
        for f, out in zip(flights, outs):
            if not f.settled:
                self._settle(f, helds[open_.index(f)], out, group=size)

    def _streamed(self, news: list[tuple[Any, int, CellOutcome]]) -> None:
        """Store the outcomes a running group handed over (:class:`GroupProbes`) while it goes on; the group's
        own return skips them."""
        for ref, k, out in news:
            flights = self.flights.get(ref)
            if flights is None or k >= len(flights) or flights[k].settled:
                continue
            f = flights[k]
            f.settled = True
            self._settle(f, self._land(f), out, group=len(flights))

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
        for ref, flights in list(self.flights.items()):
            if now - flights[0].started > limit * len(flights):  # a group: the limit per shard in it
                self.flights.pop(ref)
                open_ = [f for f in flights if not f.settled]
                helds = [self._land(f) for f in open_]
                self._flight_lost(open_, helds, AttemptState.TIMEOUT, f"cell exceeded cell_timeout_s={limit:g}",
                                  group=len(flights))
                self._lose(flights[0].slot, "cell timeout")

    def _stop_flights(self, error: str) -> None:
        """In-flight attempts become lost (cancel, or the driver stopping); their cells are given back."""
        for f in (f for flights in self.flights.values() for f in flights if not f.settled):
            self.index.finish_attempt_failed(f.attempt_id, state=AttemptState.LOST, error=error, final=False)
        self.flights.clear()

    def _report(self) -> None:
        self.progress.running = sum(1 for c in self.progress.cells.values() if c.shards_running)
        self.on_progress(self.progress)

    # ------------------------------------------------------------------ loop
    def run(self) -> RunOutcome:
        """Run until every cell is done or failed, the run is cancelled, or no worker can start."""
        cells = [c for q in self.queue.values() for c in q]
        work = units_of_work(cells, self.cfg.shard_size, self.cfg.share, self.cfg.workers)
        for _ in range(min(self.cfg.workers, max(work, 1))):
            self._spawn()
        cancelled, message = False, None
        last_beat = t_no_worker = time.monotonic()
        try:
            while self._queued() or self.flights or self.holds.waiting:
                self._dispatch()
                refs = list(self.flights) + list(self.starting)
                if refs:
                    ready, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.poll_s)
                    for ref in ready:
                        (self._finish if ref in self.flights else self._started)(ref)
                elif self._queued():
                    message = "no worker left to run the remaining cells"
                    break
                else:  # only cells other drivers hold are left: wait for them
                    time.sleep(self.cfg.poll_s)
                self._check_timeouts()
                self._streamed(self.probes.poll(self.flights, time.monotonic()))
                self.probes.count(self.flights, self.progress)
                self._report()
                now = time.monotonic()
                if any(s.info is not None for s in self._live()) or not (self._queued() or self.flights):
                    t_no_worker = now
                elif now - t_no_worker > self.cfg.worker_start_timeout_s:
                    why = missing_resources(self.cfg.resources) or "workers did not start in time"
                    message = f"no worker could start within {self.cfg.worker_start_timeout_s:g}s: {why}"
                    break
                if now - last_beat >= self.cfg.heartbeat_s:
                    last_beat = now
                    if self.index.heartbeat(self.run_id) == RunState.CANCELLED.value:
                        cancelled = True
                        self._stop_flights("run cancelled")
                        break
                    self._check_waiting()
        finally:
            loads = {s.name: s.loads for s in self.slots}
            for s in self.slots:
                try:
                    ray.kill(s.actor, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
            try:
                self._stop_flights("the driver stopped")
                self.index.release_cells(self.run_id)
            except IndexStorageError:  # the index failed (disk full, ...): the caller says so; resume recovers
                pass
            except Exception:  # noqa: BLE001 - never mask the loop's own error; resume recovers
                log.exception("could not give back the cells of run %s", self.run_id)
        message = message or self.holds.message()
        p = self.progress
        self._report()
        return RunOutcome(done=p.done, failed=p.failed, left=p.total - p.done - p.failed,
                          attempts=sum(self.session_attempts.values()), model_loads=sum(loads.values()),
                          workers_lost=p.workers_lost, cancelled=cancelled,
                          message=message, model_loads_by_worker=loads)
