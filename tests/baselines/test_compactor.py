"""Compactor: the non-causal tiled attention against the prefill's form (the sequence padded to whole tiles with
zero queries and keys at logit -1e-9, one softmax per tile), and the blend's default weight."""
import math

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.compactor import tiled_attention
from kdeval.keydiff import Engine, EngineConfig

from ..keydiff.helpers import kept_positions, prompt, tiny


def padded_tiles(q, k, tile):
    """``q [b, hq, S, d]``, ``k [b, hk, S, d]`` in position order → column sums ``[b, hk, S]``, kvpress' way."""
    b, hq, s, d = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    pad = math.ceil(s / tile) * tile - s
    qp = torch.cat([q, q.new_zeros(b, hq, pad, d)], 2).view(b, hq, -1, tile, d)
    kp = torch.cat([k, k.new_zeros(b, hq, pad, d)], 2).view(b, hq, -1, tile, d)
    dots = qp @ kp.transpose(-1, -2)
    is_pad = torch.arange(tile) >= tile - pad
    dots[:, :, -1].masked_fill_(is_pad.view(-1, 1), 0)
    dots[:, :, -1].masked_fill_(is_pad.view(1, -1), -1e-9)
    sums = dots.softmax(-1).sum(-2).reshape(b, hq, -1)[..., :s]
    return sums.view(b, -1, group, s).mean(2)


@pytest.mark.parametrize("s, tile", [(45, 16), (48, 16), (7, 16)])  # a short last tile, whole tiles, one tile
def test_tiled_attention_is_the_padded_prefill_form(s, tile):
    g = torch.Generator().manual_seed(s)
    start = 5  # tiles start after the sinks
    q = torch.randn(1, 4, s, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, s, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(start, start + s)
    slots = torch.randperm(s, generator=g)  # keys in slot order, queries in position order
    got = tiled_attention(q, pos.unsqueeze(0), k[:, :, slots], pos[slots].expand(1, 2, -1),
                          torch.ones(1, 2, s, dtype=torch.bool), start, torch.tensor([[start + s]]), tile)
    torch.testing.assert_close(got, padded_tiles(q, k, tile)[:, :, slots], rtol=1e-12, atol=1e-12)


def test_default_blending_is_the_evicted_fraction():
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(80, seed=4)
    kept = []
    for blending in (None, 1 - 30 / 80):
        policy = get_policy("compactor", chunk_size=16, blending=blending, query_window=80)
        kept.append(kept_positions(Engine(lm.model, policy, EngineConfig(budget=30, chunk_size=80)).prefill(ids)))
    assert all(torch.equal(a, b) for a, b in zip(*kept))


@pytest.mark.parametrize("params, message", [
    (dict(chunk_size=0), "chunk_size: must be an integer > 0, got 0"),
    (dict(blending=-1.0), "blending: expected a number >= 0 or null, got -1.0"),
    (dict(sink_size_end=-2), "sink_size_end: must be an integer >= 0, got -2"),
])
def test_bad_parameters_name_the_field(params, message):
    with pytest.raises(ValueError, match=message):
        get_policy("compactor", **params)
