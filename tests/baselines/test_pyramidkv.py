"""PyramidKV: SnapKV's selection under per-layer budgets falling with depth, summing to layers x N."""
import random
from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.snapkv import SnapKV
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.keydiff import Engine, EngineConfig

from ..keydiff.helpers import (
    assert_ragged_batch_matches_alone, assert_same_run, kept_positions, make_engine, prompt, tiny,
)
from ..keydiff.oracles import EMULATED


# Worked by hand. N = 40, window 8, 4 layers, beta 2: S = 32 selectable tokens per layer on average, shares
# from 2S - S/2 = 48 down to S/2 = 16 in steps of 32/3: 48, 37.33, 26.67, 16 -> floors 48, 37, 26, 16 (127 of
# 128); the one left goes to the largest fraction (.67, layer 2) -> 48, 37, 27, 16, plus the window.
# N = 11, window 1, 3 layers, beta 4: S = 10, shares 17.5, 10, 2.5 -> floors 17, 10, 2 (29 of 30); layers 0 and
# 2 tie at .5 and the shallower one takes it -> 18, 10, 2, plus the window.
@pytest.mark.parametrize("n,window,layers,beta,expect", [
    (40, 8, 4, 2, [56, 45, 35, 24]),
    (11, 1, 3, 4, [19, 11, 3]),
    (40, 8, 4, 1, [40, 40, 40, 40]),  # beta 1: uniform
    (40, 8, 1, 20, [40]),
])
def test_layer_budgets_worked_by_hand(n, window, layers, beta, expect):
    assert get_policy("pyramidkv", window=window, beta=beta).layer_budgets(n, layers) == expect


def test_layer_budgets_sum_to_the_uniform_total_fall_with_depth_and_round_the_linear_rule():
    rng = random.Random(0)
    for _ in range(300):
        window, layers = rng.randint(1, 64), rng.randint(2, 80)
        n, beta = window + rng.randint(0, 5000), rng.choice([1, 1.5, 2, 7, 20, 64.25])
        budgets = get_policy("pyramidkv", window=window, beta=beta).layer_budgets(n, layers)
        assert sum(budgets) == layers * n
        assert all(a >= b for a, b in zip(budgets, budgets[1:]))
        s = n - window
        lo = Fraction(s) / Fraction(beta)
        for i, b in enumerate(budgets):  # within one token of the exact line, never below the window
            exact = window + (2 * s - lo) - (2 * s - 2 * lo) * i / (layers - 1)
            assert abs(b - exact) < 1 and b >= window


def engine(policy, budget, chunk, kv_heads=2, dtype="float64", **cfg):
    return make_engine(tiny("random:llama-tiny", kv_heads, dtype).model, policy, budget=budget, chunk_size=chunk,
                       **cfg)


@pytest.mark.parametrize("kv_heads", [2, 8])
def test_one_chunk_keeps_in_each_layer_what_snapkv_keeps_under_that_layers_budget(kv_heads):
    """One chunk covering the prompt: a layer's scores do not depend on other layers' evictions, so layer ``l``
    keeps exactly SnapKV's selection under budget ``b_l``."""
    ids, n = prompt(80, seed=5), 30
    pol = get_policy("pyramidkv", window=6, kernel=5, pooling="avg", beta=3)
    state = engine(pol, n, 80, kv_heads).prefill(ids)
    budgets = pol.layer_budgets(n, len(state.cache.layers))
    assert budgets[0] > n > budgets[-1]
    for idx, budget in enumerate(budgets):
        alone = engine(get_policy("snapkv", window=6, kernel=5, pooling="avg"), budget, 80, kv_heads).prefill(ids)
        assert torch.equal(kept_positions(state)[idx], kept_positions(alone)[idx])
        assert state.cache.layers[idx].length == budget


def test_every_step_keeps_the_layer_budgets_and_protected_question():
    """Chunked prefill, kvpress' protocol (a question protected on top) and decoding: after every step layer
    ``l`` holds min(b_l, unprotected) + protected tokens, and never more than b_l + B during a forward."""
    pol = get_policy("pyramidkv", window=4, beta=4)
    n, chunk = 24, 16
    lm = tiny("random:llama-tiny", 2)
    budgets = pol.layer_budgets(n, lm.model.config.num_hidden_layers)
    seen = []

    def check(state):
        for layer, budget in zip(state.cache.layers, budgets):
            kept = layer.view()[1][0]
            protected = sum(int(((kept >= s) & (kept < e)).sum()) for s, e in state.protected) // kept.shape[0]
            assert layer.length == min(budget, state.seen - state.n_protected) + protected
            assert protected == state.n_protected
        seen.append(state.seen)

    eng = Engine(lm.model, pol, EngineConfig(budget=n, chunk_size=chunk), on_step=check)
    res = eng.generate(prompt(100, seed=2), max_new_tokens=5, protect_last=10)
    assert len(seen) > 8 and res.stats.peak_kv_tokens <= budgets[0] + chunk + 10


@pytest.mark.parametrize("protect_last,decode_evict,grown", [(0, True, 0), (10, False, 10 + 20 - 1)])
def test_kv_bytes_equal_the_uniform_policys(protect_last, decode_evict, grown):
    """Same model, same N and B: PyramidKV's per-layer buffers hold as many bytes as SnapKV's uniform ones, also
    when a protected question and decoding without eviction grow each layer by the same tokens."""
    ids = prompt(120, seed=1)
    got = {}
    for name in ("pyramidkv", "snapkv"):
        res = engine(get_policy(name, window=8), 40, 16, dtype="float32").generate(
            ids, max_new_tokens=20, protect_last=protect_last, decode_evict=decode_evict)
        got[name] = (res.stats.peak_kv_bytes, res.stats.kv_cache_bytes)
        slots = [layer.keys.shape[2] for layer in res.state.cache.layers]
        assert slots == [b + max(16, grown) for b in get_policy(name, window=8).layer_budgets(40, len(slots))]
    assert got["pyramidkv"] == got["snapkv"]


def test_graphs_are_refused_and_the_eager_run_is_the_same():
    """Non-uniform budgets: the engine runs eagerly even when asked for graphs (no static layout), and keeps
    and generates what the plain engine does; a uniform pyramid (beta 1) still takes the static layout."""
    ids = prompt(130, seed=11)
    graphs = dict(cuda_graphs=True, **EMULATED)
    eng = engine(get_policy("pyramidkv", window=8), 40, 16, **graphs)
    assert not eng.plan.use_graphs
    assert_same_run(eng.generate(ids, max_new_tokens=6),
                    engine(get_policy("pyramidkv", window=8), 40, 16).generate(ids, max_new_tokens=6), atol=1e-9)
    assert engine(get_policy("pyramidkv", window=8, beta=1), 40, 16, **graphs).plan.use_graphs


def test_a_ragged_batch_keeps_what_each_request_keeps_alone():
    assert_ragged_batch_matches_alone(get_policy("pyramidkv", window=8, beta=5))


def test_a_ragged_batch_after_shared_states_and_with_protected_questions():
    """Rows start from prefilled states (per-layer counts loaded into the batch) and protect questions of
    other lengths; each row equals its own batch-1 run."""
    pol = get_policy("pyramidkv", window=4, beta=3)
    eng = engine(pol, 24, 16)
    g = torch.Generator().manual_seed(8)
    context = torch.randint(0, 256, (1, 50), generator=g)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (9, 30)]
    states = [eng.prefill(context), None]
    got = eng.generate_batch(ps, max_new_tokens=6, states=states, protect_last=[4, 7])
    for ids, state, protect_last, res in zip(ps, states, (4, 7), got):
        alone = eng.generate(ids.unsqueeze(0), max_new_tokens=6, state=state.fork() if state else None,
                             protect_last=protect_last)
        assert_same_run(res, alone)


@dataclass
class _StarvedLastLayer(SnapKV):
    """A test policy whose last layer would get fewer tokens than its window."""

    def layer_budgets(self, budget, num_layers):
        return [budget + 20] * (num_layers - 1) + [budget - 20 * (num_layers - 1)]


@pytest.mark.parametrize("make,msg", [
    (lambda: get_policy("pyramidkv", beta=0.5), r"beta: must be a number >= 1, got 0.5"),
    (lambda: get_policy("pyramidkv", beta="steep"), r"beta: policy 'pyramidkv' expects float, got 'steep'"),
    (lambda: engine(get_policy("pyramidkv"), 20, 16),
     r"budget: must be >= the 32 tokens policy 'pyramidkv' always keeps \(n_sink=0 \+ recent=32\), got 20"),
    (lambda: engine(_StarvedLastLayer(window=8), 44, 16),
     r"budget: layer 2 keeps 4 of N=44 tokens under policy 'snapkv', must be >= the 8 tokens"),
])
def test_bad_input(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


def test_a_budget_below_the_window_is_a_grid_error_naming_budgets():
    grid = """
name: pyramid
models: [random:llama-tiny]
policies: [{name: pyramidkv, params: {window: 48, beta: 4}}]
budgets: [32, 64]
chunk_sizes: [16]
tasks:
  - {name: math500, samples: 1}
"""
    with pytest.raises(GridError) as e:
        parse_grid(grid)
    assert "budgets: must be >= the 48 tokens policy 'pyramidkv' always keeps" in str(e.value)
    assert "got 32 (policies[0])" in str(e.value) and "got 64" not in str(e.value)


def test_cells_hash_the_snapkv_code_it_scores_with():
    from kdeval.cluster import catalog

    assert catalog.policy_source_files("pyramidkv") == ["baselines/pyramidkv.py", "baselines/snapkv.py"]
