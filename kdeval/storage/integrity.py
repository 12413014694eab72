"""Is a done cell's Parquet file really its result? Checked before a done cell is reused or reported.

A file counts when it can be read, every value of its ``cell_id`` column is the cell's id and it holds as
many rows as the index recorded. A cell stored as a directory of parts (sample shards) counts when every
part does (readable, only this cell's rows) and the parts together hold as many rows as the index recorded.
Only the footers (row count, schema) and the ``cell_id`` column are read, so checking a whole grid stays
cheap. Files written before rows carried ``cell_id`` cannot be checked and count as bad (their cells are
recomputed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kdeval.storage.parquet import concat_parts, part_files, read_file_table

#: The column every stored row carries with the id of the cell that produced it.
CELL_ID_COLUMN = "cell_id"
_NO_COLUMN = f"no {CELL_ID_COLUMN} column (written before rows named their cell)"


def verify_cell_file(results_dir: str | Path, result_path: str, cell_id: str, n_rows: int) -> str | None:
    """None when ``<results_dir>/<result_path>`` (a file, or a directory of parts) holds exactly the ``n_rows``
    rows of ``cell_id``; else why not.

    Reasons: ``missing file PATH``, ``no part files in PATH``, ``unreadable parquet: ...``,
    ``no cell_id column (...)``, ``holds cell OTHER``, ``12 rows, index says 24``; a part's own problem is
    prefixed with its name (``part-0002.parquet: holds cell OTHER``).
    """
    path = Path(results_dir) / result_path
    if path.is_dir():
        files = part_files(path)
        if not files:
            return f"no part files in {path}"
    elif path.is_file():
        files = [path]
    else:
        return f"missing file {path}"
    rows = 0
    for file in files:
        counted = _file_rows(file, cell_id)
        if isinstance(counted, str):
            return _named(counted, file, files)
        rows += counted
    if rows != n_rows:
        return f"{rows} rows, index says {n_rows}"
    return None


def _file_rows(path: Path, cell_id: str) -> int | str:
    """The row count of one file whose rows are all ``cell_id``'s, else why it is not usable."""
    try:
        with pq.ParquetFile(path) as pf:
            rows = pf.metadata.num_rows
            if CELL_ID_COLUMN not in pf.schema_arrow.names:
                return _NO_COLUMN
            ids = pf.read(columns=[CELL_ID_COLUMN]).column(0)
    except (OSError, pa.ArrowException) as exc:
        return unreadable(exc)
    return _ids_problem(ids, cell_id) or rows


def _ids_problem(ids: pa.ChunkedArray, cell_id: str) -> str | None:
    """Why a file's ``cell_id`` column is not all ``cell_id``, else None."""
    foreign = [v for v in ids.unique().to_pylist() if v is not None and v != cell_id]
    if foreign:
        return f"holds cell {foreign[0]}"
    if ids.null_count:
        return f"holds rows of no cell ({ids.null_count} null {CELL_ID_COLUMN})"
    return None


def _named(why: str, file: Path, files: list[Path]) -> str:
    """``why`` of one of ``files``, prefixed with its name when there are several (parts)."""
    return why if len(files) == 1 else f"{file.name}: {why}"


def unreadable(exc: BaseException) -> str:
    """What a check says of a file that cannot be read."""
    return f"unreadable parquet: {_one_line(exc)}"


def verify_read_parts(parts: list[tuple[Path, pa.Table | str]], cell_id: str) -> str | None:
    """:func:`verify_cell_file`'s check of parts already read whole (path, and its table or why it could not be
    read): None when every part holds only ``cell_id``'s rows, else why not, in the same words. (The row count
    is the tables' own.)"""
    files = [path for path, _ in parts]
    for path, table in parts:
        if isinstance(table, str):
            why: str | None = table
        elif CELL_ID_COLUMN not in table.column_names:
            why = _NO_COLUMN
        else:
            why = _ids_problem(table.column(CELL_ID_COLUMN), cell_id)
        if why is not None:
            return _named(why, path, files)
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


def read_verified_cell(view: Any, results_dir: str | Path | None = None
                       ) -> tuple[pa.Table | None, str | None]:
    """(the done ``CellView``'s rows, None) when its file checks out as :func:`verify_cell` checks it, else
    (None, why not, in :func:`verify_cell`'s words), each file read once: the check runs on the tables read
    (:func:`verify_read_parts`), not on a read of its own before them."""
    where = results_dir if results_dir is not None else view.results_dir
    if not where or not view.result_path:
        return None, "the index records no result file"
    if view.n_rows is None:
        return None, "the index records no row count"
    path = Path(where) / view.result_path
    if path.is_dir():
        files = part_files(path)
        if not files:
            return None, f"no part files in {path}"
    elif path.is_file():
        files = [path]
    else:
        return None, f"missing file {path}"
    parts: list[tuple[Path, pa.Table | str]] = []
    for file in files:
        try:
            parts.append((file, read_file_table(file)))
        except (OSError, pa.ArrowException) as exc:
            parts.append((file, unreadable(exc)))
    why = verify_read_parts(parts, view.id)
    if why is not None:
        return None, why
    tables = [table for _, table in parts]
    rows = sum(table.num_rows for table in tables)
    if rows != view.n_rows:
        return None, f"{rows} rows, index says {view.n_rows}"
    return (concat_parts(tables) if path.is_dir() else tables[0]), None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
