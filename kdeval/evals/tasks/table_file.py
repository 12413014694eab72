"""A user's data file as rows: JSON lines, Parquet or CSV (by extension), bounded in size before it is read, every
problem one line naming the file and what was expected."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kdeval.evals.tasks.base import DataNotFoundError, EvalError
from kdeval.evals.tasks.data import jsonl_objects

#: a task's file is read whole: larger ones are refused before any byte is read
MAX_FILE_BYTES = 1 << 30
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}


def check_table_file(path: Path, field: str = "path") -> str:
    """The file's format (``jsonl``, ``parquet``, ``csv``); raises :class:`EvalError` naming ``field`` when it is
    missing, of another kind, empty, or above :data:`MAX_FILE_BYTES`."""
    if not path.is_file():
        raise DataNotFoundError(f"{field}: no such file: {path}")
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise EvalError(f"{field}: {path.name}: expected a .jsonl, .parquet or .csv file")
    size = path.stat().st_size
    if size == 0:
        raise EvalError(f"{field}: {path.name} is empty; expected at least one row")
    if size > MAX_FILE_BYTES:
        raise EvalError(f"{field}: {path.name} holds {size / 2**30:.1f} GiB; expected at most "
                        f"{MAX_FILE_BYTES / 2**30:.0f} GiB (a task's file is read whole: split it)")
    return kind


def read_rows(path: Path, field: str = "path") -> list[dict[str, Any]]:
    """Every row of ``path`` as a dict (column -> value); at least one row, else :class:`EvalError`."""
    kind = check_table_file(path, field)
    if kind == "jsonl":
        rows = [row for _, row in jsonl_objects(path, EvalError)]
    else:
        try:
            if kind == "parquet":
                import pyarrow.parquet as pq

                table = pq.read_table(path)
            else:
                import pyarrow.csv as pcsv

                table = pcsv.read_csv(path)
        except Exception as e:  # noqa: BLE001 - pyarrow's errors, in one line
            raise EvalError(f"{field}: {path.name}: not a readable {kind} file ({' '.join(str(e).split())})") from None
        rows = table.to_pylist()
    if not rows:
        raise EvalError(f"{field}: {path.name} has no rows; expected at least one")
    return rows
