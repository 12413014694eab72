"""The prompt kept whole, eviction among generated tokens only (``compress: generated``, R-KV's protocol): the
engine runs it as a prompt protected whole (``protect_last=len(prompt)``): every prompt chunk is fed
without eviction and protected, and from the first generated token on each evicting step keeps the prompt
plus N generated tokens.

Checked on every layout (slot store, gather store, the graph path's static layout, a head-shared pool, ragged
batches) and with shared prompt steps: no prompt position is ever evicted, the cache holds at most prompt + N
+ 1 tokens per layer and KV head over a long generation, and a batch gives each request what it gets alone."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff.step.shared import SharedSteps

from .helpers import assert_same_run, kept_positions, make_engine, prompt
from .oracles import EMULATED, GATHER
from .test_protocols import lively

LAYOUTS = {"slot": {}, "gather": GATHER, "static": {"cuda_graphs": True, **EMULATED}}
P, N, B, G = 40, 16, 16, 80  # prompt, budget, chunk, generated tokens


def watched(policy: str, layout: dict, n_prompt: int = P):
    """An engine whose every step is checked after its eviction: each row holds every prompt position it has
    seen and at most prompt + N tokens per layer; returns (engine, the steps' sizes seen)."""
    sizes: list[int] = []

    def check(state):
        prompt_seen = set(range(min(n_prompt, state.seen)))
        for layer in state.cache.layers:
            positions = layer.view()[1]
            if hasattr(layer, "tags"):  # a head pool: one row of slots per layer, tagged with their KV head
                tags = layer.tags[:, :, : positions.shape[-1]]
                rows = [positions[tags == h].tolist() for h in range(int(layer.tags.max()) + 1)]
                pooled = sum(len(set(r) - prompt_seen) for r in rows)  # generated tokens held, all heads
                assert pooled <= len(rows) * N  # the pool shares H * N generated slots among its heads
            else:
                rows = positions.reshape(-1, positions.shape[-1]).tolist()
                assert all(len(r) <= n_prompt + N for r in rows)
            for row in rows:
                assert prompt_seen <= set(row), f"a prompt position was evicted at seen={state.seen}"
            sizes.append(layer.length)

    return make_engine(lively().model, get_policy(policy), check, budget=N, chunk_size=B, **layout), sizes


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("policy", ["keydiff", "random", "sink", "h2o", "ada"])
def test_no_prompt_position_evicted_and_the_bound_holds_over_a_long_generation(policy, layout):
    eng, sizes = watched(policy, LAYOUTS[layout])
    res = eng.generate(prompt(P, seed=3), max_new_tokens=G, protect_last=P)
    assert len(res.tokens[0]) == G  # long past the budget: G - 1 = 79 generated tokens fed, N = 16 kept
    assert res.stats.peak_kv_tokens == P + N + 1  # a decode step's forward holds one token more
    assert res.stats.kept_tokens == P + N
    assert max(sizes) == P + N and res.state.protected == [(0, P)]
    if policy == "ada":  # a head pool's heads hold N generated tokens on average (checked at every step)
        return
    positions = kept_positions(res.state)[0]
    assert positions.shape[-1] == P + N
    generated = positions[..., P:]  # the N kept of the G - 1 generated tokens fed, per KV head
    assert bool((generated >= P).all()) and bool((generated < P + G - 1).all())


def test_eviction_chooses_among_generated_tokens_by_the_policy():
    """Not only the most recent: KeyDiff keeps generated tokens that a recency rule (sink: its sinks lie in
    the kept prompt, so it keeps the N most recent generated tokens) drops, and the two keep the same
    prompt."""
    ids = prompt(P, seed=3)
    kd = watched("keydiff", {})[0].generate(ids, max_new_tokens=G, protect_last=P)
    recent = make_engine(lively().model, get_policy("sink"), budget=N, chunk_size=B).generate(
        ids, max_new_tokens=G, protect_last=P)
    a, b = kept_positions(kd.state)[0], kept_positions(recent.state)[0]
    assert torch.equal(a[..., :P], b[..., :P])
    assert torch.equal(b[..., P:], torch.arange(P + G - 1 - N, P + G - 1).expand_as(b[..., P:]))
    assert not torch.equal(a[..., P:], b[..., P:])


@pytest.mark.parametrize("policy", ["keydiff", "random", "ada"])
def test_a_batch_gives_each_prompt_what_it_gets_alone(policy):
    eng = make_engine(lively().model, get_policy(policy), budget=N, chunk_size=B)
    ps = [prompt(n, seed=s)[0] for n, s in ((P, 3), (25, 5), (57, 7))]
    got = eng.generate_batch(ps, max_new_tokens=[G, 30, 50], protect_last=[len(p) for p in ps])
    for ids, max_new, res in zip(ps, [G, 30, 50], got):
        alone = eng.generate(ids.unsqueeze(0), max_new_tokens=max_new, protect_last=len(ids))
        assert_same_run(res, alone)
        assert res.stats.kept_tokens == len(ids) + N and res.state.protected == [(0, len(ids))]


def test_shared_steps_run_up_to_where_generation_starts():
    """A prompt protected whole is shared (replayed or recorded) up to its last token, its steps protected;
    the rest continues in a batch and gives what the prompt gives alone."""
    lm = lively()
    ids = prompt(P + 5, seed=9)
    store = SharedSteps([get_policy("keydiff")], max_tokens=P + 5)
    eng = make_engine(lm.model, get_policy("keydiff"), budget=N, chunk_size=B)
    with eng.sharing(store):
        start = eng.prefill_shared(ids, protect_last=ids.shape[1])
    assert start.seen == 2 * B  # the full chunks before the last token (45 tokens: 16 + 16, then 13 left)
    assert start.protected == [(0, 2 * B)] and store.recorded == 2
    rest = ids[0, start.seen:]
    got = eng.generate_batch([rest], max_new_tokens=30, states=[start], protect_last=[len(rest)])[0]
    alone = eng.generate(ids, max_new_tokens=30, protect_last=ids.shape[1])
    assert got.tokens == alone.tokens
    for a, b in zip(kept_positions(got.state), kept_positions(alone.state)):
        assert torch.equal(a, b)
    assert got.state.protected == [(0, ids.shape[1])]
