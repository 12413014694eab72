"""Rows as Arrow tables, and the identity columns every stored per-sample row carries (self-describing rows).

With them the results directory can be queried alone (pyarrow.dataset, pandas, DuckDB) without the index.
Their types are fixed, whatever the values (``budget`` is int64 even in a ``full`` cell where it is null),
so the files of different cells read as one dataset.
"""
from __future__ import annotations

from typing import Any, Mapping

import pyarrow as pa

#: The identity columns, first in every stored table, in this order and with these types.
IDENTITY_SCHEMA = pa.schema([
    ("run_id", pa.string()),      # the run whose driver computed (and wrote) the rows
    ("cell_id", pa.string()),     # the cell's content hash
    ("model", pa.string()),       # model id
    ("policy", pa.string()),      # policy name
    ("params", pa.string()),      # policy parameters as JSON, keys sorted ("{}" when none)
    ("budget", pa.int64()),       # N; null for the budget-free ``full`` and for a share of the prompt
    ("budget_share", pa.float64()),  # the share of each prompt kept, in (0, 1] ("25%": 0.25); null for N
    ("chunk_size", pa.int64()),   # B; 0 for chunk size "whole" (one chunk of all that is compressed)
    ("task", pa.string()),        # the row's own task name when it has one, else the cell's
    ("length", pa.int64()),       # the row's own target length when set, else the cell's (null: natural)
    ("seed", pa.int64()),         # the task seed
    ("dtype", pa.string()),       # model dtype
    ("protocol", pa.string()),    # what the budget applies to: "prompt/evict", "context/keep", ...
])


def rows_to_table(rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Rows (dicts) as a Table: the union of their keys in first-seen order, a key missing in a row is null;
    a Table is returned as is."""
    if isinstance(rows, pa.Table):
        return rows
    if not rows:
        return pa.table({"id": pa.array([], type=pa.string())})
    keys: dict[str, None] = {}
    for row in rows:  # union of keys in first-seen order: a column missing in some rows becomes null
        keys.update(dict.fromkeys(row))
    return pa.table({k: [row.get(k) for row in rows] for k in keys})


#: Identity columns whose value a row may carry itself (kept when not null).
ROW_OWNED = ("task", "length")


def with_identity(rows: list[dict[str, Any]], identity: Mapping[str, Any]) -> pa.Table:
    """``rows`` as a Table, the identity columns first (typed as :data:`IDENTITY_SCHEMA`), then the rows' own
    columns in first-seen order. ``identity`` must give every identity column; a row's own ``task`` and
    ``length`` win when not null, its other identity-named keys are overwritten."""
    missing = [n for n in IDENTITY_SCHEMA.names if n not in identity]
    if missing:
        raise ValueError(f"identity: missing {', '.join(missing)}")
    out = []
    for row in rows:
        full = {n: identity[n] for n in IDENTITY_SCHEMA.names}
        for key in ROW_OWNED:
            if row.get(key) is not None:
                full[key] = row[key]
        full.update((k, v) for k, v in row.items() if k not in full)
        out.append(full)
    if not out:
        return IDENTITY_SCHEMA.empty_table()
    return conform_identity(rows_to_table(out))


#: Row columns that are null in some cells (``resolved_budget`` in a ``full`` cell, ``depth`` in a RULER cell),
#: typed as in the others so that a directory of cells reads as one dataset whichever file comes first.
NULLABLE_ROW_SCHEMA = pa.schema([
    ("resolved_budget", pa.int64()),  # N the sample kept; null without eviction
    ("depth", pa.float64()),          # needle depth in percent; null for tasks without one
])


def conform_identity(table: pa.Table) -> pa.Table:
    """``table`` with the identity columns it has cast to their :data:`IDENTITY_SCHEMA` types, and the row
    columns of :data:`NULLABLE_ROW_SCHEMA` to theirs (a column of nulls, as in a ``full`` cell, is null-typed;
    it is stored as int64 again)."""
    for f in (*IDENTITY_SCHEMA, *NULLABLE_ROW_SCHEMA):
        i = table.schema.get_field_index(f.name)
        if i >= 0 and table.schema.field(i).type != f.type:
            table = table.set_column(i, f, table.column(i).cast(f.type))
    return table
