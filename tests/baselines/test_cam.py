"""CaM (kvpress' CAMPress): a known answer on six tokens and an oracle of the rule on random heads; on a tiny model
every head keeps the inner policy's best by the head-mean score, the running attention sums every query since a
token arrived, one shot and chunk by chunk the values are the oracle's merges (layer 0 replayed from the full
cache's keys and values), the draws are the seed's; ragged batches and the graph path give what the plain path
gives, the bytes are those of a policy keeping as many tokens, a quantized store quantizes merged values again;
refusals are one line."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.cam import ATTENTION, CaM, hashed_draws, merge_into_windows
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.quant.store import QuantizedStore
from kdeval.keydiff.policy.interface import Freed, ScoreContext

from ..keydiff.helpers import assert_ragged_batch_matches_alone, kept_positions, make_engine, prompt, tiny
from ..keydiff.test_kv_quant import KIVI, PER_TOKEN, assert_stored_quantized
from .test_merging import (assert_graph_path_equals_eager, assert_ragged_values_match_alone,
                           assert_runner_holds_the_budget, layer_tokens)

L, N, B, M = 60, 20, 12, 4


def oracle(values, positions, kept, attention, m, draw):
    """The rule for one head, one freed token at a time in position order: ``values [n, dv]`` (float64),
    ``positions``/``attention``: lists, ``kept``: kept indices, ``draw(position)`` → a uniform; the new values."""
    out = values.clone()
    by_position = sorted(kept, key=lambda j: positions[j])
    for i in sorted(set(range(len(positions))) - set(kept), key=lambda j: positions[j]):
        window = [j for j in by_position if positions[j] > positions[i]][:m]
        if not window:
            continue
        mean = sum(attention[j] for j in window) / len(window)
        p = (0.0 if attention[i] == 0 else 1.0) if mean == 0 else min(max(attention[i] / mean, 0.0), 1.0)
        if draw(positions[i]) < p:
            for j in window:
                out[j] += values[i] / len(window)
    return out


def one_head(values, positions, kept, attention, m, uniform):
    """``merge_into_windows`` on one head: the freed slots the complement of ``kept``; ``uniform``: position →
    draw. Returns the new values and the slots merged into."""
    n = values.shape[0]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[kept] = True
    pos = torch.tensor(positions).view(1, 1, n)
    vals = values.clone().view(1, 1, n, -1)
    ctx = ScoreContext(0, pos, max(positions) + 1, n)
    draws = lambda at: torch.tensor([[[uniform.get(int(p), 1.0) for p in at[0, 0]]]])  # noqa: E731
    into = merge_into_windows(Freed(vals, (~mask).nonzero().view(1, 1, -1), mask.view(1, 1, n)), ctx,
                              torch.tensor(attention, dtype=torch.float32).view(1, 1, n), m, draws)
    return vals[0, 0], into[0, 0]


def test_known_answer_on_six_tokens():
    values = torch.arange(12, dtype=torch.float64).view(6, 2)
    # slots hold positions out of order: the windows follow positions, not slots
    positions = [0, 4, 2, 3, 1, 5]
    kept = [0, 2, 3, 5]  # positions 0, 2, 3, 5; freed: slot 4 (position 1), slot 1 (position 4)
    attention = [1.0, 3.0, 4.0, 2.0, 2.0, 6.0]
    # position 1: window positions 2, 3 (slots 2, 3), mean 3, p = 2/3; position 4: window position 5, p = 3/6
    got, into = one_head(values, positions, kept, attention, 2, {1: 0.6, 4: 0.5})
    want = values.clone()
    want[2] += values[4] / 2
    want[3] += values[4] / 2
    assert torch.equal(got, want)
    assert into.tolist() == [False, False, True, True, False, False]
    got, into = one_head(values, positions, kept, attention, 2, {1: 0.7, 4: 0.49})  # 0.7 > 2/3; 0.49 < 1/2
    want = values.clone()
    want[5] += values[1]
    assert torch.equal(got, want) and into.tolist() == [False, False, False, False, False, True]
    # nothing kept after position 5's neighbour: a freed newest token has no window; 0/0 gives p = 0
    got, _ = one_head(values, [0, 1, 2, 3, 4, 5], [0, 1, 2], [0.0, 0.0, 0.0, 0.0, 5.0, 5.0], 2, {3: 0.0})
    assert torch.equal(got, values)


def test_random_heads_match_the_oracle():
    g = torch.Generator().manual_seed(1)
    merged = 0
    for trial in range(12):
        n, m = 24, [1, 3, 32][trial % 3]
        values = torch.randn(n, 6, generator=g, dtype=torch.float64)
        positions = torch.randperm(n, generator=g).tolist()
        kept = sorted(torch.randperm(n, generator=g)[:10].tolist())
        attention = torch.rand(n, generator=g).tolist()
        if trial % 4 == 0:  # zero attention somewhere: 0/0 and x/0
            attention[kept[0]] = attention[kept[1]] = 0.0
        uniform = {p: float(torch.rand(1, generator=g)) for p in positions}
        got, into = one_head(values, positions, kept, torch.tensor(attention).tolist(), m, uniform)
        a32 = torch.tensor(attention, dtype=torch.float32).double().tolist()
        want = oracle(values, positions, kept, a32, m, uniform.__getitem__)
        assert torch.allclose(got, want, atol=1e-12)
        assert torch.equal(into, (want != values).any(-1))
        merged += int(into.sum())
    assert merged > 0


class Recording(CaM):
    """CaM that records, per layer, each step's attention and ``A`` after it by slot, and what each merge saw."""

    def __post_init__(self):
        super().__post_init__()
        self.steps, self.merges = [], []

    def observe(self, ctx):
        before = ctx.attention.mean(dim=2).clone()
        super().observe(ctx)
        self.steps.append((ctx.layer_idx, ctx.positions.clone(), ctx.positions < ctx.seen, before,
                           ctx.state[ATTENTION].clone()))

    def apply(self, eviction):
        ctx = eviction.ctx
        self.merges.append((ctx.layer_idx, ctx.positions.clone(), ctx.state[ATTENTION].clone(), ctx.seen))
        super().apply(eviction)


def head_mean_best(scores, n_keep):
    """The ``n_keep`` best tokens of ``scores [h, n]`` averaged over heads, as sorted indices."""
    return sorted(scores.mean(dim=0).argsort(descending=True)[:n_keep].tolist())


def test_the_running_attention_sums_every_query_since_the_token_arrived():
    lm = tiny("random:llama-tiny", 2, "float64")
    policy = Recording(inner="knorm", merge_budget=M)
    make_engine(lm.model, policy, budget=N, chunk_size=B).generate(prompt(L, seed=3), max_new_tokens=5)
    checked, layers = 0, lm.model.config.num_hidden_layers
    for layer in range(layers):
        sums: dict[tuple[int, int], float] = {}
        for _, positions, real, attention, state in (s for s in policy.steps if s[0] == layer):
            for h in range(2):
                for p, r, a, got in zip(positions[0, h].tolist(), real[0, h].tolist(), attention[0, h].tolist(),
                                        state[0, h].tolist()):
                    if r:
                        sums[(h, p)] = sums.get((h, p), 0.0) + a
                        assert got == pytest.approx(sums[(h, p)], rel=1e-6, abs=1e-9)
                        checked += 1
    assert len(policy.steps) == layers * (L // B + 4) and checked > 1000


def replay_layer_zero(policy, fk, fv, chunk):
    """Layer 0 (its keys and values depend on the tokens only) replayed from the full cache's: KNorm's head-mean
    selection and the oracle's merges with the recorded ``A`` and the seed's draws at every eviction."""
    evictions = [m for m in policy.merges if m[0] == 0]
    held, vals = [], [fv[0, h, :0] for h in range(2)]
    for start in range(0, L, chunk):
        held = held + list(range(start, min(start + chunk, L)))
        vals = [torch.cat([vals[h], fv[0, h, start : start + chunk]]) for h in range(2)]
        if len(held) <= N:
            continue
        _, positions, state, seen = evictions.pop(0)
        scores = -fk[0, :, held].float().norm(dim=-1)
        kept = head_mean_best(scores, N)
        for h in range(2):
            slot_of = {p: s for s, p in enumerate(positions[0, h].tolist())}
            attention = [state[0, h, slot_of[p]].item() for p in held]
            draws = hashed_draws(policy.seed, 0, torch.tensor(held).view(1, 1, -1).expand(1, 2, -1), seen)[0, h]
            draw = dict(zip(held, draws.tolist()))
            vals[h] = oracle(vals[h], held, kept, attention, M, draw.__getitem__)[kept]
        held = [held[i] for i in kept]
    return held, vals


@pytest.mark.parametrize("chunk", [L, B])
def test_layer_zero_is_the_oracle_replay_and_every_head_keeps_the_same_tokens(chunk):
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=2)
    full = Engine(lm.model, get_policy("full"), EngineConfig(budget=None, chunk_size=L)).prefill(ids)
    fk, fv, _ = layer_tokens(full.cache.layers[0])
    policy = Recording(inner="knorm", merge_budget=M)
    peaks = []
    state = make_engine(lm.model, policy, on_step=lambda s: peaks.append(s.cache.layers[0].length),
                        budget=N, chunk_size=chunk).prefill(ids)
    held, vals = replay_layer_zero(policy, fk, fv, chunk)
    mk, mv, mp = layer_tokens(state.cache.layers[0])
    changed = 0
    for h in range(2):
        assert mp[0, h].tolist() == held
        assert torch.allclose(mv[0, h], vals[h], atol=1e-12)
        assert torch.equal(mk[0, h], fk[0, h, held])  # keys untouched
        changed += int((mv[0, h] != fv[0, h, held]).any(-1).sum())
    assert changed > 0
    for layer in kept_positions(state):
        assert torch.equal(layer[0, 0], layer[0, 1])
    assert max(peaks) <= N and state.peak_kv_tokens <= N + (chunk if chunk < L else L)


def test_the_draws_decide_the_merges_and_a_seed_gives_the_same_run(monkeypatch):
    """A draw of 1 never merges (p <= 1): layer 0 then holds the full cache's values; the same seed gives the same
    values; the hashed draws depend on the seed, the layer, the head, the position and the step only."""
    import kdeval.baselines.cam as cam

    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=4)
    full = Engine(lm.model, get_policy("full"), EngineConfig(budget=None, chunk_size=L)).prefill(ids)
    _, fv, _ = layer_tokens(full.cache.layers[0])

    def layer0(**params):
        state = make_engine(lm.model, get_policy("cam", merge_budget=M, **params), budget=N, chunk_size=B).prefill(ids)
        return layer_tokens(state.cache.layers[0])

    _, v0, p0 = layer0(seed=0)
    assert torch.equal(layer0(seed=0)[1], v0)
    held = fv.gather(2, p0.unsqueeze(-1).expand(-1, -1, -1, fv.shape[-1]))
    assert not torch.equal(v0, held)
    monkeypatch.setattr(cam, "hashed_draws", lambda seed, layer, at, seen: torch.ones(at.shape))
    _, v1, p1 = layer0(seed=0)
    assert torch.equal(p1, p0) and torch.equal(v1, held)
    at = torch.arange(6).view(1, 2, 3)
    draws = [hashed_draws(*args) for args in ((0, 1, at, 9), (0, 1, at, 9), (1, 1, at, 9), (0, 2, at, 9),
                                                 (0, 1, at, 10), (0, 1, at.flip(-1), 9))]
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[5], draws[0].flip(-1))
    assert all(not torch.equal(draws[0], d) for d in draws[2:5])
    same = torch.arange(3).view(1, 1, 3).expand(1, 2, 3)
    assert not torch.equal(*hashed_draws(0, 1, same, 9)[0])  # each head its own draws
    assert ((draws[0] >= 0) & (draws[0] < 1)).all()


def test_bytes_are_those_of_a_policy_keeping_as_many():
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(90, seed=4)
    runs = [Engine(lm.model, p, EngineConfig(budget=40, chunk_size=16)).generate(ids, max_new_tokens=4)
            for p in (get_policy("knorm"), CaM(inner="knorm"))]
    a, b = (r.stats for r in runs)
    assert (a.peak_kv_bytes, a.kv_cache_bytes, a.peak_kv_tokens, a.kept_tokens) == (
        b.peak_kv_bytes, b.kv_cache_bytes, b.peak_kv_tokens, b.kept_tokens)
    assert b.peak_kv_tokens <= 40 + 16


@pytest.mark.parametrize("params", [{}, {"inner": "keydiff", "merge_budget": 2}])
def test_ragged_batch_matches_alone(params):
    assert_ragged_batch_matches_alone(get_policy("cam", **params))


def test_ragged_batch_values_match_alone():
    assert_ragged_values_match_alone(get_policy("cam", merge_budget=3))


def test_graph_path_equals_eager():
    assert_graph_path_equals_eager(get_policy("cam", inner="h2o"))


@pytest.mark.parametrize("compress", ["prompt", "context"])
def test_both_protocols_run_through_the_runner_and_hold_the_budget(compress):
    assert_runner_holds_the_budget("cam", compress)


@pytest.mark.parametrize("params, message", [
    ({"merge_budget": 0}, "merge_budget: expected a positive integer, got 0"),
    ({"merge_budget": 2.5}, "merge_budget: expected a positive integer, got 2.5"),
    ({"seed": "1"}, "seed: expected an integer, got '1'"),
    ({"inner": "ada"}, r"inner: policy 'ada' shares a layer's slots among its KV heads \(a head pool does not "
                       r"merge\) \(policies it can wrap: .*\)"),
    ({"inner": "merging"}, r"inner: policy 'merging' already merges \(policies it can wrap: .*\)"),
    ({"inner": "snapkv"}, r"inner: policy 'snapkv' reads the attention of the last 32 queries \(CaM captures every "
                          r"query's\) \(policies it can wrap: .*\)"),
    ({"inner": "full"}, r"inner: policy 'full' does not score tokens \(policies it can wrap: .*\)"),
    ({"inner": "knrom"}, r"inner: unknown policy 'knrom' \(did you mean .*knorm.*"),
])
def test_bad_parameters_are_refused(params, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        CaM(**params)


@pytest.mark.parametrize("quant", [dict(KIVI, bits=2, group_size=8), PER_TOKEN])
def test_a_quantized_store_quantizes_the_merged_values_again(quant, monkeypatch):
    lm = tiny("random:llama-tiny", 2, "float64")
    eng = make_engine(lm.model, get_policy("cam", inner="keydiff", merge_budget=M), budget=32, chunk_size=16,
                      kv_quant=quant)
    res = eng.generate(prompt(80, seed=8), max_new_tokens=2)
    assert res.stats.peak_kv_tokens <= 32 + 16
    assert_stored_quantized(res, quant)
    monkeypatch.setattr(QuantizedStore, "requantize_values", lambda *args: None)
    with pytest.raises(AssertionError):
        assert_stored_quantized(eng.generate(prompt(80, seed=8), max_new_tokens=2), quant)
