"""The identity columns of a cell's rows: the one place they are built (``kdeval.storage.IDENTITY_SCHEMA``).

The scheduler adds them to every row before it writes a shard's Parquet part (:func:`self_describing`), so a
results directory reads alone and an export only concatenates stored tables (:mod:`kdeval.jobs.interop.export`).
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from kdeval.evals.task_run.budget import budget_share, budget_tokens
from kdeval.evals.task_run.chunking import chunk_code
from kdeval.jobs.grid.cells import CellSpec
from kdeval.storage import with_identity


def cell_identity(cell: CellSpec, run_id: str) -> dict[str, Any]:
    """The identity columns of ``cell``'s rows as computed by run ``run_id`` (``IDENTITY_SCHEMA`` order)."""
    return {
        "run_id": run_id, "cell_id": cell.id, "model": cell.model.id, "policy": cell.policy,
        "params": json.dumps(cell.policy_params, sort_keys=True), "budget": budget_tokens(cell.budget),
        "budget_share": budget_share(cell.budget),
        "chunk_size": chunk_code(cell.chunk_size), "task": cell.task.name, "length": cell.task.length,
        "seed": cell.task.seed, "dtype": cell.model.dtype, "protocol": cell.protocol.label,
    }


def self_describing(rows: list[dict[str, Any]], cell: CellSpec, run_id: str) -> pa.Table:
    """A cell's per-sample rows with its identity columns first (what the scheduler writes)."""
    return with_identity(rows, cell_identity(cell, run_id))
