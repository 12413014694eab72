"""Split-KV attention over a full static cache equals plain attention (float64, GQA 3:1)."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff.config import Experimental
from kdeval.keydiff.split_attention import split_kv_attention

from .helpers import assert_same_run, make_engine, prompt, reference_attention, tiny


@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("splits", [1, 3, 4])
def test_split_attention_equals_lower_right_causal_attention(t, splits):
    budget, hk, g, d = 12, 2, 3, 8
    gen = torch.Generator().manual_seed(splits * 10 + t)
    q = torch.randn(1, hk * g, t, d, generator=gen, dtype=torch.float64)
    cap = budget + 5  # a buffer with spare slots, as the cache has: the keys are a strided view of it
    k = torch.randn(1, hk, cap, d, generator=gen, dtype=torch.float64)[:, :, : budget + t]
    v = torch.randn(1, hk, cap, d, generator=gen, dtype=torch.float64)[:, :, : budget + t]
    slots = torch.arange(budget + t)
    mask = (slots < budget) | (slots - budget <= torch.arange(t).unsqueeze(-1))  # head all, tail causal
    want, _ = reference_attention(q, k, v, mask.view(1, 1, t, budget + t), 0.3)
    got = split_kv_attention(q, k, v, 0.3, splits)
    assert got.shape == (1, t, hk * g, d)
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_split_attention_declines_what_it_cannot_split():
    q = torch.randn(2, 6, 3, 8, dtype=torch.float64)
    kv = torch.randn(2, 2, 15, 8, dtype=torch.float64)
    assert split_kv_attention(q, kv, kv, 0.3, 4) is None  # batch 2
    assert split_kv_attention(q[:1], kv[:1], kv[:1], 0.3, 5) is None  # 12 head slots in 5 splits


@pytest.mark.parametrize("policy", ["keydiff", "tova"])
def test_engine_with_split_attention_keeps_the_same_tokens(policy, monkeypatch):
    from kdeval.keydiff import attention

    calls = []

    def counted(*args):
        out = split_kv_attention(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(attention, "split_kv_attention", counted)
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(130, seed=31)
    cfg = dict(budget=40, chunk_size=16, cuda_graphs=True, emulate_graphs=True)
    ref = make_engine(lm.model, get_policy(policy), **cfg).generate(ids, max_new_tokens=8)
    got = make_engine(lm.model, get_policy(policy), **cfg, attention_splits=4).generate(ids, max_new_tokens=8)
    layers = lm.model.config.num_hidden_layers
    assert len(calls) >= 6 * layers and all(calls)  # full-head chunks and decode steps, every layer
    assert_same_run(got, ref, atol=1e-9, rtol=0)


def test_attention_splits_is_checked():
    with pytest.raises(ValueError, match=r"attention_splits: must be an integer >= 0, got -1"):
        Experimental(attention_splits=-1)
    with pytest.raises(ValueError, match=r"attention_splits: must divide the budget \(40 tokens\) into equal splits, got 3"):
        make_engine(tiny().model, get_policy("keydiff"), budget=40, attention_splits=3)
