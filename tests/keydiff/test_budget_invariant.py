"""After every chunk and every decode step each layer holds exactly min(N, seen) tokens."""
import pytest

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig

from .helpers import make_engine, prompt, tiny
from .oracles import STORES


@pytest.mark.parametrize("store", ["slot", "gather"])
@pytest.mark.parametrize("budget,chunk", [(24, 8), (24, 10), (50, 64), (7, 3)])
def test_cache_holds_min_budget_seen(store, budget, chunk):
    lm = tiny()
    seen_lengths = []

    def check(state):
        for layer in state.cache.layers:
            keys, positions, _ = layer.view()
            assert keys.shape[2] == min(budget, state.seen)
            assert positions.shape[2] == min(budget, state.seen)
            # every position held is one the model has seen, and none twice
            assert int(positions.max()) < state.seen
            for row in positions.reshape(-1, positions.shape[-1]):
                assert len(set(row.tolist())) == row.numel()
        seen_lengths.append(state.seen)
        assert state.peak_kv_tokens <= budget + chunk

    eng = make_engine(lm.model, get_policy("keydiff"), check, budget=budget, chunk_size=chunk, **STORES[store])
    res = eng.generate(prompt(70), max_new_tokens=5)
    n_chunks = -(-70 // chunk)
    assert len(seen_lengths) == n_chunks + len(res.tokens[0]) - 1
    assert res.stats.kept_tokens == min(budget, 70 + len(res.tokens[0]) - 1)


def test_slot_store_never_reallocates_under_budget():
    lm = tiny()
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=32, chunk_size=16))
    state = eng.prefill(prompt(200))
    for layer in state.cache.layers:
        assert layer.capacity == 48
        assert layer.keys.shape[2] == 48


def test_peak_kv_tokens_is_the_most_held_during_a_forward():
    lm = tiny()
    fits = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=100, chunk_size=32)).prefill(prompt(70))
    assert fits.peak_kv_tokens == 70  # nothing evicted: the whole prompt, never more
    tight = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=32)).prefill(prompt(70))
    assert tight.peak_kv_tokens == 64  # 32, then 32 + 32 = 64 (evicted to 40), then 40 + 6 = 46
