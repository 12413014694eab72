"""Storage: the SQL index of runs/cells/attempts and per-cell Parquet files. Imports nothing of kdeval.

Public API (used by the CLI and reports)::

    from kdeval.storage import RunIndex
    idx = RunIndex.open(db)            # path, SQLAlchemy URL, or None (.kdeval/index.sqlite)
    RunIndex.open(db, write=False)     # a reader: a SQLite file it cannot write opens read-only
                                       # (IndexAccessError, a ValueError: not an index, unreachable, read-only)
    idx.list_runs()                    # [RunView] newest first, with per-state cell counts
    idx.get_run(ref)                   # RunView by id or unique prefix (None if unknown)
    idx.run_cells(run_id, states=None) # [CellView] in grid order (spec, state, summary, error, ...)
    idx.get_cells(ids, states=None)    # {cell id: CellView} of the known cells among ids
    idx.cell_attempts(cell_id)         # [AttemptView] every attempt (done / failed / lost / timeout)
    idx.read_cell_table(cell_id)       # pyarrow.Table of the cell's per-sample rows (all its parts)
    idx.read_cell_rows(cell_id)        # the same as list[dict]
    verify_cell(view)                  # None if a done cell's Parquet file is really its result, else why not

Schema: see :mod:`kdeval.storage.tables` (tables ``runs``, ``cells``, ``run_cells``, ``attempts``,
``cell_shards``); drivers' leases on cells and done shards: :mod:`kdeval.storage.leases`.
``CellView.spec`` is the cell's full spec as JSON (``model``, ``policy``, ``policy_params``, ``budget``
(N, a share's text such as ``"25%"``, or None for ``full``), ``chunk_size``, ``task`` {name, data_version,
length, samples, seed, params}, ``generation``, ``protocol``, ``kdeval_version``); ``CellView.summary`` the
task's aggregate (JSON);
``CellView.provenance`` how its result was computed (JSON: versions, device, dtype, host).
Per-sample rows: per done cell a directory of parts, one per sample shard
(``<results_dir>/cells/<id[:2]>/<id>/part-0000.parquet``, ...; older results: one file
``<results_dir>/cells/<id[:2]>/<id>.parquet``; :mod:`kdeval.storage.parquet`), whose
columns are the evals' ``EvalRow`` (``kdeval/evals/task_run/rows.py``: id, prompt_hash, prompt_tokens,
truncated, prediction, references, score, ttft_s, decode_s, peak_memory_bytes, peak_kv_tokens,
kept_tokens, resolved_budget, length, depth, meta_json, ...) plus the metric's sub-score columns, and the
identity columns the driver adds to every row (``run_id, cell_id, model, policy, params, budget, budget_share,
chunk_size, task, length, seed, dtype, protocol``; ``kdeval.storage.rows.IDENTITY_SCHEMA``), so the results
directory reads on its own.
"""
from kdeval.storage.db import (
    DB_ENV, DEFAULT_DB_PATH, IndexAccessError, IndexStorageError, db_text, db_url, make_engine, sqlite_path,
)
from kdeval.storage.index import RunIndex, age_seconds
from kdeval.storage.integrity import (
    CELL_ID_COLUMN, read_verified_cell, unreadable, verify_cell, verify_cell_file, verify_read_parts,
)
from kdeval.storage.leases import ShardView
from kdeval.storage.sqlite_lock import IndexLockedError
from kdeval.storage.tables import TERMINAL_RUN_STATES, AttemptState, CellState, RunState
from kdeval.storage.parquet import (
    RUNS_DIR, cell_dir_relpath, cell_dirs, clean_temp_files, concat_parts, list_result_files, list_temp_files,
    part_files, part_relpath, read_cell_rows, read_cell_table, read_part_metadata, read_run_manifests, remove_parts,
    remove_single_file, schema_metadata, temp_file_cell, write_cell_rows, write_part, write_run_manifest,
)
from kdeval.storage.rows import IDENTITY_SCHEMA, conform_identity, rows_to_table, with_identity
from kdeval.storage.views import AttemptView, CellRecord, CellView, RunView, to_jsonable

__all__ = [
    "DB_ENV", "DEFAULT_DB_PATH", "IndexAccessError", "IndexLockedError", "IndexStorageError", "db_text",
    "db_url", "make_engine", "sqlite_path", "RunIndex",
    "age_seconds",
    "AttemptState", "CellState", "RunState", "TERMINAL_RUN_STATES", "clean_temp_files", "list_result_files",
    "list_temp_files", "read_cell_rows", "read_cell_table", "rows_to_table", "write_cell_rows", "AttemptView",
    "CellRecord", "CellView", "RunView", "to_jsonable", "CELL_ID_COLUMN", "verify_cell", "verify_cell_file",
    "IDENTITY_SCHEMA", "conform_identity", "with_identity", "ShardView", "cell_dir_relpath", "part_files",
    "part_relpath", "remove_parts", "remove_single_file", "temp_file_cell", "write_part", "cell_dirs",
    "read_part_metadata", "read_run_manifests", "write_run_manifest", "RUNS_DIR", "concat_parts", "schema_metadata",
    "unreadable", "verify_read_parts", "read_verified_cell",
]
