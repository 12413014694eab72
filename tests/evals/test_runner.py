"""End to end on the tiny random model: one run per suite, row schema, shared contexts."""
from __future__ import annotations

import json
import typing

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.rows import EvalRow
from kdeval.evals.task_run.runner import aggregate, build_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import ContextTooLongError, EvalError
from kdeval.evals.tasks.prompting import PromptBuilder


@pytest.fixture(scope="module")
def tiny():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny")


SUITES = [
    ("needle", dict(lengths=[600], depths=[50], haystack="noise")),
    ("ruler.niah_single_1", dict(lengths=[700], num_samples=1)),
    ("phonebook", dict(lengths=[600], num_books=1, questions_per_book=2, max_new_tokens=8)),
    ("longbench.hotpotqa", dict(limit=1)),
    ("math500", dict(limit=1, max_new_tokens=8)),
]


@pytest.mark.parametrize("name,params", SUITES, ids=[s[0] for s in SUITES])
def test_one_run_per_suite(tiny, data_dir, fixtures_dir, name, params):
    if name.startswith("longbench"):
        params = {**params, "data_dir": str(fixtures_dir)}
    elif name == "math500":
        params = {**params, "data_dir": str(data_dir)}
    task = get_task(name, **params)
    rows = run_task(tiny, task, RunSettings(policy="keydiff", budget=128, chunk_size=64))
    samples, prompts = build_prompts(task, PromptBuilder(tiny.tokenizer, tiny.max_context))
    assert len(rows) == len(prompts) >= 1
    for row, prompt in zip(rows, prompts):
        assert set(typing.get_type_hints(EvalRow)) <= set(row)
        json.dumps(row)  # flat and JSON-able
        assert row["prompt_hash"] == prompt.hash and row["prompt_tokens"] == prompt.n_tokens
        assert row["kept_tokens"] <= 128 + 64 and 0.0 <= row["score"] <= 1.0 and not row["chat_template"]
        assert row["generated_tokens"] <= samples[0].max_new_tokens
    headline = aggregate(task, rows)
    assert headline["n"] == len(rows) and "max_peak_memory_bytes" in headline


def test_shared_context_gives_the_same_predictions_as_separate_prompts(tiny):
    task = get_task("phonebook", lengths=[500], num_books=1, questions_per_book=2, max_new_tokens=6)
    shared = run_task(tiny, task, RunSettings(policy="full", budget=None, chunk_size=64))
    alone = run_task(tiny, task, RunSettings(policy="full", budget=None, chunk_size=64, share_context=False))
    assert [r["context_shared"] for r in shared] == [True, True] and not alone[0]["context_shared"]
    assert [r["prediction"] for r in shared] == [r["prediction"] for r in alone]
    assert [r["prompt_hash"] for r in shared] == [r["prompt_hash"] for r in alone]


def test_subset_and_context_errors_before_generation(tiny):
    task = get_task("needle", lengths=[600], depths=[0, 50], haystack="noise")
    rows = run_task(tiny, task, RunSettings(policy="full"), sample_ids=["needle/L600/D50"])
    assert [r["id"] for r in rows] == ["needle/L600/D50"] and rows[0]["depth"] == 50
    with pytest.raises(ContextTooLongError, match="exceed the model's context"):
        run_task(tiny, get_task("needle", lengths=[5000], haystack="noise"), RunSettings(policy="full"))


def test_engine_options_reach_the_engine_and_requests_reuse_one_cache(captured_steps, emulated_graphs):
    """The graph path (emulated) through run_task: the same predictions as the default path, and the second
    request runs on the first one's released cache, so no step is captured again."""
    from kdeval.zoo.loading import load_model

    lm = load_model("random:llama-tiny", dtype="float64")
    made = captured_steps
    task = get_task("needle", lengths=[600], depths=[0, 50, 100], haystack="noise", max_new_tokens=4)
    ids = [s.id for s in build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context))[0]]
    static = {"cuda_graphs": True}
    first = run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, engine=static),
                     sample_ids=ids[:1])
    per_request = len(made)
    rows = run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, engine=static))
    assert per_request >= 2 and len(made) == 2 * per_request  # three requests, one set of captured steps
    plain = run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64))
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in plain]
    assert rows[0]["prediction"] == first[0]["prediction"]


def test_engine_options_are_checked():
    from kdeval.zoo.loading import load_model

    lm = load_model("random:llama-tiny", dtype="float64")
    task = get_task("needle", lengths=[600], depths=[0], haystack="noise", max_new_tokens=4)
    with pytest.raises(ValueError, match="cuda_graphs: needs a CUDA device"):
        run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, engine={"cuda_graphs": True}))
    for hook in ("graph_runner", "cache_layer"):  # the engine's test hooks
        with pytest.raises(EvalError, match=rf"engine: unknown option '{hook}'"):
            run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, engine={hook: None}))
    with pytest.raises(EvalError, match=r"engine: unknown option 'budget'"):
        run_task(lm, task, RunSettings(policy="keydiff", budget=128, chunk_size=64, engine={"budget": 3}))
