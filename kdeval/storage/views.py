"""Typed, session-independent snapshots of index rows, returned by :class:`kdeval.storage.index.RunIndex`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from kdeval.storage.tables import Attempt, Cell, Run, as_utc


def to_jsonable(view: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A view as a JSON-able dict (datetimes as ISO-8601 UTC strings with their offset, ``...+00:00``)."""
    out = {}
    for k, v in asdict(view).items():
        if k in drop:
            continue
        out[k] = as_utc(v).isoformat() if isinstance(v, datetime) else v
    return out


def _from_row(cls: type, row: Any, **overrides: Any) -> Any:
    """A view of an ORM row: each field the row's attribute of the same name, unless in ``overrides``."""
    return cls(**{f.name: overrides[f.name] if f.name in overrides else getattr(row, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class CellRecord:
    """What the index needs to insert a new cell: its id, full spec (JSON-able) and query columns."""

    id: str
    spec: dict[str, Any]
    model: str
    policy: str
    budget: int | None  # N; None for ``full`` and for a share of the prompt
    chunk_size: int
    task: str
    budget_share: float | None = None  # the share of each prompt kept, in (0, 1] (a "25%" budget: 0.25)


@dataclass(frozen=True)
class RunView:
    """A run and the count of its cells per state (``{"done": 3, "pending": 1, ...}``)."""

    id: str
    name: str
    state: str
    n_cells: int
    counts: dict[str, int]
    results_dir: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    driver_host: str | None
    driver_pid: int | None
    message: str | None
    grid_yaml: str = field(repr=False, default="")

    @classmethod
    def of(cls, run: Run, counts: dict[str, int]) -> "RunView":
        return _from_row(cls, run, counts=dict(counts))


@dataclass(frozen=True)
class CellView:
    """A cell's identity columns and latest outcome."""

    id: str
    model: str
    policy: str
    budget: int | None
    chunk_size: int
    task: str
    state: str
    n_attempts: int
    worker: str | None
    node: str | None
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None
    peak_memory_bytes: int | None
    summary: dict[str, Any] | None
    error: str | None
    results_dir: str | None
    result_path: str | None
    n_rows: int | None
    spec: dict[str, Any] = field(repr=False, default_factory=dict)
    #: How the stored result was computed (``kdeval.cluster.provenance``); None for cells done by older code.
    provenance: dict[str, Any] | None = field(repr=False, default=None)
    #: The run whose driver holds the cell while computing it (None: nobody; ``kdeval.storage.leases``).
    held_by: str | None = None
    #: The share of each prompt a share-budget cell keeps, in (0, 1] (``budget`` is then None).
    budget_share: float | None = None

    @classmethod
    def of(cls, cell: Cell) -> "CellView":
        return _from_row(cls, cell, summary=dict(cell.summary) if cell.summary else None, spec=dict(cell.spec or {}),
                         provenance=dict(cell.provenance) if cell.provenance else None)

    @property
    def grid_budget(self) -> int | str | None:
        """The budget as the cell's spec holds it: N, a share's text (``"25%"``), or None (``full``)."""
        return self.spec["budget"] if "budget" in self.spec else self.budget

    @property
    def error_line(self) -> str | None:
        """The last non-empty line of the error (the exception message), for tables."""
        if not self.error:
            return None
        lines = [ln for ln in self.error.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else None


@dataclass(frozen=True)
class AttemptView:
    """One attempt at a cell."""

    id: int
    cell_id: str
    run_id: str
    number: int
    state: str
    worker: str | None
    node: str | None
    started_at: datetime
    finished_at: datetime | None
    duration_s: float | None
    peak_memory_bytes: int | None
    error: str | None
    shard: int | None = None  # the cell's sample shard it ran (None: the whole cell, older indexes)

    @classmethod
    def of(cls, a: Attempt) -> "AttemptView":
        return _from_row(cls, a)
