"""Scoring predictions without a model (``kdeval score``), with the same code runs use.

A predictions file is JSON lines: ``{"id", "prediction", "references": [...]}`` plus what the
task's metric needs (``all_classes`` for LongBench trec/lsht; optional ``length``/``depth`` for
per-length and heatmap aggregates).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from kdeval.evals.tasks.base import EvalError, Task
from kdeval.evals.tasks.data import jsonl_objects


def score_row_fields(task: Task, prediction: str, references: Sequence[str], meta: Mapping[str, Any]) -> dict[str, float]:
    """``{"score": ..., <sub-score>: ...}`` for one prediction."""
    result = task.score(prediction, list(references), meta)
    out = {"score": float(result.score)}
    out.update({k: float(v) for k, v in result.sub.items()})
    return out


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    """Validated records of a predictions file; errors name the line and the field."""
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"--predictions: file not found: {p}")
    records = []
    for lineno, rec in jsonl_objects(p, EvalError):
        if not isinstance(rec.get("id"), (str, int)):
            raise EvalError(f"{p}:{lineno}: field 'id' is required (a string)")
        if not isinstance(rec.get("prediction"), str):
            raise EvalError(f"{p}:{lineno}: field 'prediction' is required (a string)")
        refs = rec.get("references")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
            raise EvalError(f"{p}:{lineno}: field 'references' must be a non-empty list of strings")
        records.append(rec)
    if not records:
        raise EvalError(f"{p}: no predictions (expected JSON lines with id, prediction, references)")
    return records


def score_records(task: Task, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-record rows ``{"id", "score", <sub-scores>, "length"?, "depth"?}``."""
    rows = []
    for i, rec in enumerate(records):
        meta = {k: v for k, v in rec.items() if k not in ("id", "prediction", "references")}
        try:
            fields = score_row_fields(task, rec["prediction"], rec["references"], meta)
        except EvalError as e:
            raise EvalError(f"record {i + 1} (id {rec['id']!r}): {e}") from None
        row: dict[str, Any] = {"id": str(rec["id"]), **fields}
        for k in ("length", "depth", "level"):
            if k in rec:
                row[k] = rec[k]
        rows.append(row)
    return rows
