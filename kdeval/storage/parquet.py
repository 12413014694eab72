"""Per-cell Parquet files of per-sample rows.

Layouts (both read the same way; ``result_path`` in the index says which one a cell has):

* a cell computed in sample shards: a directory ``<results_dir>/cells/<id[:2]>/<id>/`` holding one part per
  shard, ``part-0000.parquet``, ``part-0001.parquet``, ... (shard order = sample order); the cell's
  ``result_path`` is the directory ``cells/<id[:2]>/<id>``;
* one file per cell, ``<results_dir>/cells/<id[:2]>/<id>.parquet`` (written by older kdeval, and by
  :func:`write_cell_rows` for a cell without parts).

Every file is written to a ``_tmp-...-<pid>.parquet`` file in the same directory, fsynced, then
``os.replace``-d into place; only after that does the driver record it in the index. A crash leaves at worst
a temp file, which readers ignore (pyarrow.dataset and pandas skip ``_``-prefixed files too) and
:func:`clean_temp_files` removes. Before a done cell is reused its files are checked
(:mod:`kdeval.storage.integrity`).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from kdeval.storage.rows import conform_identity, rows_to_table

TMP_PREFIX = "_tmp-"
PART_RE = re.compile(r"^part-(\d{4,})\.parquet$")


def cell_relpath(cell_id: str) -> str:
    """Path of a cell's single Parquet file relative to the results directory (one-file layout)."""
    return f"cells/{cell_id[:2]}/{cell_id}.parquet"


def cell_dir_relpath(cell_id: str) -> str:
    """Path of a cell's directory of parts relative to the results directory (sharded layout)."""
    return f"cells/{cell_id[:2]}/{cell_id}"


def part_relpath(cell_id: str, shard: int) -> str:
    """Path of one shard's part relative to the results directory: ``cells/ab/<id>/part-0003.parquet``."""
    return f"{cell_dir_relpath(cell_id)}/part-{shard:04d}.parquet"


def part_files(directory: str | Path) -> list[Path]:
    """The part files of a cell directory in shard order (temp files and anything else excluded)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    parts = [(int(m.group(1)), p) for p in d.iterdir() if (m := PART_RE.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(parts)]


def _write_atomic(final: Path, table: pa.Table) -> None:
    """``table`` to ``final`` through a temp file in the same directory (fsync, then ``os.replace``)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomic(final, lambda fh: pq.write_table(table, fh))


def _replace_atomic(final: Path, write: Callable[[Any], None]) -> None:
    """``write(fh)`` into a temp file beside ``final``, fsync it, then ``os.replace`` it into place."""
    tmp = final.parent / f"{TMP_PREFIX}{final.stem}-{os.getpid()}{final.suffix}"
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_part(results_dir: str | Path, cell_id: str, shard: int, rows: list[dict[str, Any]] | pa.Table,
               metadata: Mapping[str, str] | None = None) -> str:
    """Atomically write one shard's rows as the cell's part ``shard``; returns its path relative to
    ``results_dir``. Identity columns are stored with their fixed types; ``metadata`` goes into the file's
    key-value metadata (what the part is, so that an index can be rebuilt from the files:
    :func:`read_part_metadata`)."""
    rel = part_relpath(cell_id, shard)
    table = conform_identity(rows_to_table(rows))
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    _write_atomic(Path(results_dir) / rel, table)
    return rel


def read_part_metadata(path: str | Path) -> dict[str, str]:
    """The key-value metadata of a Parquet file (its footer only); OSError or ArrowException if unreadable."""
    return schema_metadata(pq.read_schema(path))


def schema_metadata(schema: pa.Schema) -> dict[str, str]:
    """The key-value metadata of a Parquet file's Arrow schema, less Arrow's own keys."""
    raw = schema.metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items() if not k.startswith(b"ARROW:")}


def cell_dirs(results_dir: str | Path) -> list[Path]:
    """Every cell directory of parts under ``<results_dir>/cells`` (named by the cell's id), sorted."""
    root = Path(results_dir) / "cells"
    if not root.is_dir():
        return []
    return sorted(d for top in root.iterdir() if top.is_dir() for d in top.iterdir() if d.is_dir())


#: Where a run's manifest lives, relative to the results directory (:func:`write_run_manifest`).
RUNS_DIR = "runs"


def write_run_manifest(results_dir: str | Path, run_id: str, manifest: Mapping[str, Any]) -> Path:
    """Atomically write ``<results_dir>/runs/<run_id>.json``: a run's record and its cells, so that an index
    can be rebuilt from the results directory (JSON-able ``manifest``)."""
    final = Path(results_dir) / RUNS_DIR / f"{run_id}.json"
    final.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(manifest, sort_keys=True).encode("utf-8")
    _replace_atomic(final, lambda fh: fh.write(text))
    return final


def read_run_manifests(results_dir: str | Path) -> dict[str, dict[str, Any] | str]:
    """Run id -> its manifest, or why it cannot be read."""
    root = Path(results_dir) / RUNS_DIR
    out: dict[str, dict[str, Any] | str] = {}
    for path in sorted(root.glob("*.json")) if root.is_dir() else []:
        if path.name.startswith(TMP_PREFIX):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            out[path.stem] = data if isinstance(data, dict) else f"{path}: not a JSON object"
        except (OSError, ValueError) as e:
            out[path.stem] = f"{path}: {e}"
    return out


def remove_parts(results_dir: str | Path, cell_id: str, keep: Collection[int] = ()) -> int:
    """Delete the cell's parts whose shard is not in ``keep`` (a recomputation's stale parts); returns how
    many were removed."""
    removed = 0
    for path in part_files(Path(results_dir) / cell_dir_relpath(cell_id)):
        if int(PART_RE.match(path.name).group(1)) not in keep:
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def remove_single_file(results_dir: str | Path, cell_id: str) -> bool:
    """Delete the cell's one-file-layout file, once its parts replaced it (True when there was one)."""
    path = Path(results_dir) / cell_relpath(cell_id)
    if path.is_file():
        path.unlink(missing_ok=True)
        return True
    return False


def write_cell_rows(results_dir: str | Path, cell_id: str, rows: list[dict[str, Any]] | pa.Table) -> str:
    """Atomically (re)write a cell's rows where they live; returns the path relative to ``results_dir``.

    A cell stored as parts (a directory of parts exists) gets its rows back into those parts, in order, each
    part its own count of rows (each part atomically; ``kdeval rescore`` rewrites scores this way, so
    ``rows`` must have as many rows as the parts hold: ValueError otherwise). Any other cell is one file,
    ``cells/<id[:2]>/<id>.parquet``. Identity columns present (``kdeval.storage.rows.IDENTITY_SCHEMA``) are
    stored with their fixed types."""
    table = conform_identity(rows_to_table(rows))
    parts = part_files(Path(results_dir) / cell_dir_relpath(cell_id))
    if not parts:
        rel = cell_relpath(cell_id)
        _write_atomic(Path(results_dir) / rel, table)
        return rel
    counts = [pq.ParquetFile(p).metadata.num_rows for p in parts]
    if sum(counts) != table.num_rows:
        raise ValueError(f"rows: {table.num_rows} rows for cell {cell_id}, whose {len(parts)} parts hold "
                         f"{sum(counts)}; a cell stored as parts is rewritten part by part")
    offset = 0
    for path, n in zip(parts, counts):  # each part keeps its own metadata (what it is: see write_part)
        _write_atomic(path, table.slice(offset, n).replace_schema_metadata(read_part_metadata(path)))
        offset += n
    return cell_dir_relpath(cell_id)


def read_file_table(path: str | Path) -> pa.Table:
    """One Parquet file's rows, read on this thread: a cell's file is small, and pyarrow's thread pool and
    dataset layer cost more than reading it (0.7 ms a file against 2.3 ms for ``pq.read_table``, measured on
    the 4-row cells of bench/index_scale.py); the same table."""
    with pq.ParquetFile(path) as pf:
        return pf.read(use_threads=False)


def read_cell_table(results_dir: str | Path, result_path: str) -> pa.Table:
    """Read a cell's per-sample rows as a pyarrow Table (``result_path`` as stored in the index): one file,
    or the concatenation of a directory's parts in shard order (column types unified across parts)."""
    path = Path(results_dir) / result_path
    if not path.is_dir():
        return read_file_table(path)
    parts = part_files(path)
    if not parts:
        raise FileNotFoundError(f"no part files in {path}")
    return concat_parts([read_file_table(p) for p in parts])


def concat_parts(tables: list[pa.Table]) -> pa.Table:
    """A cell's rows from its parts' tables in shard order (column types unified across parts)."""
    return conform_identity(pa.concat_tables(tables, promote_options="permissive"))


def read_cell_rows(results_dir: str | Path, result_path: str) -> list[dict[str, Any]]:
    """Read a cell's per-sample rows as a list of dicts."""
    return read_cell_table(results_dir, result_path).to_pylist()


def _cell_files(results_dir: str | Path, pattern: str) -> list[Path]:
    """Files matching ``pattern`` under ``<results_dir>/cells`` (parts included), sorted (none when it does
    not exist)."""
    root = Path(results_dir) / "cells"
    return sorted(root.rglob(pattern)) if root.is_dir() else []


def list_result_files(results_dir: str | Path) -> list[Path]:
    """All finished result files: one-file cells and the parts of sharded cells (temp files excluded)."""
    return [p for p in _cell_files(results_dir, "*.parquet") if not p.name.startswith(TMP_PREFIX)]


def list_temp_files(results_dir: str | Path) -> list[Path]:
    """Leftover temp files (a writer died between write and rename)."""
    return _cell_files(results_dir, f"{TMP_PREFIX}*.parquet")


def temp_file_cell(path: str | Path) -> str | None:
    """The id of the cell a temp file was written for (None when the name does not tell)."""
    p = Path(path)
    if p.parent.parent.name != "cells":  # cells/ab/<id>/_tmp-part-0003-<pid>.parquet: a part of cell <id>
        return p.parent.name
    stem = p.name[len(TMP_PREFIX):-len(".parquet")]
    cell, _, pid = stem.rpartition("-")
    return cell if cell and pid.isdigit() else None


def clean_temp_files(results_dir: str | Path, skip_cells: Collection[str] = ()) -> int:
    """Delete leftover temp files, except those of the cells in ``skip_cells`` (cells a live driver is
    writing); returns how many were removed."""
    removed = 0
    skip = set(skip_cells)
    for path in list_temp_files(results_dir):
        if skip and temp_file_cell(path) in skip:
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
