"""Per-cell Parquet files of per-sample rows.

Layout: ``<results_dir>/cells/<cell_id[:2]>/<cell_id>.parquet``. A file is written to
``_tmp-<cell_id>-<pid>.parquet`` in the same directory, fsynced, then ``os.replace``-d into place; only
after that does the driver mark the cell done in the index. A crash leaves at worst a temp file, which
readers ignore (pyarrow.dataset and pandas skip ``_``-prefixed files too) and :func:`clean_temp_files` removes.
Before a done cell is reused its file is checked (:mod:`kdeval.storage.integrity`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kdeval.storage.rows import conform_identity, rows_to_table

TMP_PREFIX = "_tmp-"


def cell_relpath(cell_id: str) -> str:
    """Path of a cell's Parquet file relative to the results directory."""
    return f"cells/{cell_id[:2]}/{cell_id}.parquet"


def write_cell_rows(results_dir: str | Path, cell_id: str, rows: list[dict[str, Any]] | pa.Table) -> str:
    """Atomically write a cell's rows; returns the path relative to ``results_dir``. Identity columns
    present (``kdeval.storage.rows.IDENTITY_SCHEMA``) are stored with their fixed types."""
    rel = cell_relpath(cell_id)
    final = Path(results_dir) / rel
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{TMP_PREFIX}{cell_id}-{os.getpid()}.parquet"
    table = conform_identity(rows_to_table(rows))
    with open(tmp, "wb") as fh:
        pq.write_table(table, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return rel


def read_cell_table(results_dir: str | Path, result_path: str) -> pa.Table:
    """Read a cell's per-sample rows as a pyarrow Table (``result_path`` as stored in the index)."""
    return pq.read_table(Path(results_dir) / result_path)


def read_cell_rows(results_dir: str | Path, result_path: str) -> list[dict[str, Any]]:
    """Read a cell's per-sample rows as a list of dicts."""
    return read_cell_table(results_dir, result_path).to_pylist()


def _cell_files(results_dir: str | Path, pattern: str) -> list[Path]:
    """Files matching ``pattern`` under ``<results_dir>/cells``, sorted (none when it does not exist)."""
    root = Path(results_dir) / "cells"
    return sorted(root.rglob(pattern)) if root.is_dir() else []


def list_result_files(results_dir: str | Path) -> list[Path]:
    """All finished cell files (temp files excluded)."""
    return [p for p in _cell_files(results_dir, "*.parquet") if not p.name.startswith(TMP_PREFIX)]


def list_temp_files(results_dir: str | Path) -> list[Path]:
    """Leftover temp files (a writer died between write and rename)."""
    return _cell_files(results_dir, f"{TMP_PREFIX}*.parquet")


def clean_temp_files(results_dir: str | Path) -> int:
    """Delete leftover temp files; returns how many were removed."""
    removed = 0
    for path in list_temp_files(results_dir):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
