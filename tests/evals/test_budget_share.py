"""Budgets as a share of the prompt: parsing, resolution to kvpress's kept count, and run_task keeping it per
sample.

The runner tests use float64 llama-tiny with larger weights (as tests/evals/test_batching.py), so eviction
shows in the greedy tokens and a wrong N would change the rows.
"""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.budget import (BUDGET_EXPECTED, budget_order, budget_share, budget_tokens, parse_budget,
                                 resolve_budget)
from kdeval.evals.task_run.runner import model_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings
from kdeval.evals.tasks.base import EvalError

#: what depends on the batch or the clock
BATCH_DEPENDENT = {"ttft_s", "decode_s", "shared_prefill_s", "kv_buffer_bytes", "peak_memory_bytes", "peak_kv_bytes", "timing_batch"}


@pytest.mark.parametrize("text,canon", [("25%", "25%"), ("12.5%", "12.5%"), ("12.50 %", "12.5%"),
                                        ("25.0%", "25%"), ("100%", "100%"), (".5%", "0.5%")])
def test_shares_parse_to_their_canonical_text(text, canon):
    assert parse_budget(text) == canon


@pytest.mark.parametrize("value", [25, "25", 25.0])
def test_a_number_stays_absolute(value):
    assert parse_budget(value) == 25


@pytest.mark.parametrize("bad", ["0%", "150%", "100.01%", "abc%", "-5%", "%", "1e2%", 0, -3, 2.5, True, None])
def test_bad_budgets_are_refused(bad):
    with pytest.raises(ValueError, match=f"^{BUDGET_EXPECTED.replace('(', '[(]').replace(')', '[)]')}$"):
        parse_budget(bad)


def kvpress_kept(length: int, compression_ratio: float) -> int:
    """kvpress's ScorerPress keeps ``int(k_len * (1 - compression_ratio))`` keys (Python floats)."""
    return int(length * (1 - compression_ratio))


#: a share and the compression ratio a kvpress user writes for it
SHARES_AND_RATIOS = [("10%", 0.9), ("25%", 0.75), ("50%", 0.5), ("12.5%", 0.875), ("70%", 0.3), ("1%", 0.99),
                     ("33%", 0.67), ("90%", 0.1), ("99.5%", 0.005), ("100%", 0.0)]


@pytest.mark.parametrize("share,ratio", SHARES_AND_RATIOS)
def test_a_share_keeps_kvpress_count_at_every_length(share, ratio):
    assert [resolve_budget(share, n) for n in range(1, 5001)] == [kvpress_kept(n, ratio) for n in range(1, 5001)]


def test_resolution_follows_kvpress_floats_not_exact_fractions():
    # hand-worked: 1 - 0.9 is 0.09999999999999998 in floats, so of 30 tokens kvpress keeps int(2.99...) = 2
    assert resolve_budget("10%", 30) == 2
    assert resolve_budget("25%", 41) == 10          # 10.25 -> 10
    assert resolve_budget("12.5%", 8) == 1
    assert resolve_budget("100%", 7) == 7
    assert resolve_budget("0.1%", 5) == 0           # as kvpress: no token (an evicting policy refuses N=0)
    assert resolve_budget(256, 41) == 256 and resolve_budget(None, 41) is None
    assert (budget_share("25%"), budget_tokens("25%")) == (0.25, None)
    assert (budget_share(256), budget_tokens(256)) == (None, 256)
    assert sorted([512, "50%", None, "12.5%", 64], key=budget_order) == [None, 64, 512, "12.5%", "50%"]


@pytest.fixture(scope="module")
def lively():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def ruler():
    """Three prompts of different lengths (their 25% resolve to different N)."""
    return get_task("ruler.niah_single_1", lengths=[700, 850, 1000], num_samples=2)


def test_each_sample_keeps_its_share_of_the_prompt(lively):
    """One generated token (no decode step): the cache ends holding exactly kvpress's N = int(prompt × 0.25), and
    the rows of each N equal a run of those samples under that absolute N."""
    t = ruler()
    rows = run_task(lively, t, RunSettings(policy="keydiff", budget="25%", chunk_size=32, max_new_tokens=1))
    ns = [kvpress_kept(r["prompt_tokens"], 0.75) for r in rows]
    assert len(set(ns)) > 2 and len(set(ns)) < len(rows)  # several N, some shared by two samples
    for r, n in zip(rows, ns):
        assert r["resolved_budget"] == r["kept_tokens"] == n
        assert r["peak_kv_tokens"] <= n + 32
    for n in set(ns):
        ids = [r["id"] for r, m in zip(rows, ns) if m == n]
        alone = run_task(lively, t, RunSettings(policy="keydiff", budget=n, chunk_size=32, max_new_tokens=1),
                         sample_ids=ids)
        assert [without_timings(a) for a in alone] == [without_timings(r) for r in rows if r["id"] in ids]


def without_timings(row):
    return {k: v for k, v in row.items() if k not in BATCH_DEPENDENT}


@pytest.mark.parametrize("compress,decode", [("prompt", "evict"), ("context", "keep")])
def test_a_batch_under_a_share_equals_batch_1(lively, compress, decode):
    """Phonebook questions share contexts; under ``prompt`` their prompts (and N) differ within a context."""
    t = get_task("phonebook", lengths=[400], num_books=2, questions_per_book=3, max_new_tokens=6)
    settings = RunSettings(policy="keydiff", budget="30%", chunk_size=32, compress=compress, decode=decode)
    ref = run_task(lively, t, settings)
    got = run_task(lively, t, dataclasses.replace(settings, batch_size=4))
    assert [r["id"] for r in got] == [r["id"] for r in ref]
    for g, r in zip(got, ref):
        assert without_timings(g) == without_timings(r), g["id"]
    assert len({r["resolved_budget"] for r in ref}) > 1


def test_under_context_the_share_is_of_the_context(lively):
    """kvpress's protocol compresses the context only: N = int(context × (1 - 0.8)) and the question is held on
    top."""
    t = get_task("phonebook", lengths=[400], num_books=2, questions_per_book=2, max_new_tokens=1)
    samples, built = model_prompts(lively, t, max_new_tokens=1)
    rows = run_task(lively, t, RunSettings(policy="keydiff", budget="20%", chunk_size=32, compress="context",
                                           decode="keep", share_context=False), prompts=(samples, built))
    for r, p in zip(rows, built):
        n = kvpress_kept(len(p.prefix_ids), 0.8)
        assert r["resolved_budget"] == n and r["kept_tokens"] == n + len(p.suffix_ids)


def test_a_share_below_what_the_policy_keeps_fails_naming_the_sample(lively):
    t = ruler()
    with pytest.raises(EvalError, match=r"^budget: 1% of sample '[^']+' \(\d+ prompt tokens\) is N=\d; must be >= "
                                        r"the 16 tokens policy 'sink' always keeps"):
        run_task(lively, t, RunSettings(policy="sink", policy_params={"n_sink_tokens": 16}, budget="1%", chunk_size=32,
                                        max_new_tokens=1))


def test_run_task_refuses_a_bad_share(lively):
    with pytest.raises(EvalError, match=r"^budget: expected .* got '0%'$"):
        run_task(lively, ruler(), RunSettings(policy="keydiff", budget="0%", chunk_size=32, max_new_tokens=1))
