"""ChunkKV: whole groups of adjacent positions, ranked by the mean of an inner policy's scores."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.keydiff.policy.selection import lowest_oldest_first

from ..keydiff.helpers import (assert_ragged_batch_matches_alone, assert_same_run, kept_positions, make_engine,
                               prompt, tiny)
from ..keydiff.oracles import EMULATED, GATHER

# Worked by hand. Positions 0..7 in groups of 2; knorm scores are -|k|.
# head 0 norms [1, 3, 2, 1, 5, 1, .5, .5]: group means -2, -1.5, -3, -.5
# head 1 norms [1, 1, 4, 4, 3, 3, 1, 2]:   group means -1, -4, -3, -1.5
# heads="all" sums the heads per position, [-2, -4, -6, -5, -8, -4, -1.5, -2.5]: group means -3, -5.5, -6, -2.
NORMS = [[1, 3, 2, 1, 5, 1, .5, .5], [1, 1, 4, 4, 3, 3, 1, 2]]
EACH = [[-2, -2, -1.5, -1.5, -3, -3, -.5, -.5], [-1, -1, -4, -4, -3, -3, -1.5, -1.5]]
ALL = [-3, -3, -5.5, -5.5, -6, -6, -2, -2]
SLOTS = torch.tensor([5, 2, 7, 0, 3, 6, 1, 4])  # slot i holds position SLOTS[i]: groups are by position


def hand_case(heads):
    """Scores (in position order) and the positions kept at budgets 4 and 3 by the engine's selection."""
    keys = torch.zeros(1, 2, 8, 2)
    keys[0, :, :, 0] = torch.tensor(NORMS)[:, SLOTS]
    positions = SLOTS.expand(1, 2, 8)
    pol = get_policy("chunkkv", inner="knorm", group_size=2, heads=heads)
    scores = pol.score(keys, ScoreContext(0, positions, 8, 8))
    in_order = torch.empty_like(scores).scatter_(-1, positions, scores)
    kept = {}
    for budget in (4, 3):
        drop = lowest_oldest_first(scores, positions, 8 - budget)
        kept[budget] = [set(range(8)) - set(positions[0, h, drop[0, h]].tolist()) for h in range(2)]
    return in_order[0].tolist(), kept


def test_each_head_keeps_its_best_groups_and_cuts_the_edge_group_by_position():
    scores, kept = hand_case("each")
    assert scores == EACH
    assert kept[4] == [{2, 3, 6, 7}, {0, 1, 6, 7}]
    assert kept[3] == [{3, 6, 7}, {0, 1, 7}]  # the edge group keeps its newest token


def test_all_heads_share_the_groups_of_their_summed_scores():
    scores, kept = hand_case("all")
    assert scores == [ALL, ALL]
    assert kept[4] == [{0, 1, 6, 7}, {0, 1, 6, 7}]


def test_one_chunk_keeps_the_groups_of_the_highest_mean_keydiff_score():
    """Prompt = one chunk of 60 positions, groups of 6, N = 24: every layer keeps the 4 groups whose KeyDiff
    score (kvpress' form, -cos(k, mean unit key)), summed over the KV heads, has the highest mean."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(60, seed=4)
    state = Engine(lm.model, get_policy("chunkkv", group_size=6),
                   EngineConfig(budget=24, chunk_size=60)).prefill(ids)
    with torch.no_grad():
        cache = lm.model(ids, use_cache=True).past_key_values
    for layer, held in zip(cache.layers, kept_positions(state)):
        keys = layer.keys  # [1, 2, 60, d]
        anchor = torch.nn.functional.normalize(keys, dim=-1).mean(dim=2, keepdim=True)
        per_token = -torch.nn.functional.cosine_similarity(keys, anchor, dim=-1).sum(dim=1)  # [1, 60]
        best = per_token.view(10, 6).mean(-1).topk(4).indices.tolist()
        expect = sorted(p for g in best for p in range(6 * g, 6 * g + 6))
        assert held[0, 0].tolist() == expect and held[0, 1].tolist() == expect


def test_attention_inner_policy_keeps_its_window():
    """inner=snapkv: the engine protects SnapKV's window and captures its rows (chunked, then decoding)."""
    seen_steps = []

    def check(state):
        for positions in kept_positions(state):
            assert set(range(max(0, state.seen - 32), state.seen)) <= set(positions[0, 0].tolist())
        seen_steps.append(state.seen)

    pol = get_policy("chunkkv", inner="snapkv", group_size=5)
    assert pol.needs().attention == get_policy("snapkv").needs().attention
    Engine(tiny().model, pol, EngineConfig(budget=48, chunk_size=16), on_step=check).generate(prompt(90), 4)
    assert seen_steps[-1] == 93


def test_the_inner_policys_queries_and_rerotation_are_the_engines():
    pol = get_policy("chunkkv", inner="expected-attention", group_size=4)
    assert pol.needs().queries == get_policy("expected-attention").needs().queries and not pol.needs().rerotates
    pol = get_policy("chunkkv", inner="sink-rerotate", group_size=4)
    assert pol.needs().queries is None and pol.needs().rerotates and Engine(tiny().model, pol, EngineConfig(budget=40)).plan.rerotate


VARIANTS = [dict(heads="each", group_size=7), dict(inner="h2o", group_size=4), dict(inner="snapkv", group_size=3),
            dict(inner="expected-attention", group_size=4), dict(inner="sink-rerotate", group_size=4)]


@pytest.mark.parametrize("params", VARIANTS, ids=lambda p: "-".join(map(str, p.values())))
def test_variants_keep_what_the_gather_store_keeps(params):
    """Slot store and the static layout (emulated graphs) keep the gather store's tokens and logits."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=11)
    ref = Engine(lm.model, get_policy("chunkkv", **params), EngineConfig(budget=40, chunk_size=16), **GATHER)
    ref = ref.generate(ids, max_new_tokens=6)
    for cfg in (dict(), dict(cuda_graphs=True, **EMULATED)):
        eng = make_engine(lm.model, get_policy("chunkkv", **params), budget=40, chunk_size=16, **cfg)
        assert_same_run(eng.generate(ids, max_new_tokens=6), ref, atol=1e-9)



def test_a_ragged_batch_keeps_what_each_request_keeps_alone():
    assert_ragged_batch_matches_alone(get_policy("chunkkv", group_size=4, heads="each"))

@pytest.mark.parametrize("params,msg", [
    (dict(inner="keydif"), r"inner: unknown policy 'keydif' \(did you mean 'keydiff'"),
    (dict(inner="full"), r"inner: expected a policy that scores tokens, got 'full'"),
    (dict(inner="ada-keydiff"), r"inner: 'ada-keydiff' shares a layer's slots among its KV heads; expected a per-head"),
    (dict(inner="chunkkv"), r"inner: cannot be 'chunkkv' itself"),
    (dict(group_size=0), r"group_size: must be an integer > 0, got 0"),
    (dict(heads="some"), r"heads: expected 'all' or 'each', got 'some'"),
])
def test_bad_parameters(params, msg):
    with pytest.raises(ValueError, match=msg):
        get_policy("chunkkv", **params)


def test_an_inner_policys_per_layer_budgets_are_kept():
    """inner=pyramidkv: ChunkKV keeps PyramidKV's per-layer budgets (they sum to layers x N, as the engine
    checks) instead of running its groups under a uniform N."""
    pol = get_policy("chunkkv", inner="pyramidkv", group_size=4)
    assert pol.layer_budgets(64, 4) == get_policy("pyramidkv").layer_budgets(64, 4) != [64] * 4
    eng = Engine(tiny().model, pol, EngineConfig(budget=64, chunk_size=16))
    assert list(eng.plan.budgets) == get_policy("pyramidkv").layer_budgets(64, eng.plan.num_layers) and not eng.plan.uniform
