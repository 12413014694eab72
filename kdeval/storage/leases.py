"""Leases (one driver per cell) and sample shards, as methods of :class:`kdeval.storage.index.RunIndex`.

A cell is computed by the one driver holding it: ``cells.held_by`` names that driver's run. A driver takes a
cell with :meth:`ShardLeases.claim_cell` (an atomic conditional UPDATE: two drivers never both get it) and
gives it back when the cell is done or failed, or when it stops (:meth:`ShardLeases.release_cells`). Whether
a holder's driver is alive is the jobs layer's call (heartbeat, pid): it passes the runs whose drivers are
dead as ``takeover``; their running attempts at the cell become ``lost``. Attempts of live drivers are never
touched.

A cell's samples are computed in shards (samples ``[i*S, (i+1)*S)``), each stored as one Parquet part and
recorded in ``cell_shards`` when done (:meth:`ShardLeases.finish_shard`, only while the run holds the cell);
when all are, :meth:`ShardLeases.finish_cell` marks the cell done with the directory of its parts.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import Any, Collection, Iterator, Sequence

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from kdeval.storage.tables import Attempt, AttemptState, Cell, CellShard, CellState, utcnow


def _chunks(ids: Sequence[str], size: int = 500) -> Iterator[list[str]]:
    """``ids`` in lists of at most ``size`` (keeps ``IN (...)`` under SQLite's variable limit)."""
    ids = list(ids)
    for i in range(0, len(ids), size):
        yield ids[i:i + size]


@dataclass(frozen=True)
class ShardView:
    """One done shard of a cell: samples ``[start, stop)`` of its plan of ``shard_size``, in one part."""

    cell_id: str
    shard: int
    shard_size: int
    start: int
    stop: int
    n_rows: int
    results_dir: str
    result_path: str
    run_id: str
    attempt_id: int | None
    worker: str | None
    node: str | None
    duration_s: float | None
    peak_memory_bytes: int | None
    provenance: dict[str, Any] | None

    @classmethod
    def of(cls, row: CellShard) -> "ShardView":
        return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})


class ShardLeases:
    """Lease and shard methods of the run index (mixed into ``RunIndex``, which provides ``_write`` and
    ``session``)."""

    def _write(self) -> AbstractContextManager[Session]:  # provided by RunIndex
        raise NotImplementedError

    def session(self) -> Session:  # provided by RunIndex
        raise NotImplementedError

    # ------------------------------------------------------------------ leases
    def claim_cell(self, cell_id: str, run_id: str, takeover: Collection[str] = ()) -> str | None:
        """Make ``run_id``'s driver the cell's holder; None when it is (it was already, nobody was, or the
        holder is one of ``takeover``: runs whose drivers are dead, whose running attempts at the cell become
        lost), else the id of the run holding it. A done cell can be claimed (to recompute a bad file);
        LookupError for an unknown cell."""
        takeover = [r for r in takeover if r != run_id]
        with self._write() as s:
            free = or_(Cell.held_by.is_(None), Cell.held_by == run_id)
            if takeover:
                free = or_(free, Cell.held_by.in_(takeover))
            n = s.execute(update(Cell).where(Cell.id == cell_id, free).values(held_by=run_id)).rowcount
            if not n:
                holder = s.scalar(select(Cell.held_by).where(Cell.id == cell_id))
                if holder is None:
                    raise LookupError(f"no cell {cell_id}")
                return holder
            if takeover:
                s.execute(update(Attempt).where(
                    Attempt.cell_id == cell_id, Attempt.run_id.in_(takeover),
                    Attempt.state == AttemptState.RUNNING.value,
                ).values(state=AttemptState.LOST.value, finished_at=utcnow(),
                         error=f"the driver of run {takeover[0]} died while the attempt was running"))
            return None

    def holds(self, cell_id: str, run_id: str) -> bool:
        """Whether ``run_id``'s driver holds the cell."""
        with self.session() as s:
            return s.scalar(select(Cell.held_by).where(Cell.id == cell_id)) == run_id

    def cell_holders(self, cell_ids: Sequence[str] | None = None) -> dict[str, str]:
        """The holder run of each held cell among ``cell_ids`` (None: of every held cell); cells nobody holds
        are absent."""
        held = select(Cell.id, Cell.held_by).where(Cell.held_by.is_not(None))
        with self.session() as s:
            if cell_ids is None:
                return {cid: holder for cid, holder in s.execute(held).all()}
            out = {}
            for chunk in _chunks(cell_ids):
                out.update({cid: holder for cid, holder in s.execute(held.where(Cell.id.in_(chunk))).all()})
            return out

    def release_cells(self, run_id: str, cell_ids: Sequence[str] | None = None) -> int:
        """Give back the cells ``run_id`` holds (all, or those in ``cell_ids``): running ones become pending
        (no running attempt may be left: end them first). Returns how many were released."""
        with self._write() as s:
            where = [Cell.held_by == run_id]
            if cell_ids is not None:
                where.append(Cell.id.in_(list(cell_ids)))
            s.execute(update(Cell).where(*where, Cell.state == CellState.RUNNING.value)
                      .values(state=CellState.PENDING.value))
            n = s.execute(update(Cell).where(*where).values(held_by=None)).rowcount
        return int(n or 0)

    # ------------------------------------------------------------------ shards
    def cell_shards(self, cell_id: str) -> list[ShardView]:
        """The done shards recorded for a cell, in shard order."""
        with self.session() as s:
            rows = s.scalars(select(CellShard).where(CellShard.cell_id == cell_id).order_by(CellShard.shard))
            return [ShardView.of(r) for r in rows.all()]

    def drop_shards(self, cell_id: str, keep: Collection[int] = ()) -> int:
        """Forget the cell's done shards not in ``keep`` (a recomputation that cannot reuse them)."""
        with self._write() as s:
            q = delete(CellShard).where(CellShard.cell_id == cell_id)
            if keep:
                q = q.where(CellShard.shard.not_in(list(keep)))
            return int(s.execute(q).rowcount or 0)

    def finish_shard(
        self, attempt_id: int, *, shard_size: int, start: int, stop: int, results_dir: str, result_path: str,
        n_rows: int, duration_s: float, peak_memory_bytes: int | None, worker: str | None, node: str | None,
        provenance: dict[str, Any] | None = None,
    ) -> bool:
        """Mark an attempt at one shard done and record the shard (call after its part is in place). Only
        while the attempt's run holds the cell: False (nothing written) when it no longer does."""
        with self._write() as s:
            att = s.get(Attempt, attempt_id)
            cell = s.get(Cell, att.cell_id)
            if cell.held_by != att.run_id:
                return False
            att.state, att.finished_at, att.duration_s = AttemptState.DONE.value, utcnow(), duration_s
            att.peak_memory_bytes, att.worker, att.node = peak_memory_bytes, worker, node
            s.merge(CellShard(
                cell_id=att.cell_id, shard=att.shard or 0, shard_size=shard_size, start=start, stop=stop,
                n_rows=n_rows, results_dir=results_dir, result_path=result_path, run_id=att.run_id,
                attempt_id=att.id, worker=worker, node=node, duration_s=duration_s,
                peak_memory_bytes=peak_memory_bytes, provenance=provenance))
            return True

    def finish_cell(
        self, cell_id: str, run_id: str, *, results_dir: str, result_path: str, n_rows: int,
        summary: dict[str, Any], duration_s: float | None, peak_memory_bytes: int | None, worker: str | None,
        node: str | None, provenance: dict[str, Any] | None = None,
    ) -> bool:
        """Mark a cell whose shards are all done done (its parts checked), and give it back. Only while
        ``run_id`` holds it: False (nothing written) when it does not."""
        with self._write() as s:
            cell = s.get(Cell, cell_id)
            if cell is None or cell.held_by != run_id:
                return False
            cell.state, cell.finished_at, cell.duration_s = CellState.DONE.value, utcnow(), duration_s
            cell.results_dir, cell.result_path, cell.n_rows = results_dir, result_path, n_rows
            cell.summary, cell.peak_memory_bytes = summary, peak_memory_bytes
            cell.worker, cell.node, cell.error = worker, node, None
            cell.provenance, cell.held_by = provenance, None
            return True

    def fail_cell(self, cell_id: str, run_id: str, error: str) -> bool:
        """Mark a cell ``run_id`` holds failed with ``error`` (e.g. its rows could not be aggregated) and give
        it back; False when ``run_id`` does not hold it."""
        with self._write() as s:
            cell = s.get(Cell, cell_id)
            if cell is None or cell.held_by != run_id:
                return False
            cell.state, cell.error, cell.finished_at, cell.held_by = CellState.FAILED.value, error, utcnow(), None
            return True
