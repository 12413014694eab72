"""Chunk size ``whole``: one chunk holds everything compressed (the prompt, or the context under ``context``),
so the rows equal a run whose B is each sample's compressed length, and the cache peaks at that length."""
from __future__ import annotations

import dataclasses

import pytest

from kdeval.evals.benchmarks.registry import get_task
from kdeval.evals.task_run.chunking import WHOLE, chunk_code, chunk_text, parse_chunk, resolve_chunk
from kdeval.evals.task_run.runner import model_prompts, run_task
from kdeval.evals.task_run.settings import RunSettings

TIMINGS = {"ttft_s", "decode_s", "shared_prefill_s", "kv_buffer_bytes", "peak_memory_bytes", "timing_batch"}


@pytest.fixture(scope="module")
def lively():
    from kdeval.zoo.loading import load_model

    return load_model("random:llama-tiny", dtype="float64", overrides={"initializer_range": 0.1})


def same(a, b):
    return {k: v for k, v in a.items() if k not in TIMINGS} == {k: v for k, v in b.items() if k not in TIMINGS}


def test_parse_and_codes():
    assert parse_chunk("whole") == parse_chunk(" Whole ") == WHOLE and parse_chunk(64) == 64
    for bad in ("hole", 2.5, None, True):
        with pytest.raises(ValueError, match="^expected a positive number of tokens or 'whole'"):
            parse_chunk(bad)
    assert (chunk_code(WHOLE), chunk_code(128), chunk_text(0), chunk_text(WHOLE), chunk_text(64)) == \
        (0, 128, "whole", "whole", "64")
    assert resolve_chunk(WHOLE, 700) == 700 and resolve_chunk(64, 700) == 64


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_whole_is_one_chunk_of_what_is_compressed(lively, compress):
    t = get_task("ruler.niah_single_1", lengths=[700, 850], num_samples=1)
    samples, built = model_prompts(lively, t, max_new_tokens=3)
    settings = RunSettings(policy="snapkv", budget=64, compress=compress, max_new_tokens=3)
    rows = run_task(lively, t, dataclasses.replace(settings, chunk_size=WHOLE), prompts=(samples, built))
    assert len({p.n_tokens for p in built}) == 2
    for r, s, p in zip(rows, samples, built):
        b = len(p.prefix_ids) if compress == "context" else p.n_tokens
        assert r["resolved_chunk"] == b
        # the whole compressed part sat in the cache before its one eviction: unbounded by N + B of a chunk
        assert r["peak_kv_tokens"] >= b
        [alone] = run_task(lively, t, dataclasses.replace(settings, chunk_size=b), sample_ids=[s.id],
                           prompts=(samples, built))
        assert same(r, alone)
    chunked = run_task(lively, t, dataclasses.replace(settings, chunk_size=32), prompts=(samples, built))
    assert all(r["peak_kv_tokens"] <= 64 + 32 + (len(p.suffix_ids) if compress == "context" else 0)
               for r, p in zip(chunked, built))


def test_whole_under_prompt_never_shares_a_context_prefill(lively):
    """Phonebook questions share a context; one-shot over the prompt compresses each whole prompt once."""
    t = get_task("phonebook", lengths=[300], num_books=1, questions_per_book=2, max_new_tokens=2)
    samples, built = model_prompts(lively, t)
    rows = run_task(lively, t, RunSettings(policy="keydiff", budget=40, chunk_size=WHOLE), prompts=(samples, built))
    assert [r["context_shared"] for r in rows] == [False, False]
    assert [r["resolved_chunk"] for r in rows] == [p.n_tokens for p in built]
    ctx = run_task(lively, t, RunSettings(policy="keydiff", budget=40, chunk_size=WHOLE, compress="context"),
                   prompts=(samples, built))
    assert [r["context_shared"] for r in ctx] == [True, True]
    assert [r["resolved_chunk"] for r in ctx] == [len(p.prefix_ids) for p in built]
