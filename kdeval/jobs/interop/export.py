"""``kdeval export``: every sample of a run's done cells as one file.

Every stored row carries its cell's identity columns (:mod:`kdeval.jobs.grid.identity`, added by the scheduler
before it writes a part), so an export only concatenates the stored tables (in grid order), after checking each
file is the cell's own (``kdeval.storage.read_verified_cell``, each file read once: the check runs on the
tables read): a done cell whose file fails the check is left out and named.
Files are written to a temp file in the target directory, then ``os.replace``-d: nothing half-written.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from kdeval.jobs.interop.csv_safe import safe_cell
from kdeval.jobs.interop.out_paths import check_file_target, clean_stale_staging, file_mode, staging_prefix
from kdeval.storage import IDENTITY_SCHEMA, CellState, RunIndex, read_verified_cell

#: Export formats and the file suffix each implies.
FORMATS = {"parquet": ".parquet", "csv": ".csv", "jsonl": ".jsonl"}
#: Formats written as a directory of other tools' files (kdeval.jobs.interop.export_dir).
DIR_FORMATS = ("kvpress", "lm-eval")
_ALL = ", ".join([*FORMATS, *DIR_FORMATS])


@dataclass
class Gathered:
    """What gathering a run's done cells left out."""

    run_id: str
    not_done: int  # cells of the run not done (pending, running, failed)
    skipped: dict[str, str]  # done cell id -> why its file was left out

    @property
    def complete(self) -> bool:
        """Every cell of the run was gathered."""
        return not self.not_done and not self.skipped


@dataclass
class DoneCells(Gathered):
    """A run's done cells whose files pass their integrity check: (view, table) in grid order."""

    cells: list[tuple[Any, pa.Table]]

    def rows(self) -> list[tuple[Any, list[dict[str, Any]]]]:
        """(view, rows as dicts) of every cell."""
        return [(view, table.to_pylist()) for view, table in self.cells]


def done_cells(index: RunIndex, run_ref: str, results_dir: str | Path | None = None) -> DoneCells:
    """Every done cell of run ``run_ref`` whose file passes its check, each read once; ``results_dir``
    overrides the recorded one. ValueError naming ``RUN`` for an unknown run."""
    run = index.get_run(run_ref)
    if run is None:
        raise ValueError(f"RUN: no run {run_ref!r} (or the prefix is ambiguous); see `kdeval ls`")
    out = DoneCells(run.id, 0, {}, [])
    for view in index.run_cells(run.id):
        if view.state != CellState.DONE.value:
            out.not_done += 1
            continue
        table, problem = read_verified_cell(view, results_dir)  # each file read once, checked as read
        if problem is not None:
            out.skipped[view.id] = problem
            continue
        out.cells.append((view, table))
    return out


@dataclass
class RunExport(Gathered):
    """What :func:`run_table` gathered: the table, and the run's cells it could not include."""

    table: pa.Table
    cells: int  # done cells whose rows are in the table


def check_format(fmt: str | None, out: Path) -> str:
    """The export format: ``fmt``, or the one ``out``'s suffix names; ValueError naming ``--format`` otherwise."""
    if fmt is None:
        by_suffix = {suffix: name for name, suffix in FORMATS.items()}
        if out.suffix.lower() in by_suffix:
            return by_suffix[out.suffix.lower()]
        raise ValueError(f"--format: expected one of {_ALL} (the suffix of --out {out.name!r} names none)")
    if fmt not in FORMATS:
        raise ValueError(f"--format: expected one of {_ALL}, got {fmt!r}")
    return fmt


def check_out(out: Path) -> Path:
    """``out`` as an absolute path whose directory exists and is writable, which is (or will be) a regular file
    reached without a symbolic link (:func:`kdeval.jobs.interop.out_paths.check_file_target`); ValueError naming
    ``--out``."""
    out = Path(out).expanduser().absolute()
    parent = out.parent
    if out.is_dir() and not out.is_symlink():
        raise ValueError(f"--out: {out} is a directory; expected a file path")
    check_file_target(out)  # not a device, FIFO or socket; not through a symbolic link
    if not parent.exists():
        raise ValueError(f"--out: directory {parent} does not exist")
    if not parent.is_dir():
        raise ValueError(f"--out: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out: directory {parent} is not writable")
    return out


def run_table(index: RunIndex, run_ref: str, results_dir: str | Path | None = None) -> RunExport:
    """Every row of run ``run_ref``'s done cells (grid order), with types unified across cells (a column
    null in one cell and float in another is float); ``results_dir`` overrides the recorded one."""
    done = done_cells(index, run_ref, results_dir)
    tables = [table for _, table in done.cells]
    table = pa.concat_tables(tables, promote_options="permissive") if tables else IDENTITY_SCHEMA.empty_table()
    return RunExport(run_id=done.run_id, table=table, cells=len(tables), not_done=done.not_done,
                     skipped=done.skipped)


def _json_value(value: Any) -> Any:
    """A value strict JSON can hold: NaN/inf become null, containers recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _flat_for_csv(table: pa.Table) -> pa.Table:
    """Nested columns (lists such as ``references``, structs, maps) as JSON text: CSV cells are flat; text
    that a spreadsheet would run as a formula gets a leading ``'`` (:func:`kdeval.jobs.interop.csv_safe.safe_cell`)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_nested(f.type):
            text = [None if v is None else json.dumps(_json_value(v), ensure_ascii=False, default=str)
                    for v in table.column(i).to_pylist()]
        elif pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            text = [None if v is None else safe_cell(v) for v in table.column(i).to_pylist()]
        else:
            continue
        table = table.set_column(i, pa.field(f.name, pa.string()), pa.array(text, pa.string()))
    return table


def _write_jsonl(table: pa.Table, fh) -> None:
    for batch in table.to_batches(max_chunksize=4096):
        for row in batch.to_pylist():
            line = json.dumps(_json_value(row), ensure_ascii=False, allow_nan=False, default=str)
            fh.write(line.encode("utf-8") + b"\n")


WRITERS: dict[str, Callable[[pa.Table, Any], None]] = {
    "parquet": lambda table, fh: pq.write_table(table, fh),
    "csv": lambda table, fh: pacsv.write_csv(_flat_for_csv(table), fh),
    "jsonl": _write_jsonl,
}


def write_table(table: pa.Table, fmt: str, out: Path) -> Path:
    """Write ``table`` as ``fmt`` to ``out`` (checked by :func:`check_out`) atomically: a temp file beside it,
    fsync, ``os.replace``; the file gets the mode the umask gives a new file."""
    clean_stale_staging(out)  # what an export killed mid-write left here
    fd, tmp = tempfile.mkstemp(prefix=staging_prefix(out), suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            WRITERS[fmt](table, fh)
            fh.flush()
            os.chmod(fh.fileno(), file_mode())  # as the umask says, not the temp file's 0600
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def export_run(index: RunIndex, run_ref: str, fmt: str | None, out: str | Path,
               results_dir: str | Path | None = None) -> RunExport:
    """Check the arguments, gather run ``run_ref``'s rows and write them to ``out`` as ``fmt`` (None: from
    ``out``'s suffix). Bad arguments raise ValueError naming ``--format``, ``--out`` or ``RUN``, before
    anything is written."""
    out = Path(out)
    fmt = check_format(fmt, out)
    out = check_out(out)
    export = run_table(index, run_ref, results_dir)
    try:
        write_table(export.table, fmt, out)
    except OSError as exc:
        raise ValueError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    return export
