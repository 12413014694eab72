"""LagKV: each partition's keys ranked by their spread against the next partition's min/max (keys only)."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.keydiff.policy.selection import lowest_oldest_first

from ..keydiff.helpers import (assert_ragged_batch_matches_alone, assert_same_run, kept_positions, make_engine,
                               prompt, tiny)
from ..keydiff.oracles import EMULATED, GATHER


def scores_by_position(keys_by_position: dict, seen: int, lag: int, n_sink: int = 0, perm=None) -> dict:
    """LagKV's scores of 2-channel keys ``{position: (x, y)}`` (one head), stored in the slots ``perm``."""
    pos = sorted(keys_by_position)
    if perm is not None:
        pos = [pos[i] for i in perm]
    keys = torch.tensor([keys_by_position[p] for p in pos], dtype=torch.float32).view(1, 1, -1, 2)
    positions = torch.tensor(pos).view(1, 1, -1)
    out = get_policy("lagkv", lag_size=lag, n_sink_tokens=n_sink).score(keys, ScoreContext(0, positions, seen, 1))
    return {p: round(s, 6) for p, s in zip(pos, out[0, 0].tolist())}


def test_each_partition_is_ranked_against_the_next_one():
    """Worked by hand (std over 2 channels = |a - b| / sqrt 2). lag 2, seen 6: partitions {0,1}, {2,3} and the
    tail {4,5} (the last complete partition: kept first, newest first, 1 + p / 7).
    {0,1} against {2,3}: min (0,0), max (2,4): p0 (1,1) -> (.5,.25), spread .177; p1 (2,0) -> (1,0), .707.
    {2,3} against {4,5}: min (1,1), max (3,2): p2 (0,0) -> (-.5,-1), .354; p3 (2,4) -> (.5,3), 1.77.
    Rank / partition size: p0 0, p1 .5, p2 0, p3 .5."""
    keys = {0: (1, 1), 1: (2, 0), 2: (0, 0), 3: (2, 4), 4: (1, 1), 5: (3, 2)}
    want = {0: 0.0, 1: 0.5, 2: 0.0, 3: 0.5, 4: round(1 + 4 / 7, 6), 5: round(1 + 5 / 7, 6)}
    assert scores_by_position(keys, 6, 2) == want
    assert scores_by_position(keys, 6, 2, perm=[3, 5, 0, 4, 1, 2]) == want  # slots out of position order


def test_an_evicted_partition_hands_the_reference_to_the_next_one_held():
    """lag 2, seen 8, positions 2 and 3 evicted: {0,1} is ranked against {4,5}, {4,5} against the tail {6,7}.
    {0,1} against {4,5}: min (0,0), max (2,8): p0 (2,2) -> (1,.25), .530; p1 (0,4) -> (0,.5), .354.
    (Against {6,7} the order would flip: p0 -> (.5,.5), 0; p1 -> (0,1.5), 1.06.)
    {4,5} against {6,7}: min (0,1), max (4,3): p4 (0,0) -> (0,-.5), .354; p5 (2,8) -> (.5,3.5), 2.12."""
    keys = {0: (2, 2), 1: (0, 4), 4: (0, 0), 5: (2, 8), 6: (0, 1), 7: (4, 3)}
    want = {0: 0.5, 1: 0.0, 4: 0.0, 5: 0.5, 6: round(1 + 6 / 9, 6), 7: round(1 + 7 / 9, 6)}
    assert scores_by_position(keys, 8, 2) == want


def test_equal_ranks_are_evicted_oldest_first_and_a_short_prompt_keeps_its_newest():
    keys = {0: (1, 1), 1: (2, 0), 2: (0, 0), 3: (2, 4), 4: (1, 1), 5: (3, 2)}
    scores = torch.tensor([list(scores_by_position(keys, 6, 2).values())])
    positions = torch.arange(6).view(1, 1, 6)
    for budget, kept in [(4, {1, 3, 4, 5}), (3, {3, 4, 5})]:
        drop = lowest_oldest_first(scores.view(1, 1, 6), positions, 6 - budget)
        assert set(range(6)) - set(drop.flatten().tolist()) == kept
    # fewer than n_sink + 2 * lag seen: no partition is scored, the newest are kept (kvpress' short prompt)
    state = Engine(tiny().model, get_policy("lagkv", lag_size=16, n_sink_tokens=2),
                   EngineConfig(budget=10, chunk_size=33)).prefill(prompt(33))
    for held in kept_positions(state):
        assert (held == torch.tensor([0, 1] + list(range(25, 33)))).all()


def published_keep(keys: torch.Tensor, n_sink: int, lag: int, budget: int) -> list[set]:
    """kvpress' ``LagKVPress.score`` (0.5.5) with the values replaced by the keys, by slicing as it does, then
    its ``topk(budget)``: ``keys [1, h, L, d]`` → kept positions per head."""
    _, h, L, d = keys.shape
    end = n_sink + ((L - n_sink) // lag) * lag
    parts = keys[:, :, n_sink:end].reshape(1, h, -1, lag, d)
    ref, v = parts[:, :, 1:], parts[:, :, :-1]
    lo, hi = ref.min(dim=-2, keepdim=True).values, ref.max(dim=-2, keepdim=True).values
    spread = ((v - lo) / (hi - lo)).std(dim=-1).softmax(dim=-1)
    ranks = spread.argsort(dim=-1).argsort(dim=-1) / lag
    ones = torch.ones(1, h, n_sink, dtype=ranks.dtype), torch.ones(1, h, L - end + lag, dtype=ranks.dtype)
    scores = torch.cat([ones[0], ranks.reshape(1, h, -1), ones[1]], dim=-1)
    return [set(row.tolist()) for row in scores.topk(budget, dim=-1).indices[0]]


def test_one_chunk_is_kvpress_rule_on_the_keys():
    """One chunk of 55 = 4 sinks + 6 partitions of 8 + 3: partitions 0..4 scored, the tail is 8 + 3 positions.
    N = 30 = 4 + 11 + 5 x 3: the 3 best-ranked of every scored partition, no tie at the threshold."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(55, seed=5)
    state = Engine(lm.model, get_policy("lagkv", lag_size=8), EngineConfig(budget=30, chunk_size=55)).prefill(ids)
    with torch.no_grad():
        cache = lm.model(ids, use_cache=True).past_key_values
    for layer, held in zip(cache.layers, kept_positions(state)):
        assert [set(row.tolist()) for row in held[0]] == published_keep(layer.keys, 4, 8, 30)


@pytest.mark.parametrize("params", [dict(lag_size=8), dict(lag_size=5, n_sink_tokens=0)], ids=["lag8", "lag5-nosink"])
def test_variants_keep_what_the_gather_store_keeps(params):
    """Partitions scored across chunks (B = 16) and decode steps: the slot store and the static layout
    (emulated graphs) keep the gather store's tokens and logits; a batch of two
    rows keeps what each row keeps alone."""
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, batch=2, seed=11)
    ref = Engine(lm.model, get_policy("lagkv", **params), EngineConfig(budget=40, chunk_size=16), **GATHER)
    ref = ref.generate(ids, max_new_tokens=6)
    for cfg in (dict(), dict(cuda_graphs=True, **EMULATED)):
        eng = make_engine(lm.model, get_policy("lagkv", **params), budget=40, chunk_size=16, **cfg)
        assert_same_run(eng.generate(ids, max_new_tokens=6), ref, atol=1e-9)
    alone = Engine(lm.model, get_policy("lagkv", **params), EngineConfig(budget=40, chunk_size=16))
    alone = alone.generate(ids[1:], max_new_tokens=6)
    assert alone.tokens[0] == ref.tokens[1]
    for a, b in zip(kept_positions(alone.state), kept_positions(ref.state)):
        assert torch.equal(a[0], b[1])



def test_a_ragged_batch_keeps_what_each_request_keeps_alone():
    assert_ragged_batch_matches_alone(get_policy("lagkv", lag_size=8))

@pytest.mark.parametrize("params,msg", [
    (dict(lag_size=1), r"lag_size: must be an integer >= 2, got 1"),
    (dict(n_sink_tokens=-1), r"n_sink_tokens: must be an integer >= 0, got -1"),
])
def test_bad_parameters(params, msg):
    with pytest.raises(ValueError, match=msg):
        get_policy("lagkv", **params)
