"""Engine.release: a finished request's static cache, with the graphs captured on it, serves the next request
exactly like a fresh cache would (so a stream of requests captures its CUDA graphs once)."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.cache.budget_cache import EMPTY_POSITION

from .helpers import assert_same_run, kept_positions, make_engine, prompt, tiny
from .oracles import EMULATED, GATHER

REQUESTS = [(130, 8, 1, 9), (25, 24, 1, 10), (70, 5, 2, 11), (90, 6, 1, 12)]  # length, new tokens, batch, seed


def _engine(lm, policy) -> Engine:
    """An engine on the static layout (emulated graphs)."""
    return make_engine(lm.model, policy, budget=40, chunk_size=16, cuda_graphs=True, **EMULATED)


@pytest.mark.parametrize("policy", ["keydiff", "h2o"])  # h2o: per-token state that must be emptied too
def test_released_cache_serves_the_next_request_like_a_fresh_one(policy):
    lm = tiny("random:llama-tiny", 2, "float64")
    pooled = _engine(lm, get_policy(policy))
    caches, steps = {}, {}  # per batch size: the cache, and every captured step seen on it
    for length, new, batch, seed in REQUESTS:
        ids = prompt(length, batch=batch, seed=seed)
        fresh = _engine(lm, get_policy(policy)).generate(ids, max_new_tokens=new)
        got = pooled.generate(ids, max_new_tokens=new)
        assert got.tokens == fresh.tokens
        assert torch.equal(got.state.last_logits, fresh.state.last_logits)
        for a, b in zip(kept_positions(got.state), kept_positions(fresh.state)):
            assert torch.equal(a, b)
        cache = caches.setdefault(batch, got.state.cache)
        assert got.state.cache is cache  # the same buffers, request after request (per batch size)
        for key, step in got.state.cache.graphs.items():
            assert steps.setdefault((batch, key), step) is step  # never captured again
        pooled.release(got.state)
    assert set(caches) == {1, 2}


def test_a_reused_cache_starts_empty():
    lm = tiny()
    eng = _engine(lm, get_policy("tova"))
    used = eng.generate(prompt(100), max_new_tokens=4).state
    eng.release(used)
    state = eng.new_state()
    assert state.cache is used.cache and state.seen == 0 and state.cache.length == 0
    for layer in state.cache.layers:
        assert layer.pending == 0
        assert bool((layer.positions == EMPTY_POSITION).all())
        assert not layer.keys.any() and not layer.values.any()
        assert all(not s.any() for s in layer.state.values())


def test_a_released_state_is_refused():
    lm = tiny()
    eng = _engine(lm, get_policy("keydiff"))
    res = eng.generate(prompt(60), max_new_tokens=3)
    eng.release(res.state)
    with pytest.raises(ValueError, match=r"state: it was released to the engine's pool"):
        eng.generate(prompt(10), state=res.state)
    with pytest.raises(ValueError, match=r"state: it was released"):
        res.state.fork()
    with pytest.raises(ValueError, match=r"state: it was released"):
        eng.release(res.state)


def test_without_graphs_nothing_is_pooled():
    lm = tiny()
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16))
    res = eng.generate(prompt(60), max_new_tokens=3)
    eng.release(res.state)
    assert eng.new_state().cache is not res.state.cache


def test_a_pooled_cache_is_freed_with_its_engine_and_only_its_engine_pools_it():
    """No reference cycle: dropping the engine frees its pooled cache at once (on a GPU, its memory and its
    graphs' memory pools); another engine's state is not taken into the pool."""
    import gc
    import weakref

    lm = tiny()
    eng = _engine(lm, get_policy("keydiff"))
    other = _engine(lm, get_policy("keydiff"))
    res = eng.generate(prompt(60), max_new_tokens=3)
    foreign = other.generate(prompt(60), max_new_tokens=3).state
    eng.release(foreign)
    assert eng.new_state().cache is not foreign.cache
    cache = weakref.ref(res.state.cache)
    eng.release(res.state)
    del res
    gc.disable()
    try:
        del eng
        assert cache() is None
    finally:
        gc.enable()


def test_a_state_continued_by_another_engine_gets_that_engines_steps():
    """Captured steps record their engine's policy and settings: a state prefilled by one engine (since
    dropped) and continued by another with the same layout runs the second engine's own steps."""
    lm = tiny("random:llama-tiny", 2, "float64")
    state = _engine(lm, get_policy("tova")).prefill(prompt(70, seed=3))
    before = dict(state.cache.graphs)
    other = _engine(lm, get_policy("tova", heads="group"))
    got = other.generate(prompt(20, seed=4), max_new_tokens=4, state=state)
    steady = (1, 16, "full")
    assert before[steady].owner() is None  # the first engine is gone
    assert got.state.cache.graphs[steady] is not before[steady]
    assert got.state.cache.graphs[steady].owner() is other.step and got.state.cache.graphs[(1, 1, "full")].owner() is other.step
    ref = Engine(lm.model, get_policy("tova"), EngineConfig(budget=40, chunk_size=16), **GATHER)
    ref_state = ref.prefill(prompt(70, seed=3))
    tova = Engine(lm.model, get_policy("tova", heads="group"), EngineConfig(budget=40, chunk_size=16), **GATHER)
    want = tova.generate(prompt(20, seed=4), max_new_tokens=4, state=ref_state)
    assert_same_run(got, want)


def test_a_state_without_the_policys_token_state_is_refused():
    lm = tiny()
    state = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16)).prefill(prompt(50))
    h2o = Engine(lm.model, get_policy("h2o"), EngineConfig(budget=40, chunk_size=16))
    with pytest.raises(ValueError, match=r"state: its cache keeps the per-token state \[\], policy 'h2o' needs"):
        h2o.generate(prompt(10), state=state)
