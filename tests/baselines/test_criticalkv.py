"""CriticalKV / CriticalAdaKV: the inner scores' two-stage selection weighted by ||W_o v||_1, against an oracle that
follows the published algorithm step by step (top-k and scatter of the largest float, as kvpress' presses do) on
one float64 prefill of a tiny model."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.keydiff import keydiff_scores

from ..keydiff.helpers import assert_ragged_batch_matches_alone, kept_positions, prompt, tiny

L, N = 60, 20


def value_norms(values, o_proj, head_dim):
    """The paper's ||W_o v||_1 per query head, as a plain einsum over the whole matrix, averaged per KV head."""
    b, kv, n, d = values.shape
    w_o = o_proj.weight.t().reshape(-1, head_dim, o_proj.weight.shape[0])  # [q_heads, d, hidden]
    group = w_o.shape[0] // kv
    per_query = torch.einsum("bhnd,hdk->bhnk", values.repeat_interleave(group, dim=1), w_o).abs().sum(-1)
    return per_query.view(b, kv, group, n).mean(2)


def oracle_critical(scores, norms, n, ratio, eps):
    scores = scores.clone()
    first = torch.topk(scores, int(n * ratio), dim=-1).indices
    scores = (scores + eps) * norms
    scores.scatter_(-1, first, torch.finfo(scores.dtype).max)
    return [set(row.tolist()) for row in torch.topk(scores, n, dim=-1).indices[0]]


def oracle_critical_ada(scores, norms, n, ratio, eps, alpha):
    big = torch.finfo(scores.dtype).max
    scores = scores.clone()
    h, length = scores.shape[1], scores.shape[2]
    scores.scatter_(-1, torch.topk(scores, int(n * alpha), dim=-1).indices, big)
    alloc = torch.topk(scores.reshape(1, -1), n * h, dim=-1).indices // length
    budgets = torch.bincount(alloc.flatten(), minlength=h).tolist()
    order = torch.topk(scores, length, dim=-1).indices
    for head, count in enumerate(budgets):
        scores[:, head].scatter_(-1, order[:, head, : int(count * ratio)], big)
    scores = (scores + eps) * norms
    return [set(torch.topk(scores[0, head], count).indices.tolist()) for head, count in enumerate(budgets)]


def prefill(policy, kv_heads=2):
    lm = tiny("random:llama-tiny", kv_heads, "float64")
    ids = prompt(L, seed=5)
    cache = lm.model(ids, use_cache=True).past_key_values
    state = Engine(lm.model, policy, EngineConfig(budget=N, chunk_size=L)).prefill(ids)
    attn = lm.model.model.layers
    return cache, state, attn


@pytest.mark.parametrize("ratio", [0.5, 0.25])
def test_criticalkv_keeps_what_the_algorithm_keeps(ratio):
    cache, state, attn = prefill(get_policy("criticalkv", inner="keydiff", first_stage_ratio=ratio, epsilon=0.1))
    for idx, (full, kept) in enumerate(zip(cache.layers, kept_positions(state))):
        norms = value_norms(full.values, attn[idx].self_attn.o_proj, attn[idx].self_attn.head_dim)
        want = oracle_critical(keydiff_scores(full.keys), norms, N, ratio, 0.1)
        assert [set(row.tolist()) for row in kept[0]] == want


def test_the_weighting_changes_what_is_kept():
    """The same inner scores with and without stage 2: CriticalKV is not its inner policy."""
    _, crit, _ = prefill(get_policy("criticalkv", inner="keydiff"))
    _, plain, _ = prefill(get_policy("keydiff"))
    assert any(not torch.equal(a, b) for a, b in zip(kept_positions(crit), kept_positions(plain)))


def test_criticaladakv_keeps_what_the_algorithm_keeps():
    policy = get_policy("criticaladakv", inner="keydiff", first_stage_ratio=0.5, alpha_safeguard=0.2, epsilon=0.1)
    cache, state, attn = prefill(policy)
    unequal = 0
    for idx, (full, layer) in enumerate(zip(cache.layers, state.cache.layers)):
        norms = value_norms(full.values, attn[idx].self_attn.o_proj, attn[idx].self_attn.head_dim)
        want = oracle_critical_ada(keydiff_scores(full.keys), norms, N, 0.5, 0.1, 0.2)
        n = layer.slots
        tags, positions = layer.tags[0, 0, :n].tolist(), layer.positions[0, 0, :n].tolist()
        got = [{p for g, p in zip(tags, positions) if g == h} for h in range(layer.heads)]
        assert got == want
        unequal += len({len(s) for s in got}) > 1
    assert unequal > 0  # the heads' budgets differ somewhere, so the allocation is exercised


def test_ragged_batch_equals_alone():
    """Padding and empty slots rank last at stage 1 and never take its tokens."""
    assert_ragged_batch_matches_alone(get_policy("criticalkv", inner={"name": "snapkv", "params": {"window": 8}}))


@pytest.mark.parametrize("params, message", [
    (dict(first_stage_ratio=1.5), "first_stage_ratio: must be in [0, 1], got 1.5"),
    (dict(epsilon=-1.0), "epsilon: must be >= 0, got -1.0"),
    (dict(inner="ada"), "inner: 'ada' shares a layer's slots among its KV heads (use criticaladakv)"),
    (dict(inner="snapkw"), "inner: unknown policy 'snapkw'"),
])
def test_bad_parameters_name_the_field(params, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        get_policy("criticalkv", **params)
