"""SnapKV as published: the window's columns dropped before pooling, zero padding, pooled per query head.

``published_scores`` re-implements the reference rule (FasterDecoding/SnapKV ``SnapKVCluster.update_kv``,
kvpress ``SnapKVPress.score``) on position-ordered votes, by slicing and explicit padding rather than masks.
"""
import pytest
import torch
import torch.nn.functional as F

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model
from kdeval.keydiff.cache.budget_cache import EMPTY_POSITION
from kdeval.keydiff.policy.interface import ScoreContext
from kdeval.keydiff.policy.selection import protect

from ..keydiff.helpers import prompt


def published_scores(votes: torch.Tensor, window: int, kernel: int, pooling: str) -> torch.Tensor:
    """``votes [b, kv, group, L]`` (summed window rows, tokens in position order, the window last) →
    ``[b, kv, L - window]``: drop the window's columns, pad ``kernel // 2`` zeros on each side, take the max
    or the mean of each ``kernel`` neighbours (padding counted), then average over the group."""
    older = votes[..., :-window]
    padded = F.pad(older, (kernel // 2, kernel // 2), value=0.0)
    neighbours = padded.unfold(-1, kernel, 1)  # [b, kv, group, L - window, kernel]
    pooled = neighbours.amax(-1) if pooling == "max" else neighbours.sum(-1) / kernel
    return pooled.mean(dim=2)


def published_keep(votes: torch.Tensor, window: int, kernel: int, pooling: str, budget: int) -> list[list[set]]:
    """The reference's kept positions per (batch row, KV head): the top ``budget - window`` older tokens plus
    the window."""
    scores = published_scores(votes, window, kernel, pooling)
    n = votes.shape[-1]
    top = scores.topk(budget - window, dim=-1).indices
    return [[set(row.tolist()) | set(range(n - window, n)) for row in head] for head in top]


def ctx_for(votes: torch.Tensor, positions: torch.Tensor, seen) -> ScoreContext:
    return ScoreContext(0, positions, seen, 1, attention=votes)


def kept(pol, votes, positions, seen, budget) -> list[list[set]]:
    """What the engine keeps from ``pol``'s scores: window protected, then the ``budget`` highest."""
    scores = protect(pol.score(None, ctx_for(votes, positions, seen)), positions, seen, 0, pol.n_recent(budget))
    top = scores.topk(budget, dim=-1).indices
    return [[{int(positions[b, h, i]) for i in head} for h, head in enumerate(row)] for b, row in enumerate(top)]


# Worked by hand: positions 0..9 in order, window 2 (positions 8, 9: always kept, their columns dropped),
# kernel 3, zero padding counted, budget 4 (the window + 2 older tokens).
# Older votes [5, 0, 0, 0, 3, 3, 0, 0]: avg-pooled [5/3, 5/3, 0, 1, 2, 2, 1, 0] -> keep 4, 5.
# (The old rule: no zero counted at the edge, so position 0 scored 5/2 and was kept; and the window's 9s
# leaked into position 7.)
# Max, two query heads on one KV head: [0, 4, 0, 0, 0, 0] -> [4, 4, 4, 0, 0, 0] and [0, 0, 0, 0, 2, 0] ->
# [0, 0, 0, 2, 2, 2], averaged [2, 2, 2, 1, 1, 1] -> keep 0, 1, 2 (budget 5). Averaging first and pooling the
# window's columns too (the old rule) gave position 5 the window's 9.
@pytest.mark.parametrize("pooling,votes,budget,expect", [
    ("avg", [[5, 0, 0, 0, 3, 3, 0, 0, 9, 9]], 4, {4, 5, 8, 9}),
    ("max", [[0, 4, 0, 0, 0, 0, 9, 9], [0, 0, 0, 0, 2, 0, 9, 9]], 5, {0, 1, 2, 6, 7}),
])
def test_kept_set_worked_by_hand(pooling, votes, budget, expect):
    v = torch.tensor(votes, dtype=torch.float32).view(1, 1, len(votes), -1)
    n = v.shape[-1]
    pol = get_policy("snapkv", window=2, kernel=3, pooling=pooling)
    assert kept(pol, v, torch.arange(n).view(1, 1, n), n, budget) == [[expect]]


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_out_of_order_slots_and_empty_slots_score_as_published(pooling):
    """The slot store's order and the static layout's empty slots (sentinel positions, sorted last) change
    nothing: the older tokens' scores equal the reference computed on position-ordered votes."""
    g = torch.Generator().manual_seed(3)
    b, kv, group, n, empty, window, kernel = 2, 2, 4, 40, 5, 6, 5
    votes = torch.rand(b, kv, group, n, generator=g)
    perm = torch.stack([torch.randperm(n + empty, generator=g) for _ in range(b * kv)]).view(b, kv, n + empty)
    positions = torch.cat([torch.arange(n), torch.full((empty,), EMPTY_POSITION)]).expand(b, kv, -1)
    positions = positions.gather(-1, perm)
    stored = torch.cat([votes, torch.rand(b, kv, group, empty, generator=g)], -1)  # empty slots: any value
    stored = stored.gather(-1, perm.unsqueeze(2).expand(-1, -1, group, -1))
    pol = get_policy("snapkv", window=window, kernel=kernel, pooling=pooling)
    for seen in (n, torch.tensor(n)):  # an int, or a 0-d tensor (CUDA graphs)
        got = pol.score(None, ctx_for(stored, positions, seen))
        ref = published_scores(votes, window, kernel, pooling)
        by_position = got.gather(-1, positions.argsort(-1))[..., : n - window]  # the older tokens sort first
        assert torch.allclose(by_position, ref, atol=1e-6)


def eager_window_votes(ids, window, kv_heads):
    """Per layer, the last ``window`` rows of the full eager attention summed, ``[b, kv, group, L]`` (float64)."""
    lm = load_model("random:llama-tiny", attn_implementation="eager", dtype="float64",
                    overrides={"num_key_value_heads": kv_heads})
    with torch.no_grad():
        attns = lm.model(ids, output_attentions=True).attentions
    return [a[:, :, -window:, :].sum(2).view(a.shape[0], kv_heads, -1, a.shape[-1]) for a in attns]


@pytest.mark.parametrize("pooling", ["max", "avg"])
@pytest.mark.parametrize("kv_heads", [2, 8])
def test_engine_prefill_keeps_what_the_published_rule_keeps(pooling, kv_heads):
    ids, budget, window, kernel = prompt(64, seed=4), 24, 8, 5
    pol = get_policy("snapkv", window=window, kernel=kernel, pooling=pooling)
    lm = load_model("random:llama-tiny", dtype="float64", overrides={"num_key_value_heads": kv_heads})
    state = Engine(lm.model, pol, EngineConfig(budget=budget, chunk_size=64)).prefill(ids)
    for li, votes in enumerate(eager_window_votes(ids, window, kv_heads)):
        held = state.cache.layers[li].view()[1]
        ref = published_scores(votes, window, kernel, pooling)  # [1, kv, 56]
        expect = published_keep(votes, window, kernel, pooling, budget)
        for h in range(kv_heads):
            got = set(held[0, h].tolist())
            if pooling == "avg":
                assert got == expect[0][h]
            else:  # max-pooling ties: compare the kept tokens' scores, not which of two equal tokens was taken
                assert set(range(64 - window, 64)) <= got
                kept_scores = sorted(ref[0, h, p].item() for p in got if p < 64 - window)
                best = sorted(ref[0, h].topk(budget - window).values.tolist())
                assert kept_scores == pytest.approx(best, abs=1e-9)
