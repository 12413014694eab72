"""Results that outlive their index: each part says what it is, each run has a manifest, so an index can be
rebuilt from a results directory, and a submit adopts a cell whose files are already there.

Every part a driver writes carries, in its Parquet key-value metadata (:data:`PART_KEY`), the cell's full spec
and what the index records of the shard (range, shard size, duration, peak memory, worker, node, provenance);
every run writes ``runs/<run id>.json`` (its record and its cells' records) when it is created. A cell is
recovered when its parts are exactly the shards of one plan (``kdeval.jobs.run.shards.shard_ranges``), their spec
gives the cell's id and they check out as integrity checks them (``kdeval.storage.verify_read_parts``); its
summary is then the workload's ``aggregate`` of its rows, as when it was computed. What the files do not hold
is not recovered: attempts (history, errors, counts), failed cells' errors, when cells finished.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from kdeval.cluster.workload import CellOutcome, Workload
from kdeval.jobs.grid.cells import CellSpec
from kdeval.jobs.run.shards import HeldCell, Shard, ShardDone, shard_ranges
from kdeval.storage import (
    RUNS_DIR, CellRecord, CellState, RunIndex, RunState, cell_dir_relpath, cell_dirs, concat_parts, part_files,
    read_run_manifests, schema_metadata, unreadable, verify_read_parts, write_run_manifest,
)

#: The key of a part's metadata that describes it (JSON; see :func:`part_metadata`).
PART_KEY = "kdeval.part"
#: The key of an imported cell's part that describes it instead (JSON; see :func:`imported_metadata`).
IMPORTED_KEY = "kdeval.imported"
#: What a rebuilt run says it lacks.
NOT_RECOVERED = "attempt history not recovered"
#: How the message of a run being rebuilt starts, until its rebuild ends (a rebuild killed midway leaves it:
#: the next rebuild carries on with that run instead of leaving it pending).
REBUILDING = "rebuilding from"


def part_metadata(shard: Shard, shard_size: int, out: CellOutcome) -> dict[str, str]:
    """What a part says of itself: its cell's spec and the shard's record (written with the part)."""
    return {PART_KEY: json.dumps({
        "cell": shard.cell.model_dump(mode="json"), "shard": shard.index, "start": shard.start, "stop": shard.stop,
        "shard_size": shard_size, "duration_s": out.duration_s, "peak_memory_bytes": out.peak_memory_bytes,
        "worker": out.worker, "node": out.node, "provenance": out.provenance or None,
    }, sort_keys=True)}


def imported_metadata(spec: dict[str, Any], summary: dict[str, Any], provenance: dict[str, Any]) -> dict[str, str]:
    """What the one part of a cell imported from another tool says of itself (its spec, which is not a kdeval
    ``CellSpec``, and what the index records of it), so that ``index rebuild`` makes it done again."""
    return {IMPORTED_KEY: json.dumps({"cell": spec, "summary": summary, "provenance": provenance},
                                     sort_keys=True)}


@dataclass
class Imported:
    """An imported cell whose part checks out: what the index records of it."""

    summary: dict[str, Any]
    provenance: dict[str, Any]
    n_rows: int


def _imported(path: Path, meta: dict[str, str], n_rows: int, table: pa.Table | str, cell_id: str) -> Imported | str:
    """An imported cell's one part, read: what to record, or why it does not make the cell."""
    desc = json.loads(meta[IMPORTED_KEY])
    problem = verify_read_parts([(path, table)], cell_id)
    if problem is not None:
        return problem
    return Imported(summary=desc["summary"], provenance=desc["provenance"], n_rows=n_rows)


def write_manifest(results_dir: str | Path, run_id: str, *, name: str, grid_yaml: str, grid_hash: str,
                   kdeval_version: str, created_at: datetime, cells: list[CellRecord]) -> None:
    """The run's manifest in the results directory (what :func:`rebuild_index` makes its run from)."""
    write_run_manifest(results_dir, run_id, {
        "id": run_id, "name": name, "grid_yaml": grid_yaml, "grid_hash": grid_hash,
        "kdeval_version": kdeval_version, "created_at": created_at.isoformat(),
        "cells": [vars(c) for c in cells],
    })


def remove_manifest(results_dir: str | Path, run_id: str) -> None:
    """Delete a run's manifest (the run could not be recorded after all)."""
    (Path(results_dir) / RUNS_DIR / f"{run_id}.json").unlink(missing_ok=True)


@dataclass
class Recovered:
    """A cell whose parts check out: its spec, its stored shards as the scheduler keeps them, its rows."""

    spec: CellSpec
    held: HeldCell
    rows: list[dict[str, Any]]


class _ImportedPart(Exception):
    """The part read is an imported cell's (:data:`IMPORTED_KEY`): its metadata, row count and rows."""

    def __init__(self, meta: dict[str, str], n_rows: int, table: pa.Table | str) -> None:
        super().__init__("imported")
        self.meta, self.n_rows, self.table = meta, n_rows, table


class _Unreadable(Exception):
    """A part file that Parquet cannot open (truncated, corrupt): not a part of an older kdeval."""


def _read_part(path: Path) -> tuple[dict[str, Any], CellSpec, int, pa.Table | str]:
    """One part, opened once: its description (:data:`PART_KEY`), the cell spec in it, its row count and its
    rows (or why they cannot be read). A file that is not readable Parquet (truncated, corrupt) raises
    :class:`_Unreadable`; a readable one without a description raises (KeyError, ValueError, TypeError)."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as e:
        raise _Unreadable((str(e).strip().splitlines() or [type(e).__name__])[0]) from e
    with pf:
        kv = schema_metadata(pf.schema_arrow)
        if IMPORTED_KEY in kv:
            raise _ImportedPart(kv, pf.metadata.num_rows, _read_all(pf))
        meta = json.loads(kv[PART_KEY])
        spec = CellSpec.model_validate(meta["cell"])
        return meta, spec, pf.metadata.num_rows, _read_all(pf)


def _read_all(pf: pq.ParquetFile) -> pa.Table | str:
    """A part's rows, or why they cannot be read."""
    try:
        return pf.read()
    except (OSError, pa.ArrowException) as exc:
        return unreadable(exc)


def recover_cell(results_dir: str | Path, cell_id: str) -> Recovered | Imported | str:
    """The cell's parts under ``results_dir``, each read once and checked (an imported cell: its one part);
    else why they do not make the cell."""
    rel = cell_dir_relpath(cell_id)
    parts = part_files(Path(results_dir) / rel)
    if not parts:
        return "no part files"
    spec, size, done, tables = None, None, {}, []
    for path in parts:
        try:
            meta, part_spec, n_rows, table = _read_part(path)
        except _ImportedPart as got:
            if len(parts) != 1:
                return f"{path.name}: an imported cell's part beside {len(parts) - 1} other(s)"
            return _imported(path, got.meta, got.n_rows, got.table, cell_id)
        except _Unreadable as e:
            return f"{path.name}: truncated or corrupt (not a readable Parquet file: {e})"
        except (OSError, pa.ArrowException, KeyError, ValueError, TypeError) as e:
            return f"{path.name}: no description of its cell ({type(e).__name__}; written by an older kdeval?)"
        if part_spec.id != cell_id:
            return f"{path.name}: its spec gives cell {part_spec.id}, not {cell_id} (another kdeval version?)"
        if spec is not None and (part_spec != spec or meta["shard_size"] != size):
            return f"{path.name}: another shard plan than the other parts"
        spec, size = part_spec, meta["shard_size"]
        done[meta["shard"]] = (meta, n_rows)
        tables.append((path, table))
    ranges = shard_ranges(spec.task.samples, size)
    if sorted(done) != list(range(len(ranges))) or any(ranges[i] != (m["start"], m["stop"])
                                                      for i, (m, _) in done.items()):
        return f"parts of shards {sorted(done)} are not the {len(ranges)} shards of {spec.task.samples} samples"
    held = HeldCell(spec, size, ranges, done={
        i: ShardDone(samples=m["stop"] - m["start"], n_rows=n, duration_s=m["duration_s"],
                     peak_memory_bytes=m["peak_memory_bytes"], worker=m["worker"], node=m["node"],
                     provenance=m["provenance"]) for i, (m, n) in done.items()})
    problem = verify_read_parts(tables, cell_id)
    if problem is not None:
        return problem
    return Recovered(spec, held, concat_parts([t for _, t in tables]).to_pylist())


def _finish(index: RunIndex, run_id: str, results_dir: str, got: Recovered, workload: Workload) -> bool:
    """Mark a recovered cell done in the index for ``run_id`` (as the scheduler completes a cell); False when
    another driver holds it."""
    cell = got.spec
    if index.claim_cell(cell.id, run_id) is not None:
        return False
    worker, node = got.held.where()
    return index.finish_cell(
        cell.id, run_id, results_dir=results_dir, result_path=cell_dir_relpath(cell.id), n_rows=got.held.n_rows(),
        summary=workload.aggregate(cell.to_task(), got.rows), duration_s=got.held.duration_s(),
        peak_memory_bytes=got.held.peak_memory_bytes(), worker=worker, node=node, provenance=got.held.provenance())


def _finish_imported(index: RunIndex, run_id: str, results_dir: str, cell_id: str, got: Imported) -> bool:
    """Mark an imported cell done for ``run_id`` from its part's description."""
    if index.claim_cell(cell_id, run_id) is not None:
        return False
    return index.finish_cell(cell_id, run_id, results_dir=results_dir, result_path=cell_dir_relpath(cell_id),
                             n_rows=got.n_rows, summary=got.summary, duration_s=0.0, peak_memory_bytes=None,
                             worker="import", node=None, provenance=got.provenance)


def adopt_cells(index: RunIndex, run_id: str, results_dir: str, cells: list[CellSpec],
                workload: Callable[[], Workload]) -> set[str]:
    """Mark done the ``cells`` of run ``run_id`` that the index has pending (never started, nobody holds
    them) and whose parts in ``results_dir`` make the cell; returns their ids. Nothing is recomputed or
    rewritten. ``workload`` gives the workload that aggregates rows (called only when a cell is adopted)."""
    views = index.get_cells([c.id for c in cells], states=[CellState.PENDING])
    adopted, made = set(), []
    for cid, view in views.items():
        if view.held_by is not None or view.n_attempts:
            continue
        got = recover_cell(results_dir, cid)
        if isinstance(got, Recovered):
            made = made or [workload()]
            if _finish(index, run_id, results_dir, got, made[0]):
                adopted.add(cid)
    return adopted


@dataclass
class Rebuilt:
    """What :func:`rebuild_index` did: runs made (or already there), cells done, cells it could not recover."""

    runs: list[str] = field(default_factory=list)
    cells_done: int = 0
    lost: dict[str, str] = field(default_factory=dict)  # cell id (or run manifest) -> why
    skipped_runs: list[str] = field(default_factory=list)  # already in the index


def rebuild_index(index: RunIndex, results_dir: str | Path, workload: Callable[[], Workload]) -> Rebuilt:
    """Rebuild runs, cells and their summaries in ``index`` from ``results_dir``: one run per manifest (or,
    without one, per run id the rows name), its cells done where their parts are recovered, the others
    pending; each rebuilt run says what it lacks (:data:`NOT_RECOVERED`). Runs the index has are left as
    they are, but for one an earlier rebuild was killed in the middle of (:data:`REBUILDING`): it is finished."""
    results_dir = str(Path(results_dir).expanduser().resolve())
    out = Rebuilt()
    recovered: dict[str, Recovered] = {}
    imported: dict[str, Imported] = {}
    for d in cell_dirs(results_dir):
        got = recover_cell(results_dir, d.name)
        if isinstance(got, Recovered):
            recovered[d.name] = got
        elif isinstance(got, Imported):
            imported[d.name] = got
        else:
            out.lost[d.name] = got
    runs: dict[str, dict[str, Any]] = {}
    for run_id, manifest in read_run_manifests(results_dir).items():
        if isinstance(manifest, str):
            out.lost[f"runs/{run_id}.json"] = manifest
        else:
            runs[run_id] = manifest
    without = set()  # runs the rows name that have no manifest: made of the cells they computed
    for got in recovered.values():
        run_id = got.rows[0]["run_id"] if got.rows else None
        if run_id and run_id not in runs:
            without.add(run_id)
            runs[run_id] = {"id": run_id, "name": "rebuilt", "grid_yaml": "", "grid_hash": "",
                            "kdeval_version": got.spec.kdeval_version, "cells": []}
        if run_id in without:
            runs[run_id]["cells"].append(vars(got.spec.record()))
    made = []
    for run_id, m in sorted(runs.items()):
        there = index.get_run(run_id)
        if there is not None and not (there.state == RunState.PENDING.value
                                      and (there.message or "").startswith(REBUILDING)):
            out.skipped_runs.append(run_id)  # a run of the index's own, or rebuilt to its end
            continue
        cells = [CellRecord(**c) for c in m["cells"]]
        if there is None:  # else a rebuild that was killed midway: carried on
            created = datetime.fromisoformat(m["created_at"]) if m.get("created_at") else None
            index.create_run(run_id, name=m["name"], grid_yaml=m["grid_yaml"], grid_hash=m["grid_hash"],
                             results_dir=results_dir, kdeval_version=m["kdeval_version"], cells=cells,
                             created_at=created, message=f"{REBUILDING} {results_dir} (not finished)")
        done = 0
        for c in cells:
            got = recovered.get(c.id)
            is_done = index.get_cell(c.id).state == CellState.DONE.value
            if c.id in imported and not is_done:
                is_done = _finish_imported(index, run_id, results_dir, c.id, imported[c.id])
            elif got is not None and not is_done:
                made = made or [workload()]
                # finished here, or (not held by this run) by whoever holds it
                is_done = (_finish(index, run_id, results_dir, got, made[0])
                           or index.get_cell(c.id).state == CellState.DONE.value)
            done += is_done
        out.cells_done += done
        missing = len(cells) - done
        grid = "" if m["grid_yaml"] else "; its grid is unknown (no manifest)"
        index.set_run_state(run_id, RunState.DONE if not missing else RunState.FAILED,
                            f"rebuilt from {results_dir}: {NOT_RECOVERED}"
                            + (f"; {missing} cell(s) not in the results" if missing else "") + grid)
        out.runs.append(run_id)
    listed = {c["id"] for m in runs.values() for c in m["cells"]}
    for cid in sorted(set(imported) - listed):
        out.lost[cid] = "an imported cell that no run manifest (runs/<run>.json) lists"
    return out
