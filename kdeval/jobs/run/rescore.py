"""``kdeval rescore``: recompute stored predictions' scores with the current metric code.

For every done cell of a run: read its rows, score each ``prediction`` against its ``references`` with
the task's current :meth:`score`, recompute the cell summary with the task's ``aggregate``, rewrite the
Parquet file atomically (temp + rename) and update the summary in the index. No model runs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kdeval.cluster.stub import STUB_PREFIX
from kdeval.evals import get_scorer
from kdeval.evals.tasks.scoring import score_row_fields
from kdeval.jobs.grid.cells import CellSpec
from kdeval.storage import CellState, RunIndex, read_cell_rows, write_cell_rows


@dataclass
class RescoreReport:
    """What a rescore did."""

    cells: int = 0
    rows: int = 0
    changed: int = 0
    skipped: list[str] = field(default_factory=list)


def _meta(row: dict[str, Any]) -> dict[str, Any]:
    """The sample metadata the metric needs: ``meta_json`` plus ``length``/``depth`` columns."""
    meta: dict[str, Any] = {}
    raw = row.get("meta_json") or row.get("meta") or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raw = {}
    meta.update(raw)
    for key in ("length", "depth"):
        if row.get(key) is not None:
            meta[key] = row[key]
    return meta


def rescore_run(index: RunIndex, run_id: str) -> RescoreReport:
    """Rescore every done cell of ``run_id``; returns counts (cells, rows, changed scores, skipped)."""
    from kdeval.evals.task_run.runner import aggregate  # imports torch: only when rescoring

    report = RescoreReport()
    for cell in index.run_cells(run_id, states=[CellState.DONE]):
        spec = CellSpec.model_validate(cell.spec)
        if spec.model.id.startswith(STUB_PREFIX):
            report.skipped.append(f"{cell.id[:10]}: stub workload has no metric")
            continue
        try:
            task = get_scorer(spec.task.name)  # built for scoring only (no data files read)
        except Exception as e:  # noqa: BLE001 - an unknown/unavailable task skips the cell
            report.skipped.append(f"{cell.id[:10]}: {e}")
            continue
        rows = read_cell_rows(cell.results_dir, cell.result_path)
        for row in rows:
            scored = row["answer"] if row.get("answer") is not None else row.get("prediction")  # thinking: strip
            fields = score_row_fields(task, scored or "", row.get("references") or [], _meta(row))
            if row.get("score") is None or abs(float(row["score"]) - fields["score"]) > 1e-12:
                report.changed += 1
            row.update(fields)
        write_cell_rows(cell.results_dir, cell.id, rows)
        index.set_cell_summary(cell.id, aggregate(task, rows))
        report.cells += 1
        report.rows += len(rows)
    return report
