"""Each baseline's selection on inputs whose right answer is computed independently here."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.snapkv import pool_scores
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model
from kdeval.keydiff.policy.interface import ScoreContext

from ..keydiff.helpers import prompt


def eager_attentions(ids, kv_heads=2):
    """Full attention matrices ``[b, q_heads, L, L]`` per layer from the same weights, with eager attention."""
    lm = load_model("random:llama-tiny", attn_implementation="eager", overrides={"num_key_value_heads": kv_heads})
    with torch.no_grad():
        return lm.model(ids, output_attentions=True).attentions


def held(state, layer):
    return state.cache.layers[layer].view()[1]


@pytest.mark.parametrize("heads", ["all", "group"])
def test_tova_keeps_what_the_last_query_attends_to_most(heads):
    ids, budget = prompt(64, seed=1), 20
    eng = Engine(load_model("random:llama-tiny").model, get_policy("tova", heads=heads), EngineConfig(budget=budget, chunk_size=64))
    state = eng.prefill(ids)
    for li, attn in enumerate(eager_attentions(ids)):
        last = attn[0, :, -1, :]  # [q_heads=8, L]
        per_kv = last.view(2, 4, -1).mean(1)
        if heads == "all":
            per_kv = per_kv.mean(0, keepdim=True).expand(2, -1)
        for h in range(2):
            expect = set(per_kv[h].topk(budget).indices.tolist())
            assert set(held(state, li)[0, h].tolist()) == expect


def test_h2o_accumulated_scores_equal_full_matrix_column_sums():
    ids = prompt(70, seed=2)
    eng = Engine(load_model("random:llama-tiny").model, get_policy("h2o"), EngineConfig(budget=200, chunk_size=16))
    state = eng.prefill(ids)  # budget > prompt: nothing evicted, every chunk's attention accumulated
    for li, attn in enumerate(eager_attentions(ids)):
        ref = attn[0].sum(dim=1).view(2, 4, -1).sum(1)  # received attention, summed over queries and the group
        got = state.cache.layers[li].view()[2]["acc"][0]
        assert torch.allclose(got, ref, atol=1e-4)


def test_h2o_keeps_heavy_hitters_and_recent_window():
    ids, budget = prompt(64, seed=3), 20
    eng = Engine(load_model("random:llama-tiny").model, get_policy("h2o"), EngineConfig(budget=budget, chunk_size=64))
    state = eng.prefill(ids)
    for li, attn in enumerate(eager_attentions(ids)):
        acc = attn[0].sum(dim=1).view(2, 4, -1).sum(1)
        for h in range(2):
            recent = set(range(54, 64))
            older = acc[h, :54]
            expect = recent | set(older.topk(budget - 10).indices.tolist())
            assert set(held(state, li)[0, h].tolist()) == expect


def test_pool_scores_spreads_a_spike_to_its_neighbours_in_position_order():
    scores = torch.zeros(1, 1, 10)
    scores[0, 0, 4] = 1.0
    assert pool_scores(scores, 7, "max")[0, 0].tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 0, 0]
    # the same tokens stored out of order: neighbours follow positions, not slots
    perm = torch.tensor([3, 9, 0, 4, 7, 1, 8, 2, 6, 5])
    pooled = pool_scores(scores[..., perm], 3, "max", order=perm.view(1, 1, -1).argsort(-1))
    assert {int(perm[i]) for i in range(10) if pooled[0, 0, i] == 1.0} == {3, 4, 5}


def test_sink_keeps_first_and_most_recent():
    state = Engine(load_model("random:llama-tiny").model, get_policy("sink", n_sink_tokens=4),
                   EngineConfig(budget=12, chunk_size=10)).prefill(prompt(55))
    for layer in state.cache.layers:
        for row in layer.view()[1].reshape(-1, 12):
            assert set(row.tolist()) == {0, 1, 2, 3} | set(range(47, 55))


def test_knorm_keeps_lowest_norm_keys():
    keys = torch.randn(1, 2, 30, 8, generator=torch.Generator().manual_seed(0))
    ctx = ScoreContext(0, torch.arange(30).expand(1, 2, 30), 30, 30)
    scores = get_policy("knorm").score(keys, ctx)
    assert torch.equal(scores.topk(5).indices.sort().values, keys.norm(dim=-1).topk(5, largest=False).indices.sort().values)


@pytest.mark.parametrize("name,params,msg", [
    ("snapkv", {"window": 0}, r"window: must be > 0"),
    ("snapkv", {"kernel": 4}, r"kernel: must be a positive odd number"),
    ("tova", {"heads": "some"}, r"heads: expected 'all' or 'group'"),
    ("h2o", {"recent_fraction": 1.0}, r"recent_fraction: must be in \[0, 1\)"),
    ("sink", {"n_sink_tokens": -1}, r"n_sink_tokens: must be >= 0"),
])
def test_bad_parameters(name, params, msg):
    with pytest.raises(ValueError, match=msg):
        get_policy(name, **params)


def test_snapkv_budget_must_hold_the_window():
    with pytest.raises(ValueError, match=r"budget: must be >= the 32 tokens policy 'snapkv' always keeps"):
        Engine(load_model("random:llama-tiny").model, get_policy("snapkv"), EngineConfig(budget=16))
