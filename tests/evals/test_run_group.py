"""run_group: several cells of one task on the same samples, with the prompt steps they compute alike computed
once, give every cell the rows it gets alone (timings aside), say which samples were timed alone; members in
batches fork then batch, ``share=False`` and batched members of a conversation run alone."""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run import group_run
from kdeval.evals.task_run.group_run import OWN_FIGURES, run_group
from kdeval.evals.task_run.question_runs import context_groups
from kdeval.evals.task_run.runner import model_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings

#: what may differ between a cell run in a group and alone: its timings and how it was computed
NOT_RESULTS = {"ttft_s", "decode_s", "peak_memory_bytes", "timing_batch", "shared_prefill_s", "kv_buffer_bytes", "execution",
               "replayed_steps"}


@pytest.fixture(scope="module")
def tiny():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny")


def results(rows, also=()):
    return [{k: v for k, v in r.items() if k not in NOT_RESULTS and k not in also} for r in rows]


def members():
    """A grid's worth of cells: policies of every kind (SDPA, captured rows, queries, per-layer budgets, a head
    pool; every registered policy is checked in tests/baselines/test_shared_steps.py), N tokens and a share,
    chunked and one-shot, both protocols."""
    out = []
    for policy in ("full", "keydiff", "snapkv", "expected-attention", "pyramidkv", "ada"):
        for budget, chunk, compress in ((64, 32, "prompt"), ("25%", "whole", "context"), ("30%", 32, "context")):
            out.append(RunSettings(policy=policy, budget=None if policy == "full" else budget, chunk_size=chunk,
                                   compress=compress, max_new_tokens=4))
    return out


@pytest.mark.parametrize("task_args", [
    ("needle", dict(lengths=[600], depths=[20, 80], haystack="noise")),
    ("phonebook", dict(lengths=[500], num_books=2, questions_per_book=2, max_new_tokens=4)),  # shared contexts
])
def test_rows_equal_each_cell_run_alone(tiny, task_args):
    task = get_task(task_args[0], **task_args[1])
    prompts = model_prompts(tiny, task, max_new_tokens=4)
    cells = members()
    told = []
    grouped = run_group(tiny, task, cells, prompts, on_samples=lambda i, n: told.append((i, n)))
    sizes = [len(g) for g in context_groups(prompts[1])]
    # the timed first context group member by member, as each ends; every later group for all members at once
    assert told == [(i, n) for n in sizes for i in range(len(cells))]
    for cell, got in zip(cells, grouped):
        alone = run_task(tiny, task, cell, prompts=prompts)
        assert results(got.rows) == results(alone), cell
        assert got.seconds > 0
    rows = {c.policy: g.rows for c, g in zip(cells, grouped)}
    assert rows["keydiff"][0]["execution"] == "alone" and rows["keydiff"][0]["ttft_s"] is not None  # timed alone
    later = [r for g in grouped for r in g.rows[1:] if r["execution"] == "shared"]
    assert later and all(r[c] is None for r in later for c in OWN_FIGURES)
    assert any(r["replayed_steps"] > 0 for r in later)
    assert all(r["execution"] == "alone" and r["replayed_steps"] == 0 for r in rows["ada"])  # a head pool never shares


def batch_members():
    """Cells in batches and at batch 1: ``None`` is left to run_group (a chunked cell batches, one-shot does not)."""
    return [RunSettings(policy="keydiff", budget=64, chunk_size=32, max_new_tokens=4, batch_size=3),
            RunSettings(policy="snapkv", budget=64, chunk_size=32, max_new_tokens=4, batch_size=None),
            RunSettings(policy="tova", budget=64, chunk_size=32, max_new_tokens=4),
            RunSettings(policy="keydiff", budget="25%", chunk_size="whole", compress="context", max_new_tokens=4,
                        batch_size=None),
            RunSettings(policy="full", budget=None, chunk_size=32, max_new_tokens=4, batch_size=2)]


def test_members_in_batches_fork_then_batch_and_give_their_alone_rows(varied, monkeypatch):
    task = get_task("needle", lengths=[600], depths=[20, 50, 80], haystack="noise")
    prompts = model_prompts(varied, task, max_new_tokens=4)
    cells = batch_members()
    told, made = [], []
    monkeypatch.setattr(group_run, "_store", lambda *a, real=group_run._store: made.append(real(*a)) or made[-1])
    grouped = run_group(varied, task, cells, prompts, time_first=False, batch_size=3,
                        on_samples=lambda i, n: told.append((i, n)))
    # the members in batches (0, 1, 4) over the one window of three samples, then those at batch 1 sample by sample
    assert told == [(0, 3), (1, 3), (4, 3)] + [(2, 1), (3, 1)] * 3
    sizes = [3, 3, 1, 1, 2]
    for cell, size, got in zip(cells, sizes, grouped):
        alone = run_task(varied, task, dataclasses.replace(cell, batch_size=size), prompts=prompts)
        assert results(got.rows) == results(alone), cell
        assert [r["execution"] for r in got.rows] == ["shared"] * 3, cell
    by = {i: g.rows for i, g in enumerate(grouped)}
    assert {r["timing_batch"] for r in by[0]} == {0}  # keydiff's three forks continue in one batch
    assert [r["timing_batch"] for r in by[4]] == [0, 0, 1]
    # keydiff, the first member in batches, recorded the three samples' chunks of 32 as one batch up to the bound
    # of the cells of B = 32 (64 + 32 tokens; the one-shot cell's bound is its own), then replayed them as snapkv,
    # tova and the full cache do
    assert [s.recorded for s in made] == [3 + 1] * 3  # and the one-shot cell its context's forward
    assert all(r["replayed_steps"] == 3 for i in (0, 1, 2, 4) for r in by[i])
    assert all(r[c] is None for g in grouped for r in g.rows for c in OWN_FIGURES)
    off = run_group(varied, task, cells, prompts, share=False, batch_size=3)
    assert all(r["execution"] == "alone" and r["replayed_steps"] == 0 for g in off for r in g.rows)
    for a, b in zip(grouped, off):
        assert results(a.rows) == results(b.rows)


def test_members_in_batches_share_a_context_and_time_the_first_alone(varied):
    task = get_task("phonebook", lengths=[400], num_books=2, questions_per_book=2, max_new_tokens=4)
    prompts = model_prompts(varied, task, max_new_tokens=4)
    cells = [dataclasses.replace(c, compress="context") for c in batch_members()]
    grouped = run_group(varied, task, cells, prompts, batch_size=3)
    # the first book is timed in a batch of its own: a row's share of its batch's K/V buffers is its batch's
    share = ("kv_cache_bytes", "peak_kv_bytes")
    for cell, size, got in zip(cells, [3, 3, 1, 1, 2], grouped):
        alone = run_task(varied, task, dataclasses.replace(cell, batch_size=size), prompts=prompts)
        assert results(got.rows, share) == results(alone, share), cell
        assert [r["execution"] for r in got.rows] == ["alone"] * 2 + ["shared"] * 2, cell  # the first book alone
    assert all(r["replayed_steps"] > 0 for r in grouped[1].rows[2:])


def test_members_in_batches_on_a_conversation_run_alone(varied):
    task = get_task("turns.kv", lengths=[300], turns=2, repeats=1, kind="numbers")
    prompts = model_prompts(varied, task, max_new_tokens=4)
    cells = [RunSettings(policy="keydiff", budget=64, chunk_size=32, max_new_tokens=4, batch_size=2),
             RunSettings(policy="snapkv", budget=64, chunk_size=32, max_new_tokens=4, batch_size=None)]
    grouped = run_group(varied, task, cells, prompts, time_first=False, batch_size=3)
    assert all(r["execution"] == "alone" for r in grouped[0].rows)
    for cell, size, got in zip(cells, [2, 1], grouped):
        assert results(got.rows) == results(run_task(varied, task, dataclasses.replace(cell, batch_size=size),
                                                     prompts=prompts))


@pytest.fixture(scope="module")
def varied():
    """Weights large enough that kept sets change the tokens (the default init repeats one token)."""
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def test_cells_that_keep_while_decoding_decode_together_and_give_their_alone_rows(varied):
    task = get_task("phonebook", lengths=[400], num_books=2, questions_per_book=2, max_new_tokens=5)
    prompts = model_prompts(varied, task, max_new_tokens=5)
    cells = [RunSettings(policy=p, budget=None if p == "full" else budget, chunk_size=chunk, compress=compress,
                         decode="keep", max_new_tokens=5)
             for p in ("full", "keydiff", "snapkv", "pyramidkv", "ada", "sink-rerotate")
             for budget, chunk, compress in ((48, 32, "prompt"), ("25%", "whole", "context"))]
    cells.append(RunSettings(policy="tova", budget=48, chunk_size=32, decode="evict", max_new_tokens=5))
    grouped = run_group(varied, task, cells, prompts)
    for cell, got in zip(cells, grouped):
        assert results(got.rows) == results(run_task(varied, task, cell, prompts=prompts)), cell
    later = {(c.policy, c.chunk_size): g.rows[2:] for c, g in zip(cells, grouped)}  # the second book's
    assert len({r["prediction"] for g in grouped for r in g.rows}) > 3
    for (policy, _), rows in later.items():
        batched = policy not in ("ada", "sink-rerotate", "tova")
        assert all((r["decode_s"] is None) == batched for r in rows), policy
        assert all(r["execution"] == "shared" for r in rows if batched), policy
    assert all(r["decode_s"] is not None for g in grouped for r in g.rows[:2])  # the first book: timed alone


def test_windows_end_where_batches_alone_end():
    from kdeval.evals.task_run.group_run import _windows

    assert _windows([[1], [2], [3], [4]], 2, before=1) == [[[1]], [[2], [3]], [[4]]]  # alone: [0 1] [2 3] [4]
    assert _windows([[0, 1], [2, 3], [4, 5]], 3) == [[[0, 1], [2, 3]], [[4, 5]]]  # a context is never split
    assert _windows([[0], [1], [2]], 1) == [[[0]], [[1]], [[2]]]
