"""The static layout's attention equals plain masked softmax attention (float64, GQA 3:1)."""
from types import SimpleNamespace

import pytest
import torch

from kdeval.keydiff.attention.capture import AttentionCapture, AttentionNeed
from kdeval.keydiff.cache.static import static_attention_forward, static_mask

from .helpers import reference_attention


def inputs(budget=6, t=3, b=2, hk=2, g=3, d=8):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, hk * g, t, d, generator=gen, dtype=torch.float64)
    k = torch.randn(b, hk, budget + t, d, generator=gen, dtype=torch.float64)
    v = torch.randn(b, hk, budget + t, d, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("cached", [0, 2, 6])
def test_masked_and_full_head_attention_match_reference(cached):
    budget, t = 6, 3
    q, k, v = inputs(budget, t)
    mask = static_mask(budget, t, cached, torch.device("cpu"))
    passed = None if cached == budget else static_mask(budget, t, cached, torch.device("cpu"), group=3)
    out, _ = static_attention_forward(SimpleNamespace(layer_idx=0), q, k, v, passed, scaling=0.3)
    want, _ = reference_attention(q, k, v, mask, 0.3)
    assert out.shape == (2, t, 6, 8)
    assert torch.allclose(out, want, atol=1e-12)


@pytest.mark.parametrize("kind", ["last", "window", "all"])
def test_captured_rows_ignore_empty_slots(kind):
    """The rows a policy records while the head fills give empty slots no attention, and sum to 1 per query."""
    budget, t, cached = 6, 3, 2
    q, k, v = inputs(budget, t)
    mask = static_mask(budget, t, cached, torch.device("cpu"))
    capture = AttentionCapture(AttentionNeed(kind, window=2))
    folded = static_mask(budget, t, cached, torch.device("cpu"), group=3)
    out, _ = static_attention_forward(SimpleNamespace(layer_idx=4), q, k, v, folded, scaling=0.3,
                                      kdeval_capture=capture)
    want, probs = reference_attention(q, k, v, mask, 0.3)
    assert torch.allclose(out, want, atol=1e-12)
    rows = {"last": 1, "window": 2, "all": 3}[kind]
    got = capture.by_layer[4]  # [b, hk, g, budget + t], summed over the recorded rows
    expected = probs[:, :, t - rows:, :].sum(2).view(2, 2, 3, -1)
    assert torch.allclose(got, expected, atol=1e-12)
    assert float(got[..., cached:budget].abs().max()) == 0.0
