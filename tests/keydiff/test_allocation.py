"""What a cache allocates: the tokens a run holds, not the chunk size's worth (full cache, batches)."""
from __future__ import annotations

import pytest

from kdeval.baselines import get_policy
from tests.keydiff.helpers import make_engine, prompt, tiny

L, NEW = 300, 8


@pytest.mark.parametrize("protect_last", [0, 20])
def test_full_cache_with_a_chunk_past_the_prompt_allocates_what_it_holds(protect_last):
    """A chunk size larger than the prompt (one-shot prefill) costs the same K/V bytes as small chunks: the
    non-evicting cache is sized for the prompt and its generation (it allocated the chunk size before)."""
    model = tiny().model
    ids = prompt(L)
    small = make_engine(model, get_policy("full"), budget=64, chunk_size=64).generate(ids, NEW, protect_last=protect_last)
    huge = make_engine(model, get_policy("full"), budget=64, chunk_size=100_000).generate(ids, NEW,
                                                                                        protect_last=protect_last)
    assert huge.tokens == small.tokens
    assert huge.stats.peak_kv_bytes == small.stats.peak_kv_bytes == small.stats.kv_cache_bytes
    assert small.stats.peak_kv_tokens == L + NEW - 1


def test_batch_of_one_shot_requests_allocates_no_more_than_small_chunks():
    """A ragged batch's buffers hold, per forward, the most a row holds plus that forward's widest row; with
    one-shot chunks (B = the prompt) the first forward is wide and the last ones hold the most, so the two
    must not be added across different forwards (that doubled the full cache's bytes)."""
    model = tiny().model
    rows = [prompt(L)[0], prompt(L - 100, seed=1)[0]]
    small = make_engine(model, get_policy("full"), budget=64, chunk_size=64).generate_batch(rows, NEW)
    whole = make_engine(model, get_policy("full"), budget=64, chunk_size=L).generate_batch(rows, NEW)
    assert [r.tokens for r in whole] == [r.tokens for r in small]
    assert [r.stats.peak_kv_bytes for r in whole] == [r.stats.peak_kv_bytes for r in small]
