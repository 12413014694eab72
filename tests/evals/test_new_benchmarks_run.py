"""One small run of every new benchmark task on the tiny random model: rows, scores and the task's aggregate."""
from __future__ import annotations

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.runner import aggregate, run_task
from kdeval.evals.task_run.settings import RunSettings

TASKS = [
    ("longbench2", {"limit": 2}, "accuracy"),
    ("infinitebench.en_qa", {"limit": 1}, "score"),
    ("infinitebench.en_mc", {"limit": 1}, "score"),
    ("infinitebench.passkey", {"lengths": [400], "depths": [50]}, "accuracy"),
    ("infinitebench.number_string", {"lengths": [400], "depths": [50]}, "accuracy"),
    ("infinitebench.kv_retrieval", {"lengths": [700], "depths": [50]}, "accuracy"),
    ("loogle.shortdep_qa", {"limit": 2}, "score"),
    ("aime2025", {"limit": 1, "max_new_tokens": 4}, "accuracy"),
]


@pytest.fixture(scope="module")
def tiny():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny")


@pytest.mark.parametrize("name,params,headline", TASKS, ids=[t[0] for t in TASKS])
def test_one_run_per_new_task(tiny, fixtures_dir, name, params, headline):
    if not name.startswith("infinitebench.") or name in ("infinitebench.en_qa", "infinitebench.en_mc"):
        params = {**params, "data_dir": str(fixtures_dir)}
    task = get_task(name, **params)
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=96, chunk_size=32, max_new_tokens=4))
    assert len(rows) >= 1 and all(0.0 <= r["score"] <= 1.0 for r in rows)
    assert all(r["generated_tokens"] <= 4 and r["task"] == name for r in rows)
    summary = aggregate(task, rows)
    assert summary["n"] == len(rows) and 0.0 <= summary[headline] <= 100.0
    if name.startswith("loogle."):
        assert rows[0]["context_shared"]  # two questions on one document: one compressed context
        assert {"bleu1", "bleu4", "rouge1", "rouge2", "rougeL"} <= set(rows[0])
