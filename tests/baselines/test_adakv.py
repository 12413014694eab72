"""AdaKV: a layer's H x N kept tokens shared among its KV heads by an inner policy's scores, over one pool of
H x (N + B) slots per layer (kdeval/keydiff/cache/headpool.py)."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import parse_grid
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.cache.headpool import select_across_heads
from kdeval.keydiff.policy.keydiff import keydiff_scores

from ..keydiff.helpers import assert_ragged_batch_matches_alone, assert_same_run, kept_positions, make_engine, prompt, tiny
from ..keydiff.oracles import EMULATED, GATHER

INF = float("inf")


def head_sets(layer) -> list[set[int]]:
    """Batch row 0's positions per KV head of a pool layer."""
    n = layer.slots
    tags, positions = layer.tags[0, 0, :n].tolist(), layer.positions[0, 0, :n].tolist()
    return [{p for g, p in zip(tags, positions) if g == h} for h in range(layer.heads)]


def select(scores, positions, valid, keep, safeguard, raised=None):
    scores, positions, valid = torch.tensor([scores]), torch.tensor([positions]), torch.tensor([valid])
    if raised is not None:  # what raise_kept does to the protected entries
        scores = scores.masked_fill(torch.tensor([raised]), INF)
    kept = select_across_heads(scores, positions, valid, safeguard, keep)[0]
    return [sorted(p for p, k in zip(ps, ks) if k) for ps, ks in zip(positions[0].tolist(), kept.tolist())]


# Worked by hand: 2 heads, N = 2 (keep 4). Head 0 holds positions 0-3 scored .9 .1 .8 .7, head 1 positions 0, 2, 3
# (one padding entry) scored .02 .03 .01. Without a safeguard the 4 best are all head 0's; with one token per
# head safeguarded, head 1 keeps its best (position 2) and head 0 its best (0) plus the next two best (2, 3).
HEADS = dict(scores=[[.9, .1, .8, .7], [.02, .03, .01, 5.0]], positions=[[0, 1, 2, 3], [0, 2, 3, 2**62]],
             valid=[[True] * 4, [True, True, True, False]])


def test_selection_worked_by_hand():
    assert select(**HEADS, keep=4, safeguard=0) == [[0, 1, 2, 3], []]
    assert select(**HEADS, keep=4, safeguard=1) == [[0, 2, 3], [2]]
    # a raised (protected) token is kept whatever its score, and counts as its head's safeguarded best (kvpress
    # safeguards the best scores after protection): head 1 keeps position 3, head 0 its three best ...
    raised = [[False] * 4, [False, False, True, False]]
    assert select(**HEADS, keep=4, safeguard=1, raised=raised) == [[0, 2, 3], [3]]
    assert select(**HEADS, keep=4, safeguard=2, raised=raised) == [[0, 2], [2, 3]]
    # ... and padding never is, even with the best score (5.0 above)
    assert select(**HEADS, keep=7, safeguard=0) == [[0, 1, 2, 3], [0, 2, 3]]


def test_equal_scores_are_evicted_oldest_first_then_lower_head_first():
    got = select([[1.0, 1.0], [1.0, 1.0]], [[3, 5], [3, 4]], [[True, True], [True, True]], keep=3, safeguard=0)
    assert got == [[5], [3, 4]]
    got = select([[1.0, 1.0], [1.0, 1.0]], [[3, 5], [3, 4]], [[True, True], [True, True]], keep=2, safeguard=0)
    assert got == [[5], [4]]


def engine(policy, budget, chunk, kv_heads=2, dtype="float64", **kw):
    return make_engine(tiny("random:llama-tiny", kv_heads, dtype).model, policy, budget=budget, chunk_size=chunk,
                       **kw)


@pytest.mark.parametrize("inner", ["keydiff", "snapkv"])
def test_one_kv_head_keeps_and_generates_what_the_inner_policy_does(inner):
    """With one KV head there is nothing to share: the pool (its mask, scoring and compaction) must give the
    inner policy's uniform run exactly."""
    ids = prompt(100, seed=4)
    got = engine(get_policy("ada", inner=inner), 40, 16, kv_heads=1).generate(ids, max_new_tokens=8)
    ref = engine(get_policy(inner), 40, 16, kv_heads=1).generate(ids, max_new_tokens=8)
    assert_same_run(got, ref, atol=1e-9)


@pytest.mark.parametrize("kv_heads", [2, 8])
def test_without_eviction_the_pool_attends_as_the_full_cache(kv_heads):
    """A budget above the prompt: nothing is evicted, and chunked prefill over the pool (head tags and causal
    positions in one mask) gives the full cache's logits."""
    ids = prompt(60, seed=6)
    got = engine(get_policy("ada-keydiff"), 80, 16, kv_heads).prefill(ids, collect_logits=True)
    ref = engine(get_policy("full"), None, 16, kv_heads).prefill(ids, collect_logits=True)
    assert (got.logits - ref.logits).abs().max().item() < 1e-9


def test_one_chunk_keeps_per_head_what_the_allocation_rule_gives():
    """One chunk over the whole prompt: each head's KeyDiff scores over all 80 keys (from a full-cache run), its
    floor(0.2 x 24) = 4 best safeguarded, then the layer's best 2 x 24 = 48 tokens across heads."""
    ids, n, alpha = prompt(80, seed=5), 24, 0.2
    state = engine(get_policy("ada-keydiff", alpha_safeguard=alpha), n, 80).prefill(ids)
    full = engine(get_policy("full"), None, 80, **GATHER).prefill(ids)
    uneven = False
    for layer, ref in zip(state.cache.layers, full.cache.layers):
        scores = keydiff_scores(ref.keys)[0].tolist()  # [heads][80]
        safe = {(h, p) for h, row in enumerate(scores)
                for p in sorted(range(80), key=lambda p: -row[p])[: int(alpha * n)]}
        rest = sorted(((row[p], h, p) for h, row in enumerate(scores) for p in range(80) if (h, p) not in safe),
                      reverse=True)
        keep = safe | {(h, p) for _, h, p in rest[: 2 * n - len(safe)]}
        expect = [{p for g, p in keep if g == h} for h in range(2)]
        assert head_sets(layer) == expect
        assert layer.head_counts()[0].tolist() == [len(e) for e in expect] and layer.slots == 2 * n
        uneven |= len(expect[0]) != n
    assert uneven  # the heads did not all keep N


@pytest.mark.parametrize("protect_last,decode_evict,grown", [(0, True, 0), (10, False, 10 + 20 - 1)])
def test_kv_bytes_equal_the_uniform_policys(protect_last, decode_evict, grown):
    """Same model, N and B: the pool holds exactly the uniform policy's bytes, also when a protected question
    and decoding without eviction grow it."""
    ids = prompt(120, seed=1)
    got = {}
    for name in ("ada-snapkv", "snapkv"):
        res = engine(get_policy(name, window=8) if name == "snapkv" else get_policy(name), 40, 16,
                     dtype="float32").generate(ids, max_new_tokens=20, protect_last=protect_last,
                                               decode_evict=decode_evict)
        got[name] = (res.stats.peak_kv_bytes, res.stats.kv_cache_bytes)
    assert got["ada-snapkv"] == got["snapkv"]
    assert got["snapkv"][0] == 3 * 2 * 2 * (40 + max(16, grown)) * 16 * 4  # layers x K,V x heads x slots x d x 4B


def test_every_step_keeps_the_layer_total_and_the_protected_question_in_every_head():
    """kvpress' protocol and decoding: after every step a layer holds H x (min(N, unprotected) + protected)
    tokens, every head holds every protected position, and no forward holds more than H x (N + B + P)."""
    n, chunk, heads = 24, 16, 2
    seen = []

    def check(state):
        for layer in state.cache.layers:
            assert layer.slots == heads * (min(n, state.seen - state.n_protected) + state.n_protected)
            for kept in head_sets(layer):
                assert all(p in kept for s, e in state.protected for p in range(s, e))
        seen.append(state.seen)

    eng = engine(get_policy("ada-keydiff"), n, chunk, on_step=check)
    res = eng.generate(prompt(100, seed=2), max_new_tokens=5, protect_last=10)
    assert len(seen) > 8 and res.stats.peak_kv_tokens <= n + chunk + 10


def test_graphs_are_refused():
    assert not engine(get_policy("ada-keydiff"), 40, 16, cuda_graphs=True, **EMULATED).plan.use_graphs


def test_a_ragged_batch_keeps_what_each_request_keeps_alone():
    assert_ragged_batch_matches_alone(get_policy("ada-keydiff", alpha_safeguard=0.3))


def test_a_batch_after_a_shared_state_leaves_it_as_it_is():
    eng = engine(get_policy("ada-keydiff"), 24, 16)
    g = torch.Generator().manual_seed(8)
    context = eng.prefill(torch.randint(0, 256, (1, 50), generator=g))
    before = kept_positions(context)
    ps = [torch.randint(0, 256, (n,), generator=g) for n in (9, 30)]
    got = eng.generate_batch(ps, max_new_tokens=6, states=context, protect_last=[4, 7])
    for ids, protect_last, res in zip(ps, (4, 7), got):
        assert_same_run(res, eng.generate(ids.unsqueeze(0), max_new_tokens=6, state=context.fork(),
                                          protect_last=protect_last))
    assert all(torch.equal(a, b) for a, b in zip(before, kept_positions(context)))


@pytest.mark.parametrize("make,msg", [
    (lambda: get_policy("ada", inner="keydif"), r"inner: unknown policy 'keydif' \(did you mean 'keydiff'\?\)"),
    (lambda: get_policy("ada", inner="full"), r"inner: policy 'full' does not score tokens"),
    (lambda: get_policy("ada", inner="h2o"), r"inner: policy 'h2o' needs per-token state"),
    (lambda: get_policy("ada", inner="tova"), r"inner: policy 'tova' scores all heads alike"),
    (lambda: get_policy("ada", inner="ada-keydiff"), r"inner: policy 'ada-keydiff' already shares"),
    (lambda: get_policy("ada", alpha_safeguard=1.0), r"alpha_safeguard: must be a number in \[0, 1\), got 1.0"),
    (lambda: engine(get_policy("ada-snapkv"), 20, 16),
     r"budget: must be >= the 32 tokens policy 'ada-snapkv' always keeps \(n_sink=0 \+ recent=32\), got 20"),
    (lambda: engine(get_policy("ada-keydiff"), 24, 16).prefill(
        prompt(10), state=engine(get_policy("keydiff"), 24, 16).prefill(prompt(20))),
     r"state: its cache does not share its slots among KV heads, policy 'ada-keydiff' does"),
])
def test_bad_input(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


@pytest.mark.parametrize("params,budgets,msg", [
    ("{inner: snapkv}", "[16, 64]", "budgets: must be >= the 32 tokens policy 'ada' always keeps"),
    ("{inner: keydif}", "[64]", "policies[0].params.inner: unknown policy 'keydif' (did you mean 'keydiff'?)"),
])
def test_grid_errors_name_the_field(params, budgets, msg):
    grid = f"""
name: ada
models: [random:llama-tiny]
policies: [{{name: ada, params: {params}}}]
budgets: {budgets}
chunk_sizes: [16]
tasks:
  - {{name: math500, samples: 1}}
"""
    with pytest.raises(GridError) as e:
        parse_grid(grid)
    assert msg in str(e.value)
