"""The static-layout step that CUDA graphs capture gives the gather store's tokens, kept sets and logits.

On CPU the path runs emulated (same static buffers, a tensor ``seen``, plain calls instead of replays);
bench/gpu_check.py checks the real graphs on a GPU against the same step run eagerly.
"""
import pytest
import torch

from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.selection import rank_empty
from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION
from kdeval.keydiff.cache.static import EmptySlots, static_mask

from .helpers import assert_same_run, kept_positions, make_engine, prompt, tiny
from .oracles import EMULATED, GATHER

# Policies that run eagerly: those whose scores read the step count, those that read recent queries or
# re-rotate keys (test_query_policies_run_eagerly, tests/baselines/test_sink_rerotate.py) and those with
# per-layer budgets (PyramidKV: the static layout gives every layer N slots; tests/baselines/test_pyramidkv.py)
# or a pool shared by a layer's heads (AdaKV: tests/baselines/test_adakv.py), or a repeat pass (KVzip:
# tests/baselines/test_kvzip.py).
GRAPH_SAFE = [n for n in policy_names() if n != "full" and not get_policy(n).needs().reads_step
              and get_policy(n).needs().queries is None and not get_policy(n).needs().rerotates
              and not get_policy(n).needs().shares_heads and get_policy(n).needs().repeat is None
              and len(set(get_policy(n).layer_budgets(40, 3))) == 1]


@pytest.mark.parametrize("policy", GRAPH_SAFE)
@pytest.mark.parametrize("length, new_tokens, graphs", [
    # fills (two chunks with room, one that also evicts), then steady chunks and decoding
    (130, 8, {(1, 16, "room"), (1, 16, "partial"), (1, 16, "full"), (1, 1, "full")}),
    (25, 24, {(1, 16, "room"), (1, 1, "room"), (1, 1, "full")}),  # the cache fills up while decoding
])
def test_static_graph_step_equals_gather(policy, length, new_tokens, graphs):
    """The static layout (emulated graphs) keeps exactly what the gather store keeps and gives its logits."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(length, seed=9)
    used = []
    static = make_engine(lm.model, get_policy(policy), lambda s: used.append(set(s.cache.graphs)), budget=40,
                         chunk_size=16, cuda_graphs=True, **EMULATED)
    gather = Engine(lm.model, get_policy(policy), EngineConfig(budget=40, chunk_size=16), **GATHER)
    got, ref = static.generate(ids, max_new_tokens=new_tokens), gather.generate(ids, max_new_tokens=new_tokens)
    assert used[-1] == graphs
    assert_same_run(got, ref, atol=1e-9)


def test_static_layout_keeps_valid_slots_a_prefix():
    """Invariant of the static layout: after every step the ``min(seen, N)`` valid tokens fill slots [0, length)
    and the head slots above them are empty, in every layer and head (batch of 2, GQA 4:1)."""
    lm = tiny()
    budget = 40

    def check(state):
        for layer in state.cache.layers:
            n = layer.length
            assert n == min(state.seen, budget)
            pos = layer.positions
            assert bool((pos[:, :, :n] < state.seen).all())
            assert bool((pos[:, :, n:budget] == EMPTY_POSITION).all())
            held = pos[:, :, :n].sort(-1).values
            assert bool((held[..., 1:] > held[..., :-1]).all())  # no token held twice

    eng = make_engine(lm.model, get_policy("keydiff"), check, budget=budget, chunk_size=16, cuda_graphs=True,
                      **EMULATED)
    eng.generate(prompt(70, batch=2), max_new_tokens=5)


def test_static_mask_known_answer():
    mask = static_mask(budget=4, t=2, cached=3, device=torch.device("cpu"))
    expected = torch.tensor([[1, 1, 1, 0, 1, 0],
                             [1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    assert mask.shape == (1, 1, 2, 6)
    assert torch.equal(mask[0, 0], expected)


def test_empty_slots_are_freed_first_lowest_first():
    scores = torch.tensor([[[0.5, -3.0, 9.0, 9.0, 9.0, 0.1, 0.2]]])  # budget 5, 2 cached, chunk of 2
    ranked = rank_empty(scores, EmptySlots(budget=5, t=2, cached=2, device=scores.device).mask)
    drop = torch.topk(ranked, 2, dim=-1, largest=False).indices.sort(-1).values
    assert drop.tolist() == [[[2, 3]]]
    assert torch.equal(ranked[..., :2], scores[..., :2]) and torch.equal(ranked[..., 5:], scores[..., 5:])


def test_state_of_another_layout_refused():
    lm = tiny()
    plain = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16))
    static = make_engine(lm.model, get_policy("keydiff"), budget=40, chunk_size=16, cuda_graphs=True,
                         **EMULATED)
    state = plain.prefill(prompt(50))
    with pytest.raises(ValueError, match=r"state: its cache was laid out by an engine with other"):
        static.prefill(prompt(10), state=state)


def test_graphs_refused_without_cuda():
    with pytest.raises(ValueError, match=r"cuda_graphs: needs a CUDA device"):
        Engine(tiny().model, get_policy("keydiff"), EngineConfig(budget=40, cuda_graphs=True))


def test_random_policy_never_captured():
    lm = tiny()
    eng = make_engine(lm.model, get_policy("random"), budget=40, chunk_size=16, cuda_graphs=True, **EMULATED)
    assert not eng.plan.use_graphs
    res = eng.generate(prompt(100), max_new_tokens=4)
    assert res.state.cache.graphs == {}


def test_graphs_default_off_without_cuda():
    eng = Engine(tiny().model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16))
    assert eng.config.cuda_graphs is None and not eng.plan.use_graphs
    assert eng.generate(prompt(100), max_new_tokens=4).state.cache.static_base is None


def test_query_policies_run_eagerly():
    """A policy with a QueryNeed keeps a window of recent queries per request between steps: the engine runs it
    eagerly even when graphs are asked for, and it gives the eager engine's run."""
    lm = tiny("random:llama-tiny", 2, "float64")
    graphs = Engine(lm.model, get_policy("expected-attention"), EngineConfig(budget=40, chunk_size=16, cuda_graphs=True),
                    **EMULATED)
    eager = Engine(lm.model, get_policy("expected-attention"), EngineConfig(budget=40, chunk_size=16))
    assert not graphs.plan.use_graphs and graphs.plan.needs.queries is not None
    ids = prompt(90, seed=9)
    got = graphs.generate(ids, max_new_tokens=6)
    assert not got.state.cache.graphs and got.state.cache.static_base is None
    assert_same_run(got, eager.generate(ids, max_new_tokens=6), atol=0)


def test_forked_static_state_continues_like_gather():
    """A shared prefix prefilled once, forked, then continued (run_task's shared-context path): the forked
    static cache continues exactly like the gather store's, and the original stays."""
    lm = tiny("random:llama-tiny", 2, "float64")
    prefix, suffix = prompt(70, seed=4), prompt(20, seed=5)
    out = {}
    for name, settings in (("gather", GATHER),
                           ("static", dict(cuda_graphs=True, **EMULATED))):
        eng = make_engine(lm.model, get_policy("keydiff"), budget=40, chunk_size=16, **settings)
        state = eng.prefill(prefix)
        before = kept_positions(state)
        fork = state.fork()
        first = eng.generate(suffix, max_new_tokens=5, state=fork)
        second = eng.generate(suffix, max_new_tokens=5, state=state.fork())
        assert first.tokens == second.tokens
        for a, b in zip(before, kept_positions(state)):
            assert torch.equal(a, b)
        out[name] = first
    assert_same_run(out["static"], out["gather"])


def test_fork_into_an_earlier_fork_reuses_its_buffers_and_graphs():
    """``fork(into=)`` overwrites an earlier fork in place: same results as a fresh deep copy, same buffers,
    same captured steps (so CUDA graphs need not be captured again for the next question)."""
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = make_engine(lm.model, get_policy("tova"), budget=40, chunk_size=16, cuda_graphs=True, **EMULATED)
    state = eng.prefill(prompt(70, seed=4))
    scratch = state.fork()
    first = eng.generate(prompt(40, seed=5), max_new_tokens=6, state=scratch)
    steps, ptr = dict(scratch.cache.graphs), scratch.cache.layers[0].keys.data_ptr()
    for seed in (6, 7):
        question = prompt(40, seed=seed)
        fresh = eng.generate(question, max_new_tokens=6, state=state.fork())
        reused = eng.generate(question, max_new_tokens=6, state=state.fork(into=scratch))
        assert reused.state is scratch and scratch.cache.layers[0].keys.data_ptr() == ptr
        assert all(scratch.cache.graphs[k] is v for k, v in steps.items())
        assert reused.tokens == fresh.tokens
        assert reused.stats.kept_tokens == fresh.stats.kept_tokens
        for a, b in zip(kept_positions(reused.state), kept_positions(fresh.state)):
            assert torch.equal(a, b)
    assert first.tokens  # the first question ran on the deep copy the later ones reuse


def test_fork_into_other_layouts_deep_copies():
    lm = tiny()
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16))
    state = eng.prefill(prompt(70))
    earlier = state.fork()
    again = state.fork(into=earlier)
    assert again is not earlier and again.cache is not state.cache


def test_chunks_with_room_skip_scoring_but_not_observation():
    """While the empty head slots take a whole chunk nothing is scored (the chunk just moves into them), yet
    the policy still observes every step (H2O keeps accumulating attention)."""
    lm = tiny()
    policy = get_policy("h2o")
    calls = {"score": 0, "observe": 0}
    score, observe = policy.score, policy.observe

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    policy.score, policy.observe = counted("score", score), counted("observe", observe)
    seen = []
    eng = make_engine(lm.model, policy, lambda s: seen.append((s.cache.length, dict(calls))), budget=48, chunk_size=16,
                      cuda_graphs=True, **EMULATED)
    eng.prefill(prompt(80))
    assert [n for n, _ in seen] == [16, 32, 48, 48, 48]
    assert all(c["score"] == 0 and c["observe"] > 0 for _, c in seen[:3])
    assert seen[3][1]["score"] > 0
