"""SQLAlchemy 2 models of the run index: runs, cells, the run↔cell link and attempts.

Schema (one SQL database, SQLite by default):

* ``runs`` — one row per ``kdeval submit``: the grid text, its state, when it ran and which driver.
* ``cells`` — one row per *distinct* cell, keyed by its content hash (``cells.id``). A cell is shared by
  every run whose grid contains it, so a resubmitted grid finds its done cells here and runs none of them.
  It carries the latest outcome: state, timings, worker/node, peak memory, summary scores (JSON), error,
  the Parquet file holding its per-sample rows (``result_path``, relative to the results directory) and the
  provenance of that result (``provenance``: code, library and CUDA versions, device, dtype, host; JSON).
  While a driver computes it, ``held_by`` names that driver's run (a lease: one driver per cell).
* ``run_cells`` — which cells a run contains, in grid order.
* ``attempts`` — every execution attempt of a cell's sample shard (``shard``; also the lost ones, when a
  worker or node died), with its own state, worker, node, timings and error.
* ``cell_shards`` — the done sample shards of cells being computed (one Parquet part each), so a killed
  worker or driver loses at most the shards it was running.

Only drivers (scheduler processes) write; readers (``kdeval status``, reports) only read. Several drivers may
share one index: a cell is computed by the one driver holding it.
"""
from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """Timezone-aware current UTC time: what every timestamp of the index is."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime | None) -> datetime | None:
    """``value`` as an aware UTC datetime; a naive one is taken to be UTC (what SQLite hands back)."""
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


class UTCDateTime(TypeDecorator):
    """A point in time, the same in every backend and whatever the server's or the session's time zone.

    The column is ``DateTime(timezone=True)`` (PostgreSQL: ``timestamptz``, an absolute instant). Values
    are written and read as aware UTC datetimes. Backends without a time-zone-aware type (SQLite, MySQL)
    are handed naive UTC, since their drivers would drop or reinterpret an offset, and what they return is
    tagged UTC on the way out."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        value = as_utc(value)
        if value is not None and dialect.name != "postgresql":
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return as_utc(value)


class RunState(str, enum.Enum):
    """Lifecycle of a run."""

    PENDING = "pending"  # created, no driver yet (or --dry-run never starts one)
    RUNNING = "running"  # a driver is scheduling its cells
    DONE = "done"  # every cell done
    FAILED = "failed"  # finished, some cells failed
    CANCELLED = "cancelled"  # ``kdeval cancel``: the driver stops dispatching and exits


#: Run states a run ends in (``RunState`` values): its driver is gone and ``finished_at`` is set.
TERMINAL_RUN_STATES = frozenset({RunState.DONE.value, RunState.FAILED.value, RunState.CANCELLED.value})


class CellState(str, enum.Enum):
    """Lifecycle of a cell (shared by all runs that contain it)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class AttemptState(str, enum.Enum):
    """Outcome of one attempt at a cell."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # the cell's own code raised (error text recorded)
    LOST = "lost"  # the worker, its node or the driver died; the cell was requeued
    TIMEOUT = "timeout"  # exceeded the grid's per-cell time limit; the worker was replaced


class Base(DeclarativeBase):
    """Declarative base of the index schema."""


class Run(Base):
    """One submitted grid."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), default=RunState.PENDING.value)
    grid_yaml: Mapped[str] = mapped_column(Text)
    grid_hash: Mapped[str] = mapped_column(String(64))
    results_dir: Mapped[str] = mapped_column(Text)
    kdeval_version: Mapped[str] = mapped_column(String(32))
    n_cells: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    driver_host: Mapped[str | None] = mapped_column(String(200), nullable=True)
    driver_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class Cell(Base):
    """One distinct cell (model × policy × budget × chunk × task), keyed by its content hash."""

    __tablename__ = "cells"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[dict] = mapped_column(JSON)  # the full cell spec, enough to rerun it
    model: Mapped[str] = mapped_column(String(300))
    policy: Mapped[str] = mapped_column(String(100))
    budget: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None for ``full``
    chunk_size: Mapped[int] = mapped_column(Integer)  # B; 0 for "whole" (one chunk of all that is compressed)
    task: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), default=CellState.PENDING.value)
    n_attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # metric name -> value
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    results_dir: Mapped[str | None] = mapped_column(Text, nullable=True)  # where its Parquet file lives
    result_path: Mapped[str | None] = mapped_column(Text, nullable=True)  # relative to results_dir
    n_rows: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # where and with what the result was computed (versions, device, host); see kdeval.cluster.provenance.
    # Added after the first schema: older indexes get it on open (kdeval.storage.migrate).
    provenance: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # the run whose driver holds the cell while it is being computed (a lease: no other driver starts it
    # while that driver is alive); None when nobody does. Added with sample shards (older indexes: on open).
    held_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # the share of each prompt kept, in (0, 1], when the budget is one ("25%": 0.25; ``budget`` is then None).
    # Added with share budgets (older indexes: on open).
    budget_share: Mapped[float | None] = mapped_column(Float, nullable=True)


class RunCell(Base):
    """Membership of a cell in a run."""

    __tablename__ = "run_cells"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    cell_id: Mapped[str] = mapped_column(ForeignKey("cells.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer)


class Attempt(Base):
    """One attempt at running a cell."""

    __tablename__ = "attempts"
    __table_args__ = (Index("ix_attempts_cell", "cell_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cell_id: Mapped[str] = mapped_column(ForeignKey("cells.id"))
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"))
    number: Mapped[int] = mapped_column(Integer)  # 1-based, per cell and shard
    # which sample shard of the cell (samples [shard*S, (shard+1)*S)); None: the whole cell (older indexes)
    shard: Mapped[int | None] = mapped_column(Integer, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=AttemptState.RUNNING.value)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class CellShard(Base):
    """A done sample shard of a cell that is being computed: samples ``[start, stop)`` of the cell's samples,
    stored as one Parquet part (``result_path``, relative to ``results_dir``). When every shard of a cell is
    done, the cell is done and its ``result_path`` is the directory of its parts. Only done shards are
    recorded; a recomputation that cannot reuse them deletes them."""

    __tablename__ = "cell_shards"

    cell_id: Mapped[str] = mapped_column(ForeignKey("cells.id"), primary_key=True)
    shard: Mapped[int] = mapped_column(Integer, primary_key=True)
    shard_size: Mapped[int] = mapped_column(Integer)  # S of the cell's shard plan
    start: Mapped[int] = mapped_column(Integer)
    stop: Mapped[int] = mapped_column(Integer)
    n_rows: Mapped[int] = mapped_column(Integer)
    results_dir: Mapped[str] = mapped_column(Text)
    result_path: Mapped[str] = mapped_column(Text)
    run_id: Mapped[str] = mapped_column(String(32))  # the run whose driver stored it
    attempt_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    node: Mapped[str | None] = mapped_column(String(200), nullable=True)
    duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    provenance: Mapped[dict | None] = mapped_column(JSON, nullable=True)
