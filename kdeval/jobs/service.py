"""Run-level operations behind the CLI: plan, submit, execute/resume, cancel, rescore.

``submit`` = :func:`create_run` + :func:`execute_run`. ``resume`` = :func:`execute_run` on an existing
run: attempts left ``running`` by a dead driver become ``lost``, failed cells are retried, done cells are
never recomputed, leftover temp files are deleted. A cell counts as done only when its Parquet file checks
out (:func:`kdeval.storage.verify_cell`: readable, its rows all of this cell, as many as the index says);
a truncated, shortened or foreign file, or one written before rows named their cell, is recomputed.
"""
from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kdeval.cluster.raysetup import WorkerResources, connect
from kdeval.cluster.workload import Workload
from kdeval.jobs.cells import CellSpec, expand_grid, grid_hash, kdeval_version
from kdeval.jobs.errors import GridError
from kdeval.jobs.grid import GridSpec
from kdeval.jobs.scheduler import RunOutcome, RunProgress, Scheduler, SchedulerConfig
from kdeval.jobs.validate import parse_grid
from kdeval.storage import (
    TERMINAL_RUN_STATES, CellState, CellView, RunIndex, RunState, RunView, age_seconds, clean_temp_files,
    verify_cell,
)

log = logging.getLogger(__name__)

DEFAULT_RESULTS_DIR = Path(".kdeval") / "results"


@dataclass(frozen=True)
class Plan:
    """A grid's cells, which of them the index already has done, and the cells done in the index whose
    result file failed the check (``invalid``: cell id -> why; they are recomputed)."""

    cells: list[CellSpec]
    done: set[str]
    invalid: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the grid runs that it may not say (see expand_grid)

    @property
    def to_run(self) -> list[CellSpec]:
        return [c for c in self.cells if c.id not in self.done]


def result_problem(view: CellView) -> str | None:
    """None for a cell done in the index whose Parquet file checks out; else why it does not count as done."""
    if view.state != CellState.DONE.value:
        return f"state {view.state}"
    return verify_cell(view)


def _done_ids(index: RunIndex, cells: list[CellSpec]) -> tuple[set[str], dict[str, str]]:
    """Cells done in the index whose Parquet file checks out, and the done ones whose file does not (why)."""
    views = index.get_cells([c.id for c in cells], states=[CellState.DONE])
    problems = {cid: result_problem(v) for cid, v in views.items()}
    return {cid for cid, p in problems.items() if p is None}, {cid: p for cid, p in problems.items() if p}


def plan(index: RunIndex, grid: GridSpec) -> Plan:
    """Expand a grid and look up what is already done (writes nothing)."""
    expansion = expand_grid(grid)
    done, invalid = _done_ids(index, expansion.cells)
    return Plan(cells=expansion.cells, done=done, invalid=invalid, notes=expansion.notes)


def new_run_id() -> str:
    """Sortable, unique run id: ``YYYYmmdd-HHMMSS-xxxxxx``."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def create_run(index: RunIndex, grid: GridSpec, grid_text: str, results_dir: str | Path) -> tuple[str, Plan]:
    """Record a new run of ``grid`` (cells already known are linked, not duplicated)."""
    p = plan(index, grid)
    run_id = new_run_id()
    index.create_run(run_id, name=grid.name, grid_yaml=grid_text, grid_hash=grid_hash(grid),
                     results_dir=str(Path(results_dir).expanduser().resolve()), kdeval_version=kdeval_version(),
                     cells=[c.record() for c in p.cells])
    return run_id, p


def scheduler_config(grid: GridSpec, **overrides) -> SchedulerConfig:
    """Scheduler settings from the grid's resources and retries sections."""
    r = grid.resources
    cfg = dict(workers=r.workers, max_attempts=grid.retries.max_attempts,
               cell_timeout_s=grid.retries.cell_timeout_s,
               resources=WorkerResources(num_cpus=r.cpus_per_worker, num_gpus=r.gpus_per_worker,
                                         accelerator_type=r.accelerator_type))
    cfg.update(overrides)
    return SchedulerConfig(**cfg)


def default_workload() -> Workload:
    """The real evaluation workload (stub models handled inside it)."""
    from kdeval.cluster.execute import EvalWorkload
    return EvalWorkload()


#: A driver whose heartbeat is older than this is presumed dead.
DRIVER_STALE_S = 15.0


class RunBusyError(RuntimeError):
    """Another live driver is running this run."""


class StaleRunError(ValueError):
    """A run recorded by an older kdeval whose cell specs no longer give their stored ids."""


def _stored_spec(view: CellView, run_id: str) -> CellSpec:
    """The cell spec stored for ``view``, refused when it no longer yields the cell's id."""
    stale = StaleRunError(f"run {run_id} was recorded by an older kdeval whose cells are identified differently; "
                          "submit its grid again (cells that are still the same are reused)")
    try:
        spec = CellSpec.model_validate(view.spec)
    except ValueError:
        raise stale from None
    if spec.id != view.id:
        raise stale
    return spec


def driver_alive(run: RunView) -> bool:
    """Whether a run's driver looks alive: state running, a fresh heartbeat and (same host) its pid exists."""
    if run.state != RunState.RUNNING.value or run.driver_pid is None:
        return False
    age = age_seconds(run.heartbeat_at)
    if age is None or age > DRIVER_STALE_S:
        return False
    if run.driver_host == socket.gethostname():
        if run.driver_pid == os.getpid():
            return False
        try:
            os.kill(run.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


def execute_run(
    index: RunIndex, run_id: str, *, address: str | None = None, workload: Workload | None = None,
    on_progress: Callable[[RunProgress], None] | None = None, num_cpus: int | None = None,
    **config_overrides,
) -> RunOutcome:
    """Run (or resume) every cell of ``run_id`` not yet done; returns what happened."""
    run = index.get_run(run_id)
    if run is None:
        raise LookupError(f"no run '{run_id}'")
    run_id = run.id
    if driver_alive(run):
        raise RunBusyError(f"run {run_id} is being run by pid {run.driver_pid} on {run.driver_host} "
                           f"(heartbeat {age_seconds(run.heartbeat_at):.0f}s ago); cancel it or wait")
    try:
        grid = parse_grid(run.grid_yaml, f"run {run_id}")
    except GridError:
        raise StaleRunError(f"run {run_id}: its grid is no longer valid for this kdeval; fix the grid and "
                            "submit it again") from None
    index.recover_orphans(run_id)
    clean_temp_files(run.results_dir)
    views = index.run_cells(run_id)
    todo = []
    for v in views:
        problem = result_problem(v)
        if problem is None:
            continue
        if v.state == CellState.DONE.value:
            log.warning("cell %s is done but its result file is not usable (%s): recomputing it", v.id, problem)
        todo.append(_stored_spec(v, run_id))
    index.reset_cells([c.id for c in todo], [CellState.FAILED, CellState.DONE, CellState.RUNNING])
    if not todo:
        index.start_driver(run_id, socket.gethostname(), os.getpid())
        index.set_run_state(run_id, RunState.DONE)
        return RunOutcome(done=0, failed=0, left=0, attempts=0, model_loads=0, workers_lost=0, cancelled=False)
    connect(address, num_cpus=num_cpus)  # before the run is marked running: a bad address changes nothing
    index.start_driver(run_id, socket.gethostname(), os.getpid())
    sched = Scheduler(index, run_id, todo, workload or default_workload(), run.results_dir,
                      scheduler_config(grid, **config_overrides), on_progress)
    outcome = sched.run()
    stats = (f"{outcome.done} done, {outcome.failed} failed in {outcome.attempts} attempts; "
             f"{outcome.model_loads} model load(s); {outcome.workers_lost} worker(s) lost")
    if outcome.cancelled:
        index.set_run_state(run_id, RunState.CANCELLED, f"cancelled by user ({stats})")
    elif outcome.failed or outcome.left:
        index.set_run_state(run_id, RunState.FAILED, f"{outcome.message or 'some cells failed'} ({stats})")
    else:
        index.set_run_state(run_id, RunState.DONE, stats)
    return outcome


def cancel_run(index: RunIndex, run_id: str) -> str:
    """Ask a run's driver to stop (it notices at its next heartbeat); returns the previous state."""
    run = index.get_run(run_id)
    if run is None:
        raise LookupError(f"no run '{run_id}'")
    if run.state in TERMINAL_RUN_STATES:
        return run.state
    index.set_run_state(run.id, RunState.CANCELLED, "cancelled by user")
    return run.state
