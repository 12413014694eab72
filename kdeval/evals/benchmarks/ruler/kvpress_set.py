"""kvpress's RULER evaluation set as a task source: the very samples kvpress's leaderboard scores.

kvpress evaluates RULER on a fixed dataset (hub ``simonjegou/ruler``, one config per context length such as
``4096``, split ``test``) whose rows hold ``context``, ``question``, ``answer_prefix``, ``answer`` (a list),
``task`` (``niah_single_1`` ... ``qa_2``) and ``max_new_tokens``. A local copy in that format is read from
``<data dir>/kvpress/ruler/<length>.parquet`` (or ``.jsonl``). Sample ``i`` of a task is its ``i``-th row in
the set's order, id ``kvpress/ruler.<task>/L<length>/<i>``: what ``kdeval import kvpress`` gives the rows of a
kvpress predictions.csv (kvpress keeps the dataset's order when it evaluates it whole), so the two pair.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kdeval.evals.tasks.base import EvalError, Sample, TaskUnavailableError
from kdeval.evals.tasks.data import find_data_file, resolve_data_dir

HUB_ID = "simonjegou/ruler"
SOURCES = ("kvpress", "kvpress-hub")


def local_file(data_dir: str | None, length: int) -> Path | None:
    """The local copy of the set at ``length`` (parquet first, then JSONL), or None."""
    for suffix in (".parquet", ".jsonl"):
        path = find_data_file(data_dir, f"kvpress/ruler/{length}{suffix}")
        if path is not None:
            return path
    return None


def sample_id(task: str, length: int, index: int) -> str:
    """The id of the ``index``-th row of RULER ``task`` (``vt``) at ``length`` in kvpress's set."""
    return f"kvpress/ruler.{task}/L{length}/{index}"


def load_rows(source: str, data_dir: str | None, length: int) -> list[dict[str, Any]]:
    """Every row of kvpress's RULER set at ``length`` (local copy or hub); TaskUnavailableError when absent."""
    import pandas as pd

    if source == "kvpress-hub":
        from kdeval.evals.tasks.hub import hub_rows

        return hub_rows(HUB_ID, str(length), "test", f"kvpress RULER set at {length}")
    path = local_file(data_dir, length)
    if path is None:
        root = resolve_data_dir(data_dir)
        raise TaskUnavailableError(f"kvpress RULER set at {length}: {root or '<data dir>'}/kvpress/ruler/{length}"
                                   f".parquet (or .jsonl) not found; save {HUB_ID} (config {length}, split test) "
                                   f"there, or use source: kvpress-hub")
    df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_json(path, lines=True)
    missing = {"context", "question", "answer_prefix", "answer", "task", "max_new_tokens"} - set(df.columns)
    if missing:
        raise EvalError(f"{path}: not kvpress's RULER format, missing columns {sorted(missing)}")
    return df.to_dict("records")


def task_samples(rows: list[dict[str, Any]], task: str, name: str, length: int, limit: int) -> list[Sample]:
    """The first ``limit`` samples of ``task`` among ``rows`` (kvpress's context, question and answer prefix)."""
    out = []
    for i, r in enumerate(r for r in rows if r["task"] == task):
        if i == limit:
            break
        out.append(Sample(id=sample_id(task, length, i), prefix=str(r["context"]), suffix=str(r["question"]),
                          answer_prefix=str(r["answer_prefix"] or ""),
                          references=tuple(str(a) for a in list(r["answer"])),
                          max_new_tokens=int(r["max_new_tokens"]), meta={"length": length, "index": i}))
    if not out:
        raise EvalError(f"{name}: kvpress's RULER set at {length} has no rows of task {task!r}")
    return out
