"""Is a done cell's Parquet file really its result? Checked before a done cell is reused or reported.

A file counts when it can be read, every value of its ``cell_id`` column is the cell's id and it holds as
many rows as the index recorded. Only the footer (row count, schema) and the ``cell_id`` column are read,
so checking a whole grid stays cheap. Files written before rows carried ``cell_id`` cannot be checked and
count as bad (their cells are recomputed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

#: The column every stored row carries with the id of the cell that produced it.
CELL_ID_COLUMN = "cell_id"


def verify_cell_file(results_dir: str | Path, result_path: str, cell_id: str, n_rows: int) -> str | None:
    """None when ``<results_dir>/<result_path>`` holds exactly the ``n_rows`` rows of ``cell_id``; else why not.

    Reasons: ``missing file PATH``, ``unreadable parquet: ...``, ``no cell_id column (...)``,
    ``holds cell OTHER``, ``12 rows, index says 24``.
    """
    path = Path(results_dir) / result_path
    if not path.is_file():
        return f"missing file {path}"
    try:
        with pq.ParquetFile(path) as pf:
            rows = pf.metadata.num_rows
            if CELL_ID_COLUMN not in pf.schema_arrow.names:
                return f"no {CELL_ID_COLUMN} column (written before rows named their cell)"
            ids = pf.read(columns=[CELL_ID_COLUMN]).column(0)
    except (OSError, pa.ArrowException) as exc:
        return f"unreadable parquet: {_one_line(exc)}"
    foreign = [v for v in ids.unique().to_pylist() if v != cell_id]
    if foreign:
        return f"holds cell {foreign[0]}"
    if rows != n_rows:
        return f"{rows} rows, index says {n_rows}"
    return None


def verify_cell(view: Any, results_dir: str | Path | None = None) -> str | None:
    """:func:`verify_cell_file` for a done ``CellView`` (``results_dir`` overrides the recorded one,
    for results moved since the run). Also says why when the index records no file or no row count."""
    where = results_dir if results_dir is not None else view.results_dir
    if not where or not view.result_path:
        return "the index records no result file"
    if view.n_rows is None:
        return "the index records no row count"
    return verify_cell_file(where, view.result_path, view.id, view.n_rows)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
