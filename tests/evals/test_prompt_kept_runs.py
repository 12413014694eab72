"""``compress="generated"`` through the runner: the prompt kept whole, the budget counting generated tokens (a
share: of each sample's ``max_new_tokens``), the same rows in batches, in groups of cells sharing their
prompt steps and alone, and the policies and tasks it cannot run refused before anything runs."""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.group_run import run_group
from kdeval.evals.task_run.runner import model_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import EvalError

from .test_run_group import results

MAX_NEW = 40


@pytest.fixture(scope="module")
def varied():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


@pytest.fixture(scope="module")
def needle(varied):
    task = get_task("needle", lengths=[600], depths=[20, 50, 80], haystack="noise")
    return task, model_prompts(varied, task, max_new_tokens=MAX_NEW)


def kept(policy: str, budget, **extra) -> RunSettings:
    return RunSettings(policy=policy, budget=None if policy == "full" else budget, chunk_size=32,
                       compress="generated", max_new_tokens=MAX_NEW, **extra)


@pytest.mark.parametrize("policy", ["keydiff", "random", "sink"])
def test_rows_hold_the_prompt_plus_the_budget(varied, needle, policy):
    task, prompts = needle
    rows = run_task(varied, task, kept(policy, 16), prompts=prompts)
    for r in rows:
        assert r["generated_tokens"] == MAX_NEW and r["max_new_tokens"] == MAX_NEW and r["hit_max_new_tokens"]
        assert r["kept_tokens"] == r["prompt_tokens"] + 16  # the prompt, 16 of the 39 generated tokens fed
        assert r["peak_kv_tokens"] == r["prompt_tokens"] + 16 + 1
        assert r["compressed_tokens"] == MAX_NEW and r["resolved_budget"] == 16
    full = run_task(varied, task, kept("full", None), prompts=prompts)
    assert all(r["kept_tokens"] == r["prompt_tokens"] + MAX_NEW - 1 for r in full)


def test_a_share_is_one_of_max_new_tokens(varied, needle):
    task, prompts = needle
    rows = run_task(varied, task, kept("keydiff", "25%"), prompts=prompts)
    assert {r["resolved_budget"] for r in rows} == {MAX_NEW // 4}
    assert all(r["kept_tokens"] == r["prompt_tokens"] + MAX_NEW // 4 for r in rows)


@pytest.mark.parametrize("policy", ["keydiff", "random", "ada"])
def test_batches_give_the_rows_alone(varied, needle, policy):
    task, prompts = needle
    alone = run_task(varied, task, kept(policy, 16), prompts=prompts)
    batched = run_task(varied, task, kept(policy, 16, batch_size=3), prompts=prompts)
    assert results(batched, ("kv_cache_bytes",)) == results(alone, ("kv_cache_bytes",))


def test_groups_share_the_prompt_steps_and_give_every_cell_its_rows_alone(varied, needle):
    """keydiff, random, sink and full at two budgets: every member shares the prompt's steps (nothing of it is
    evicted), at batch 1 and in batches (forked at the prompt's last chunk), and gets its rows alone."""
    task, prompts = needle
    cells = [kept(p, n) for p in ("keydiff", "random", "sink") for n in (8, 16)] + [kept("full", None)]
    cells += [dataclasses.replace(kept("keydiff", 16), batch_size=3)]
    grouped = run_group(varied, task, cells, prompts, time_first=False)
    for cell, got in zip(cells, grouped):
        cell = dataclasses.replace(cell, batch_size=cell.batch_size or 1)
        alone = run_task(varied, task, cell, prompts=prompts)
        assert results(got.rows, ("kv_cache_bytes",)) == results(alone, ("kv_cache_bytes",)), cell
    assert all(r["execution"] == "shared" for g in grouped for r in g.rows)
    # the member in batches recorded each prompt's chunks before its last token in one batch and replayed them
    # (it forks there); at batch 1 the first member recorded each prompt's last chunk, every later one replays
    # all the prompt's chunks: the whole prompt, up to where generation starts
    chunks = [-(-p.n_tokens // 32) for p in prompts[1]]
    assert [r["replayed_steps"] for r in grouped[-1].rows] == [(p.n_tokens - 1) // 32 for p in prompts[1]]
    assert [r["replayed_steps"] for r in grouped[0].rows] == [c - 1 for c in chunks]
    for got in grouped[1:-1]:
        assert [r["replayed_steps"] for r in got.rows] == chunks


def test_what_cannot_run_is_refused_in_one_line(varied, needle):
    task, prompts = needle
    with pytest.raises(EvalError, match=r"policy: 'kvzip' scores tokens by a repeat pass .* 'generated'"):
        run_task(varied, task, kept("kvzip", 16), prompts=prompts)
    with pytest.raises(EvalError, match=r"protocol.decode: 'keep' under compress 'generated'"):
        RunSettings(compress="generated", decode="keep")
    turns = get_task("turns.kv", lengths=[300], turns=2, repeats=1, kind="numbers")
    with pytest.raises(EvalError, match=r"protocol.compress: 'generated' runs one question per context"):
        run_task(varied, turns, kept("keydiff", 16))
