"""Independent requests in one batch (``Engine.generate_batch``) give what each request gives alone.

float64 on llama-tiny with larger random weights (greedy tokens vary from step to step): the same tokens, the
same kept positions in every layer and KV head after *every* step of every request, the same counters, for
every built-in policy, both protocols, shared prefilled contexts, both stores and the graph path's layout.
"""
import functools

import pytest
import torch

from kdeval.baselines import get_policy, policy_names
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo.loading import load_model
from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION

from .helpers import kept_positions, make_engine
from .oracles import EMULATED, GATHER

BUDGET, CHUNK, NEW = 24, 16, 12
LENGTHS = [37, 70, 101, 5, 64, 90, 16]  # a partial last chunk, several chunks, one token short of a chunk, ...
PARAMS = {"snapkv": {"window": 8},  # the default window (32) is more than the budget
          "expected-attention": {"query_window": 20},  # fills up and slides within a request
          "think": {"inner": {"name": "snapkv", "params": {"window": 8}}, "window": 8}}  # rows edited apart
POLICIES = ["keydiff", "keydiff-sw", "sink", "sink-rerotate", "tova", "h2o", "snapkv", "knorm", "random", "think",
            "expected-attention", "full", "merging"]
COUNTERS = ("prompt_tokens", "decode_tokens", "peak_kv_tokens", "kept_tokens")


@functools.lru_cache(maxsize=None)
def lively(dtype: str = "float64"):
    return load_model("random:llama-tiny", device="cpu", dtype=dtype, overrides={"initializer_range": 0.1})


def prompts(lengths=LENGTHS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g) for n in lengths]


def engine(policy, record=None, batch_record=None, **config):
    return make_engine(lively().model, get_policy(policy, **PARAMS.get(policy, {})), record, batch_record,
                       budget=config.pop("budget", BUDGET), chunk_size=CHUNK, **config)


def alone(policy, ps, states=None, protect=None, eos=None, decode_evict=True, **config):
    """Each prompt through ``generate`` at batch 1 (from a fork of its state): results and kept positions after
    every step of each request."""
    steps: list[list] = []
    eng = engine(policy, lambda s: steps[-1].append(kept_positions(s)), **config)
    out = []
    for i, ids in enumerate(ps):
        steps.append([])
        state = states[i].fork() if states and states[i] is not None else None
        out.append(eng.generate(ids.unsqueeze(0), max_new_tokens=NEW, eos_token_id=eos, state=state,
                                protect_last=protect[i] if protect else 0, decode_evict=decode_evict))
    return out, steps


def batched(policy, ps, states=None, protect=None, eos=None, decode_evict=True, **config):
    steps: dict[int, list] = {}
    rows: list[int] = []

    def record(view):
        rows.append(len(view.requests))
        for i in view.requests:
            steps.setdefault(i, []).append(view.kept_positions(i))

    eng = engine(policy, batch_record=record, **config)
    out = eng.generate_batch(ps, max_new_tokens=NEW, eos_token_id=eos, states=states,
                             protect_last=protect or 0, decode_evict=decode_evict)
    return out, [steps[i] for i in range(len(ps))], rows


def assert_same(got, ref, got_steps, ref_steps):
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.tokens == r.tokens, f"request {i}"
        assert len(got_steps[i]) == len(ref_steps[i]), f"request {i}"
        for step, (a, b) in enumerate(zip(got_steps[i], ref_steps[i])):
            for layer, (x, y) in enumerate(zip(a, b)):
                assert torch.equal(x, y), f"request {i}, step {step}, layer {layer}"
        for x, y in zip(kept_positions(g.state), kept_positions(r.state)):
            assert torch.equal(x, y)
        for name in COUNTERS:
            assert getattr(g.stats, name) == getattr(r.stats, name), (i, name)
        assert g.state.seen == r.state.seen and g.state.protected == r.state.protected
        assert g.state.steps == r.state.steps
        assert torch.allclose(g.state.last_logits, r.state.last_logits, rtol=0, atol=1e-10)
        window, ref_window = g.state.cache.query_window, r.state.cache.query_window  # a QueryNeed's recent queries
        assert (window is None) == (ref_window is None)
        if ref_window is not None:
            assert torch.equal(window.count, ref_window.count)
            for layer, q in ref_window.queries.items():
                assert torch.allclose(window.queries[layer], q, rtol=0, atol=1e-10)


def eos_ending_one_request(policy, ps, **kw):
    """A token some request generates early (not first) and another does not: rows finish at different times."""
    ref, _ = alone(policy, ps, **kw)
    return ref[1].tokens[0][4]


def test_every_policy_is_in_the_list():
    assert set(POLICIES) <= set(policy_names())


@pytest.mark.parametrize("policy", POLICIES)
def test_batch_equals_each_request_alone(policy):
    ps = prompts()
    eos = eos_ending_one_request(policy, ps)
    ref, ref_steps = alone(policy, ps, eos=eos)
    got, got_steps, rows = batched(policy, ps, eos=eos)
    assert_same(got, ref, got_steps, ref_steps)
    lengths = [len(r.tokens[0]) for r in ref]
    assert min(lengths) < NEW and max(lengths) == NEW  # rows finished at different times ...
    assert rows[0] == len(ps) and rows[-1] < len(ps) and rows == sorted(rows, reverse=True)  # ... and left


@pytest.mark.parametrize("policy", ["keydiff", "h2o", "snapkv", "random", "expected-attention", "sink-rerotate",
                                    "full"])
@pytest.mark.parametrize("decode_evict", [True, False])
def test_shared_contexts_and_the_context_protocol(policy, decode_evict):
    """Questions continue from prefilled contexts (one context shared by three rows, another by one, two rows
    with none); kvpress's protocol protects each row's question (different lengths), with and without
    eviction while decoding."""
    contexts = prompts([75, 40], seed=1)
    eng = engine(policy)
    states = [eng.prefill(c.unsqueeze(0)) for c in contexts]
    ps = prompts([9, 20, 3, 17, 30, 44], seed=2)
    starts = [states[0], states[0], states[1], None, states[0], None]
    protect = [9, 20, 3, 0, 30, 12]
    ref, ref_steps = alone(policy, ps, starts, protect, decode_evict=decode_evict)
    got, got_steps, _ = batched(policy, ps, starts, protect, decode_evict=decode_evict)
    assert_same(got, ref, got_steps, ref_steps)
    assert [len(s.protected) for s in (states[0], states[1])] == [0, 0]  # the shared states are left as they were
    assert kept_positions(states[0])[0].shape[-1] == (75 if policy == "full" else BUDGET)


@pytest.mark.parametrize("config", [GATHER, {"cuda_graphs": True, **EMULATED}],
                         ids=["gather", "graphs"])
@pytest.mark.parametrize("policy", ["keydiff", "tova", "snapkv"])
def test_other_stores_and_the_graph_path(policy, config):
    """Batches run eagerly on any engine; rows continuing a state prefilled on the graph path (static layout)
    equal that engine's own batch-1 runs."""
    context = prompts([70], seed=3)[0]
    states = [engine(policy, **dict(config)).prefill(context.unsqueeze(0))]
    ps = prompts([21, 50, 8], seed=4)
    starts = [states[0], None, states[0]]
    ref, ref_steps = alone(policy, ps, starts, **dict(config))
    got, got_steps, _ = batched(policy, ps, starts, **dict(config))
    assert_same(got, ref, got_steps, ref_steps)


def test_a_state_holding_more_than_the_budget():
    """A context prefilled under a larger budget: its first step in the batch evicts the surplus (more kept
    tokens move than the step has columns), as at batch 1."""
    context = prompts([80], seed=6)[0]
    states = [engine("keydiff", budget=60).prefill(context.unsqueeze(0))]
    ps = prompts([3, 40], seed=7)
    ref, ref_steps = alone("keydiff", ps, [states[0], None])
    got, got_steps, _ = batched("keydiff", ps, [states[0], None])
    assert_same(got, ref, got_steps, ref_steps)
    assert got_steps[0][0][0].shape[-1] == BUDGET


def test_padding_takes_no_budget_and_is_never_kept():
    """After every step each row holds min(budget, seen) real tokens (distinct, below its own next position);
    empty and padding slots past them are clean."""
    ps = prompts()
    checked = []

    def check(view):
        for r, i in enumerate(view.requests):
            for layer, lengths in zip(view.cache.layers, view.cache.lengths):  # lengths[layer][row]
                n = lengths[r]
                assert n == min(BUDGET, view.seen[r])
                pos = layer.positions[r, :, :n]
                assert int(pos.max()) < view.seen[r]
                assert all(len(set(h.tolist())) == n for h in pos)
                assert bool((layer.positions[r, :, n:] == EMPTY_POSITION).all())
                assert bool((layer.keys[r, :, n:] == 0).all())
        checked.append(len(view.requests))

    eng = Engine(lively().model, get_policy("keydiff"), EngineConfig(budget=BUDGET, chunk_size=CHUNK),
                 on_batch_step=check)
    res = eng.generate_batch(ps, max_new_tokens=NEW)
    assert len(checked) == max(-(-n // CHUNK) + NEW - 1 for n in LENGTHS)  # lockstep: one step per row each
    assert all(r.stats.kept_tokens == min(BUDGET, n + NEW - 1) for r, n in zip(res, LENGTHS))


@pytest.mark.parametrize("policy", ["keydiff", "expected-attention"])  # its state carries the query window
def test_result_state_continues_like_the_batch_1_state(policy):
    ps = prompts([50, 23])
    ref, _ = alone(policy, ps)
    got, _, _ = batched(policy, ps)
    eng = engine(policy)
    more = prompts([19], seed=5)[0].unsqueeze(0)
    for g, r in zip(got, ref):
        a = eng.generate(more, max_new_tokens=5, state=g.state)
        b = eng.generate(more, max_new_tokens=5, state=r.state)
        assert a.tokens == b.tokens


def test_float32_batch_matches_within_tolerance():
    """float32: the same tokens and kept sets here; last prompt logits within 1e-5."""
    lm = lively("float32")
    ps = prompts()
    eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=BUDGET, chunk_size=CHUNK))
    got = eng.generate_batch(ps, max_new_tokens=NEW)
    for ids, g in zip(ps, got):
        r = eng.generate(ids.unsqueeze(0), max_new_tokens=NEW)
        assert g.tokens == r.tokens
        assert torch.allclose(g.state.last_logits, r.state.last_logits, rtol=0, atol=1e-5)


def test_bad_requests_name_the_field():
    eng = engine("keydiff")
    ps = prompts([10, 12])
    cases = [
        (dict(prompts=[]), "prompts: expected at least one prompt"),
        (dict(prompts=[ps[0], []]), "prompts[1]: expected a non-empty list of token ids"),
        (dict(prompts=ps, max_new_tokens=[3]), "max_new_tokens: expected one value per prompt (2), got 1"),
        (dict(prompts=ps, max_new_tokens=[3, -1]), "max_new_tokens[1]: must be an integer >= 0"),
        (dict(prompts=ps, protect_last=[0, 13]), "protect_last[1]: expected 0 .. 12 prompt tokens, got 13"),
        (dict(prompts=ps, states=[None, "x"]), "states[1]: expected a batch-1 PrefillState or None"),
        (dict(prompts=[torch.zeros(5000, dtype=torch.long)]), "prompts[0]: prompt: "),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError) as err:
            eng.generate_batch(**kwargs)
        assert str(err.value).startswith(message), str(err.value)
    two = eng.prefill(torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"states\[0\]: expected a batch-1 PrefillState"):
        eng.generate_batch(ps, states=[two, None])
    eager = load_model("random:llama-tiny", device="cpu", attn_implementation="eager")
    with pytest.raises(ValueError, match="prompts: a batch of requests runs on SDPA"):
        Engine(eager.model, get_policy("keydiff"), EngineConfig(budget=BUDGET)).generate_batch(ps)
