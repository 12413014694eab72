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


@pytest.mark.parametrize("policy", ["keydiff", "ada-keydiff"])
def test_one_shot_eviction_allocates_no_more_than_the_full_cache(policy):
    """B past the prompt (one-shot compression): a layer holds at most the call's tokens, so an evicting cache
    allocates no more K/V bytes than the full cache on the same call (it allocated N + B, N more than it held)."""
    model = tiny().model
    ids = prompt(L)
    full = make_engine(model, get_policy("full"), budget=64, chunk_size=L).generate(ids, NEW)
    evicting = make_engine(model, get_policy(policy), budget=64, chunk_size=L).generate(ids, NEW)
    assert evicting.stats.peak_kv_tokens == L
    assert evicting.stats.peak_kv_bytes <= full.stats.peak_kv_bytes


def test_a_short_state_continued_grows_to_budget_plus_chunk_not_past_it():
    """A prefill shorter than N + B allocates what it holds; continuing it grows the buffers up to N + B (the
    bound), never past it (doubling 50 slots would give 100 > 96)."""
    model = tiny().model
    eng = make_engine(model, get_policy("keydiff"), budget=64, chunk_size=32)
    state = eng.prefill(prompt(50))
    small = state.cache.nbytes()
    state = eng.prefill(prompt(200, seed=1), state=state)
    layer = state.cache.layers[0]
    assert small < state.cache.nbytes() and layer.capacity == 64 + 32
