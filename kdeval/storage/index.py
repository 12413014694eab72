"""The run index: one object to read (CLI, reports) and — from the driver only — write runs, cells, attempts.

Reading::

    idx = RunIndex.open("results/index.sqlite")      # or a SQLAlchemy URL
    for run in idx.list_runs(): ...                  # RunView, newest first
    cells = idx.run_cells(run.id)                    # CellView, grid order
    table = idx.read_cell_table(cells[0].id)         # pyarrow.Table of per-sample rows

Every write is its own short transaction, so SQLite readers in WAL mode never see half a change. Several
drivers may write one index at once: each write transaction takes SQLite's write lock before it reads
(:meth:`RunIndex._write`), and a cell is computed by the one driver holding it (:mod:`kdeval.storage.leases`).
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import pyarrow as pa
from sqlalchemy import false, func, select, update
from sqlalchemy.orm import Session

from kdeval.storage.db import make_engine, make_session_factory, sqlite_path
from kdeval.storage.tables import (
    TERMINAL_RUN_STATES, Attempt, AttemptState, Cell, CellState, Run, RunCell, RunState, as_utc, utcnow,
)
from kdeval.storage.leases import ShardLeases, _chunks
from kdeval.storage.parquet import read_cell_table
from kdeval.storage.sqlite_lock import sqlite_problem
from kdeval.storage.views import AttemptView, CellRecord, CellView, RunView


class RunIndex(ShardLeases):
    """Access to the index database (see :mod:`kdeval.storage.tables` for the schema; leases and shards:
    :mod:`kdeval.storage.leases`)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._sessions = make_session_factory(engine)

    @classmethod
    def open(cls, db: str | Path | None = None, *, write: bool = True,
             on_wait: Callable[[str], None] | None = None) -> "RunIndex":
        """Open (creating tables if needed) the index at ``db``: a path, a URL, or None for the default.

        ``write=False`` for readers: a SQLite file this process cannot write is opened read-only. Raises
        :class:`kdeval.storage.db.IndexAccessError` (a ``ValueError``) when ``db`` is not a usable index, and
        :class:`kdeval.storage.sqlite_lock.IndexLockedError` when a writer waited the busy timeout for a lock
        another process holds (``on_wait`` gets a line when the wait begins)."""
        return cls(make_engine(db, write=write, on_wait=on_wait))

    def storage_problem(self) -> str | None:
        """Why this index cannot be trusted now, for a SQLite file
        (:func:`~kdeval.storage.sqlite_lock.sqlite_problem`: gone, emptied, corrupt), as a line naming it;
        None when intact (and for server databases)."""
        path = sqlite_path(str(self.engine.url))
        read_only = path is not None and str(path).startswith("file:")  # a reader's mode=ro URI: no writes
        why = sqlite_problem(path) if path is not None and not read_only else None
        return None if why is None else f"the index at {path} was lost or damaged: {why}"

    def session(self) -> Session:
        """A new ORM session (use as a context manager)."""
        return self._sessions()

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A write transaction. On SQLite it takes the write lock first (a no-op UPDATE), waiting for other
        writers up to the busy timeout: a transaction that read first and wrote next would fail at once when
        another driver wrote in between (WAL's stale snapshot), whatever the timeout."""
        with self.session() as s, s.begin():
            if self.engine.dialect.name == "sqlite":
                s.execute(update(Run).where(false()).values(state=Run.state))
            yield s

    # ------------------------------------------------------------------ reading
    def _counts(self, s: Session, run_id: str | None = None) -> dict[str, dict[str, int]]:
        """Per-state cell counts of one run, or of every run when ``run_id`` is None: {run: {state: n}}."""
        q = (
            select(RunCell.run_id, Cell.state, func.count())
            .join(Cell, RunCell.cell_id == Cell.id)
            .group_by(RunCell.run_id, Cell.state)
        )
        if run_id is not None:
            q = q.where(RunCell.run_id == run_id)
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for rid, state, n in s.execute(q).all():
            out[rid][state] = n
        return out

    def list_runs(self) -> list[RunView]:
        """All runs, newest first, with per-state cell counts."""
        with self.session() as s:
            runs = s.scalars(select(Run).order_by(Run.created_at.desc())).all()
            counts = self._counts(s)  # one grouped query for every run, not one per run
            return [RunView.of(r, counts.get(r.id, {})) for r in runs]

    def runs_of_grid(self, grid_hash: str) -> list[tuple[str, str]]:
        """(run id, state) of every run of one grid, newest first."""
        with self.session() as s:
            q = select(Run.id, Run.state).where(Run.grid_hash == grid_hash).order_by(Run.created_at.desc())
            return [(rid, st) for rid, st in s.execute(q).all()]

    @staticmethod
    def _resolve(s: Session, ref: str) -> Run | None:
        """The run with id ``ref``, else the only run whose id starts with ``ref``, else None."""
        run = s.get(Run, ref)
        if run is not None:
            return run
        runs = s.scalars(select(Run).where(Run.id.startswith(ref, autoescape=True)).limit(2)).all()
        return runs[0] if len(runs) == 1 else None

    def resolve_run_id(self, ref: str) -> str | None:
        """A full run id from an id or a unique prefix of one; None when none or ambiguous."""
        with self.session() as s:
            run = self._resolve(s, ref)
            return None if run is None else run.id

    def get_run(self, run_id: str) -> RunView | None:
        """One run (by id or unique prefix), or None."""
        with self.session() as s:
            run = self._resolve(s, run_id)
            return None if run is None else RunView.of(run, self._counts(s, run.id).get(run.id, {}))

    def run_cells(self, run_id: str, states: Iterable[str] | None = None) -> list[CellView]:
        """The cells of a run in grid order, optionally only those in ``states``."""
        q = (
            select(Cell).join(RunCell, RunCell.cell_id == Cell.id)
            .where(RunCell.run_id == run_id).order_by(RunCell.position)
        )
        if states is not None:
            q = q.where(Cell.state.in_([str(getattr(x, "value", x)) for x in states]))
        with self.session() as s:
            return [CellView.of(c) for c in s.scalars(q).all()]

    def get_cell(self, cell_id: str) -> CellView | None:
        """One cell by id, or None."""
        with self.session() as s:
            c = s.get(Cell, cell_id)
            return CellView.of(c) if c is not None else None

    def cell_attempts(self, cell_id: str) -> list[AttemptView]:
        """Every attempt at a cell, oldest first."""
        with self.session() as s:
            rows = s.scalars(select(Attempt).where(Attempt.cell_id == cell_id).order_by(Attempt.id))
            return [AttemptView.of(a) for a in rows.all()]

    def run_attempts(self, run_id: str) -> list[AttemptView]:
        """Every attempt made by a run, oldest first."""
        with self.session() as s:
            rows = s.scalars(select(Attempt).where(Attempt.run_id == run_id).order_by(Attempt.id))
            return [AttemptView.of(a) for a in rows.all()]

    def get_cells(self, cell_ids: Sequence[str], states: Iterable[str] | None = None) -> dict[str, CellView]:
        """The known cells among ``cell_ids`` by id (unknown ids are absent), optionally only those in
        ``states``; one query per 500 ids."""
        wanted = None if states is None else [str(getattr(x, "value", x)) for x in states]
        out: dict[str, CellView] = {}
        with self.session() as s:
            for chunk in _chunks(cell_ids):
                q = select(Cell).where(Cell.id.in_(chunk))
                if wanted is not None:
                    q = q.where(Cell.state.in_(wanted))
                out.update({c.id: CellView.of(c) for c in s.scalars(q).all()})
        return out

    @staticmethod
    def _cell_states(s: Session, cell_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for chunk in _chunks(cell_ids):
            q = select(Cell.id, Cell.state).where(Cell.id.in_(chunk))
            out.update({cid: st for cid, st in s.execute(q).all()})
        return out

    def read_cell_table(self, cell_id: str) -> pa.Table:
        """A done cell's per-sample rows as a pyarrow Table (raises ``LookupError`` if not done)."""
        cell = self.get_cell(cell_id)
        if cell is None or cell.state != CellState.DONE.value or not cell.result_path:
            raise LookupError(f"cell {cell_id} has no stored results")
        return read_cell_table(cell.results_dir, cell.result_path)

    def read_cell_rows(self, cell_id: str) -> list[dict[str, Any]]:
        """A done cell's per-sample rows as a list of dicts."""
        return self.read_cell_table(cell_id).to_pylist()

    # ------------------------------------------------------------------ writing (driver only)
    def create_run(
        self, run_id: str, *, name: str, grid_yaml: str, grid_hash: str, results_dir: str,
        kdeval_version: str, cells: Sequence[CellRecord], created_at: datetime | None = None,
        message: str | None = None,
    ) -> None:
        """Create a run and link its cells, inserting the cells not yet known (others are reused).
        ``created_at``: when the run was created, if not now (an index rebuilt from the results); ``message``:
        the run's message from the start (in the same transaction)."""
        with self._write() as s:
            s.add(Run(id=run_id, name=name, grid_yaml=grid_yaml, grid_hash=grid_hash,
                      results_dir=results_dir, kdeval_version=kdeval_version, n_cells=len(cells),
                      state=RunState.PENDING.value, created_at=created_at or utcnow(), message=message))
            known = set(self._cell_states(s, [c.id for c in cells]))
            for pos, c in enumerate(cells):
                if c.id not in known:
                    s.add(Cell(id=c.id, spec=c.spec, model=c.model, policy=c.policy, budget=c.budget,
                               budget_share=c.budget_share,
                               chunk_size=c.chunk_size, task=c.task, state=CellState.PENDING.value))
                    known.add(c.id)
                s.add(RunCell(run_id=run_id, cell_id=c.id, position=pos))

    def set_run_state(self, run_id: str, state: RunState, message: str | None = None) -> None:
        """Set a run's state (``finished_at`` for terminal states)."""
        values: dict[str, Any] = {"state": state.value}
        if message is not None:
            values["message"] = message
        if state.value in TERMINAL_RUN_STATES:
            values["finished_at"] = utcnow()
        with self._write() as s:
            s.execute(update(Run).where(Run.id == run_id).values(**values))

    def start_driver(self, run_id: str, host: str, pid: int,
                     expect: tuple[str | None, int | None] | None = None) -> bool:
        """Mark a run running under this driver. With ``expect`` (the ``(driver_host, driver_pid)`` the caller
        saw, and judged not alive), only if the run still records that driver: False when another driver
        took the run in between (nothing written). Returns True when this driver now runs it."""
        now = utcnow()
        where = [Run.id == run_id]
        if expect is not None:
            host_seen, pid_seen = expect
            where.append(Run.driver_host.is_(None) if host_seen is None else Run.driver_host == host_seen)
            where.append(Run.driver_pid.is_(None) if pid_seen is None else Run.driver_pid == pid_seen)
        with self._write() as s:
            n = s.execute(update(Run).where(*where).values(
                state=RunState.RUNNING.value, started_at=now, heartbeat_at=now,
                driver_host=host, driver_pid=pid, finished_at=None, message=None)).rowcount
        return bool(n)

    def record_launch(self, run_id: str, host: str, pid: int) -> bool:
        """Record the process started to drive a run that is still pending (``submit --detach``), so that
        ``status`` can tell a driver that died before it took the run; False when the run is no longer pending
        (the driver took it, or gave up, already)."""
        with self._write() as s:
            n = s.execute(update(Run).where(Run.id == run_id, Run.state == RunState.PENDING.value).values(
                driver_host=host, driver_pid=pid)).rowcount
        return bool(n)

    def heartbeat(self, run_id: str) -> str:
        """Record that the driver is alive; returns the run's current state (to notice a cancel)."""
        with self._write() as s:
            s.execute(update(Run).where(Run.id == run_id).values(heartbeat_at=utcnow()))
            return s.scalar(select(Run.state).where(Run.id == run_id))

    def recover_orphans(self, run_id: str) -> int:
        """After this run's driver died (call only when it is not alive): the run's own running attempts
        become lost and the cells it held are given back (running ones pending again); so do running cells of
        the run that nobody holds and no attempt runs (left by older kdeval). Attempts and cells of other
        runs' drivers are untouched. Returns how many attempts became lost."""
        with self._write() as s:
            ids = select(RunCell.cell_id).where(RunCell.run_id == run_id)
            n = s.execute(update(Attempt).where(
                Attempt.run_id == run_id, Attempt.state == AttemptState.RUNNING.value,
            ).values(state=AttemptState.LOST.value, finished_at=utcnow(),
                     error="driver died while the attempt was running")).rowcount
            s.execute(update(Cell).where(
                Cell.held_by == run_id, Cell.state == CellState.RUNNING.value,
            ).values(state=CellState.PENDING.value))
            s.execute(update(Cell).where(Cell.held_by == run_id).values(held_by=None))
            running = select(Attempt.cell_id).where(Attempt.state == AttemptState.RUNNING.value)
            s.execute(update(Cell).where(
                Cell.id.in_(ids), Cell.held_by.is_(None), Cell.state == CellState.RUNNING.value,
                Cell.id.not_in(running),
            ).values(state=CellState.PENDING.value))
        return int(n or 0)

    def start_attempt(self, run_id: str, cell_id: str, worker: str | None, node: str | None,
                      shard: int | None = None) -> int:
        """Record a new attempt at a cell's ``shard`` (None: the whole cell); the cell becomes running. Its
        number counts the attempts at that shard; the cell's ``n_attempts`` is the most any shard took.
        Returns the attempt id."""
        now = utcnow()
        with self._write() as s:
            cell = s.get(Cell, cell_id)
            same = Attempt.shard.is_(None) if shard is None else Attempt.shard == shard
            number = 1 + s.scalar(select(func.count()).select_from(Attempt).where(Attempt.cell_id == cell_id, same))
            cell.n_attempts = max(cell.n_attempts or 0, number)
            if cell.state != CellState.RUNNING.value:  # other shards may be running: the cell started then
                cell.started_at = now
            cell.state = CellState.RUNNING.value
            cell.worker, cell.node = worker, node
            cell.error = None
            att = Attempt(cell_id=cell_id, run_id=run_id, number=number, shard=shard, worker=worker,
                          node=node, started_at=now, state=AttemptState.RUNNING.value)
            s.add(att)
            s.flush()
            return att.id

    def finish_attempt_done(
        self, attempt_id: int, *, results_dir: str, result_path: str, n_rows: int,
        summary: dict[str, Any], duration_s: float, peak_memory_bytes: int | None,
        worker: str | None, node: str | None, provenance: dict[str, Any] | None = None,
    ) -> None:
        """Mark an attempt and its cell done (call only after the Parquet file is in place); ``provenance``
        is how the result was computed (versions, device, host)."""
        now = utcnow()
        with self._write() as s:
            att = s.get(Attempt, attempt_id)
            att.state, att.finished_at, att.duration_s = AttemptState.DONE.value, now, duration_s
            att.peak_memory_bytes, att.worker, att.node = peak_memory_bytes, worker, node
            cell = s.get(Cell, att.cell_id)
            cell.state, cell.finished_at, cell.duration_s = CellState.DONE.value, now, duration_s
            cell.results_dir, cell.result_path, cell.n_rows = results_dir, result_path, n_rows
            cell.summary, cell.peak_memory_bytes = summary, peak_memory_bytes
            cell.worker, cell.node, cell.error = worker, node, None
            cell.provenance, cell.held_by = provenance, None

    def finish_attempt_failed(
        self, attempt_id: int, *, state: AttemptState, error: str, final: bool,
        duration_s: float | None = None, peak_memory_bytes: int | None = None,
        worker: str | None = None, node: str | None = None,
    ) -> None:
        """Record a failed/lost/timed-out attempt. ``final``: the cell becomes failed (and is given back by
        the attempt's run). Else the cell becomes pending once no attempt at it runs (other shards may), unless
        another run holds it; a failed or done cell stays so. An attempt already ended (lost when another
        driver took its cell over) keeps its record."""
        now = utcnow()
        with self._write() as s:
            att = s.get(Attempt, attempt_id)
            if att.state != AttemptState.RUNNING.value:
                return
            att.state, att.finished_at, att.error = state.value, now, error
            att.duration_s, att.peak_memory_bytes = duration_s, peak_memory_bytes
            if worker is not None:
                att.worker, att.node = worker, node
            cell = s.get(Cell, att.cell_id)
            if final:
                cell.state, cell.error, cell.finished_at = CellState.FAILED.value, error, now
                if cell.held_by == att.run_id:
                    cell.held_by = None
            elif cell.state == CellState.RUNNING.value and cell.held_by in (None, att.run_id):
                cell.error = error
                running = s.scalar(select(func.count()).select_from(Attempt).where(
                    Attempt.cell_id == att.cell_id, Attempt.state == AttemptState.RUNNING.value))
                if not running:
                    cell.state = CellState.PENDING.value

    def reset_cells(self, cell_ids: Sequence[str], from_states: Iterable[CellState]) -> int:
        """Put cells in ``from_states`` back to pending (resume retries failed cells); cells a driver holds
        are left to it."""
        states = [x.value for x in from_states]
        n = 0
        with self._write() as s:
            for chunk in _chunks(cell_ids):
                n += s.execute(update(Cell).where(
                    Cell.id.in_(chunk), Cell.state.in_(states), Cell.held_by.is_(None),
                ).values(state=CellState.PENDING.value)).rowcount or 0
        return int(n)

    def set_cell_summary(self, cell_id: str, summary: dict[str, Any]) -> None:
        """Replace a cell's summary scores (``kdeval rescore``)."""
        with self._write() as s:
            s.execute(update(Cell).where(Cell.id == cell_id).values(summary=summary))


def age_seconds(ts: datetime | None) -> float | None:
    """Seconds since a timestamp of the index (aware; a naive one is taken to be UTC)."""
    if ts is None:
        return None
    return (utcnow() - as_utc(ts)).total_seconds()
