"""Run-level operations behind the CLI: plan, submit, execute/resume, cancel, rescore.

``submit`` = :func:`create_run` + :func:`execute_run`. ``resume`` = :func:`execute_run` on an existing
run: attempts left ``running`` by its dead driver become ``lost``, failed cells are retried, done cells are
never recomputed (nor the done shards of unfinished cells), leftover temp files are deleted. A cell counts as
done only when its Parquet files check out (:func:`kdeval.storage.verify_cell`: readable, its rows all of
this cell, as many as the index says); a truncated, shortened or foreign file, or one written before rows
named their cell, is recomputed.

Several drivers may share an index: a run whose driver is alive is waited for (``wait=True``) or refused
(:class:`RunBusyError`), and cells another live driver holds are waited for by the scheduler, never taken
from it (:mod:`kdeval.jobs.run.drivers`, :mod:`kdeval.jobs.run.scheduler`).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from kdeval.cluster.plugins import PluginError, PluginSpec, metric_plugin, plugins_for, policy_plugin
from kdeval.cluster.reach import DEFAULT_CONNECT_TIMEOUT_S
from kdeval.cluster.workload import Workload
from kdeval.jobs.grid.cells import CellSpec, cell_code_version, expand_grid, grid_hash, kdeval_version
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.grid.schema import GridSpec
from kdeval.jobs.run import recovery
from kdeval.jobs.run.drivers import DRIVER_STALE_S, describe_driver, driver_alive
from kdeval.jobs.run.progress import RunProgress
from kdeval.storage import (
    TERMINAL_RUN_STATES, CellState, CellView, RunIndex, RunState, RunView, age_seconds, clean_temp_files,
    verify_cell,
)

if TYPE_CHECKING:  # Ray is imported only by what runs cells (status, ls and report never need it)
    from kdeval.jobs.run.run_config import RunOutcome, SchedulerConfig

__all__ = ["DRIVER_STALE_S", "driver_alive", "execute_run", "RunBusyError", "StaleRunError", "RunPlan", "plan",
           "create_run", "cancel_run", "scheduler_config", "RunProgress"]

log = logging.getLogger(__name__)

DEFAULT_RESULTS_DIR = Path(".kdeval") / "results"


@dataclass(frozen=True)
class RunPlan:
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


def plan(index: RunIndex, grid: GridSpec, salt: Callable[[CellSpec], str] | None = None) -> RunPlan:
    """Expand a grid (cells salted by ``salt``, see :func:`expand_grid`) and look up what is already done
    (writes nothing)."""
    from kdeval.jobs.grid.prompt_fit import check_prompts  # tokenizers (torch): only when a grid is planned

    expansion = expand_grid(grid, salt=salt)
    check_prompts(grid)  # a task instance no prompt of which a model can take: GridError, nothing recorded
    done, invalid = _done_ids(index, expansion.cells)
    return RunPlan(cells=expansion.cells, done=done, invalid=invalid, notes=expansion.notes)


def new_run_id() -> str:
    """Sortable, unique run id: ``YYYYmmdd-HHMMSS-xxxxxx``."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def create_run(index: RunIndex, grid: GridSpec, grid_text: str, results_dir: str | Path,
               salt: Callable[[CellSpec], str] | None = None) -> tuple[str, RunPlan]:
    """Record a new run of ``grid`` (cells already known are linked, not duplicated; ``salt``: see :func:`plan`),
    write its manifest into the results directory and adopt the cells whose files are already there
    (:func:`kdeval.jobs.run.recovery.adopt_cells`: the plan counts them done)."""
    p = plan(index, grid, salt)
    run_id = new_run_id()
    where = str(Path(results_dir).expanduser().resolve())
    records, digest, created = [c.record() for c in p.cells], grid_hash(grid), datetime.now(timezone.utc)
    # the manifest first: a results directory that cannot take it (OSError) leaves the index as it was
    recovery.write_manifest(where, run_id, name=grid.name, grid_yaml=grid_text, grid_hash=digest,
                           kdeval_version=kdeval_version(), created_at=created, cells=records)
    try:
        index.create_run(run_id, name=grid.name, grid_yaml=grid_text, grid_hash=digest, results_dir=where,
                         kdeval_version=kdeval_version(), cells=records, created_at=created)
    except BaseException:
        recovery.remove_manifest(where, run_id)  # no manifest of a run the index does not have
        raise
    adopted = recovery.adopt_cells(index, run_id, where, p.to_run, default_workload)
    if adopted:
        p = RunPlan(cells=p.cells, done=p.done | adopted, invalid=p.invalid, notes=p.notes + [
            f"{len(adopted)} cell(s) adopted from their files in {where} (not recomputed)"])
    return run_id, p


def scheduler_config(grid: GridSpec, **overrides) -> SchedulerConfig:
    """Scheduler settings from the grid's resources, retries and execution sections."""
    from kdeval.cluster.raysetup import WorkerResources
    from kdeval.jobs.run.run_config import SchedulerConfig

    r = grid.resources
    cfg = dict(workers=r.workers, max_attempts=grid.retries.max_attempts,
               cell_timeout_s=grid.retries.cell_timeout_s, shard_size=r.shard_size, share=grid.execution.share,
               time_first=grid.execution.time_first,
               resources=WorkerResources(num_cpus=r.cpus_per_worker, num_gpus=r.gpus_per_worker,
                                         accelerator_type=r.accelerator_type))
    cfg.update(overrides)
    return SchedulerConfig(**cfg)


def default_workload(plugins: Sequence[PluginSpec] = ()) -> Workload:
    """The real evaluation workload (stub models handled inside it), importing ``plugins`` on its workers."""
    from kdeval.cluster.execute import EvalWorkload
    from kdeval.cluster.plugin_env import PluginWorkload

    return PluginWorkload(EvalWorkload(), tuple(plugins)) if plugins else EvalWorkload()


def run_plugins(run_id: str, cells: Sequence[CellSpec]) -> list[PluginSpec]:
    """The plugins whose policies ``cells`` run (what their workers import). Raises :class:`PluginError` when a
    cell's policy is registered by no plugin loaded here, or its plugin's code is not the code the cell was
    identified with (it would compute the cell with other code under the same id)."""
    from kdeval.cluster import catalog

    known = set(catalog.policy_names())
    missing = sorted({c.policy for c in cells if c.policy not in known})
    if missing:
        raise PluginError(f"run {run_id}: policy {', '.join(repr(m) for m in missing)} is registered by no plugin "
                          "here; give its plugin with --plugin FILE_OR_MODULE (or install its package)")
    names = {n for c in cells for n in catalog.wrapped_policy_names(c.policy, dict(c.policy_params))}
    specs = plugins_for(sorted(names))
    metrics = {m for m in (metric_plugin(str(c.task.params.get("metric", ""))) for c in cells) if m is not None}
    specs += sorted(metrics, key=lambda m: m.ref)  # a plugin's metric scores on the workers too
    for c in cells:
        if policy_plugin(c.policy) is None:
            continue
        now = cell_code_version(c.policy, dict(c.policy_params), c.model.id.startswith("stub:"))
        if now != c.kdeval_version:
            raise PluginError(f"run {run_id}: policy '{c.policy}' ({policy_plugin(c.policy).spec.origin}) "
                              "changed since the run was submitted; submit the grid again (its unchanged cells "
                              "are reused, the changed ones computed anew)")
    return specs


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


def _wait_for_driver(index: RunIndex, run_id: str, on_wait: Callable[[str], None] | None, poll_s: float):
    """Wait until run ``run_id``'s live driver is gone (finished or dead); returns the run then."""
    run = index.get_run(run_id)
    say = on_wait or log.warning
    say(f"{describe_driver(run)} is running this run: waiting for it to finish (--no-wait: do not wait)")
    while driver_alive(run):
        time.sleep(poll_s)
        run = index.get_run(run_id)
    return run


def _busy_cells(index: RunIndex, run_id: str) -> set[str]:
    """Cells held by other runs whose drivers are alive (their temp files may be being written)."""
    holders = index.cell_holders(None)
    alive: dict[str, bool] = {}
    for rid in set(holders.values()) - {run_id}:
        view = index.get_run(rid)
        alive[rid] = view is not None and driver_alive(view)
    return {cid for cid, rid in holders.items() if alive.get(rid)}


def _busy(run: RunView) -> RunBusyError:
    return RunBusyError(f"run {run.id} is still being run by pid {run.driver_pid} on {run.driver_host} "
                        f"(heartbeat {age_seconds(run.heartbeat_at):.0f}s ago); `kdeval cancel {run.id}` first, "
                        "or wait for it")


def _take_run(index: RunIndex, run: RunView, *, wait: bool, on_wait: Callable[[str], None] | None) -> RunView:
    """Become the run's driver: a live driver of it is waited for (or refused: :class:`RunBusyError`), and
    taking it is atomic (``RunIndex.start_driver(expect=...)``), so two resumes never both run it."""
    host, pid = socket.gethostname(), os.getpid()
    while True:
        if driver_alive(run):
            if not wait:
                raise _busy(run)
            run = _wait_for_driver(index, run.id, on_wait, poll_s=1.0)
        if index.start_driver(run.id, host, pid, expect=(run.driver_host, run.driver_pid)):
            return index.get_run(run.id)
        run = index.get_run(run.id)  # another driver took it in between: look again


def _todo(index: RunIndex, run_id: str) -> list[CellSpec]:
    """The run's cells that are not done, or done with a result file that fails its check (logged)."""
    todo = []
    for v in index.run_cells(run_id):
        problem = result_problem(v)
        if problem is None:
            continue
        if v.state == CellState.DONE.value:
            log.warning("cell %s is done but its result file is not usable (%s): recomputing it", v.id, problem)
        todo.append(_stored_spec(v, run_id))
    return todo


def _not_started(index: RunIndex, run_id: str, why: str) -> None:
    """Mark a run this process could not start failed, saying why (unless another driver took it meanwhile):
    a run whose driver never reached its cluster must not read ``pending`` for good."""
    run = index.get_run(run_id)
    if run is not None and not driver_alive(run):
        index.set_run_state(run_id, RunState.FAILED, f"not started: {why}; `kdeval resume {run_id}` runs it")


def execute_run(
    index: RunIndex, run_id: str, *, address: str | None = None, workload: Workload | None = None,
    on_progress: Callable[[RunProgress], None] | None = None, num_cpus: int | None = None,
    wait: bool = True, on_wait: Callable[[str], None] | None = None, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    **config_overrides,
) -> RunOutcome:
    """Run (or resume) every cell of ``run_id`` not yet done; returns what happened.

    ``wait``: when the run's driver is alive elsewhere, wait for it to finish and then run what is left
    (``on_wait`` gets the message saying so), and wait for cells other live drivers hold; ``False``: raise
    :class:`RunBusyError` instead, and leave such cells (the outcome's message names the runs holding them).
    ``connect_timeout_s``: how long joining the cluster at ``address`` may take; a driver that cannot join it
    marks the run failed with the reason (one line) and raises ``ConnectionError``.
    """
    from kdeval.cluster.plugin_env import check_nodes, shipped_modules, upload_modules
    from kdeval.cluster.raysetup import connect
    from kdeval.jobs.run.run_config import RunOutcome
    from kdeval.jobs.run.scheduler import Scheduler

    run = index.get_run(run_id)
    if run is None:
        raise LookupError(f"no run '{run_id}'")
    run_id = run.id
    if driver_alive(run):
        if not wait:
            raise _busy(run)
        run = _wait_for_driver(index, run_id, on_wait, poll_s=1.0)
    try:
        grid = parse_grid(run.grid_yaml, f"run {run_id}")
    except GridError:
        raise StaleRunError(f"run {run_id}: its grid is no longer valid for this kdeval; fix the grid and "
                            "submit it again") from None
    nothing = RunOutcome(done=0, failed=0, left=0, attempts=0, model_loads=0, workers_lost=0, cancelled=False)
    # cells never started whose checked files are in the results directory (a rebuild killed midway, a copy)
    # are adopted, not recomputed
    never = [_stored_spec(v, run_id) for v in index.run_cells(run_id, states=[CellState.PENDING]) if not v.n_attempts]
    recovery.adopt_cells(index, run_id, run.results_dir, never, default_workload)
    # read the result files once: cells another driver finishes meanwhile are skipped when the scheduler takes them
    todo = _todo(index, run_id)
    if not todo:  # nothing to run: no Ray
        if run.state != RunState.DONE.value:  # a run already done (e.g. by the driver waited for) keeps its record
            _take_run(index, run, wait=wait, on_wait=on_wait)
            index.set_run_state(run_id, RunState.DONE)
        return nothing
    specs = run_plugins(run_id, todo) if workload is None else []
    try:  # before the run is marked running: a bad address changes no cell
        connect(address, num_cpus=num_cpus, timeout_s=connect_timeout_s)
    except ConnectionError as e:
        _not_started(index, run_id, str(e))
        raise
    try:  # an installed plugin every node must import (a shipped one reaches them with each worker)
        check_nodes(specs)
    except PluginError as e:
        _not_started(index, run_id, str(e))
        raise
    run = _take_run(index, run, wait=wait, on_wait=on_wait)
    # this process is the run's driver now: what its previous (dead) driver left running is lost
    index.recover_orphans(run_id)
    clean_temp_files(run.results_dir, skip_cells=_busy_cells(index, run_id))
    index.reset_cells([c.id for c in todo], [CellState.FAILED, CellState.DONE, CellState.RUNNING])
    config_overrides.setdefault("wait_for_held", wait)
    config = scheduler_config(grid, **config_overrides)
    if shipped_modules(specs):  # plugin files and folders go with every worker (Ray's runtime environment)
        config = dataclasses.replace(config, resources=dataclasses.replace(
            config.resources, py_modules=upload_modules(shipped_modules(specs))))
    sched = Scheduler(index, run_id, todo, workload or default_workload(specs), run.results_dir, config,
                      on_progress)
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
