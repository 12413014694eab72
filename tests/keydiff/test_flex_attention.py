"""FlexAttention for the static layout: the same attention as the masked SDPA it replaces, with the empty head
blocks skipped, and an engine run that keeps the same tokens as the gather store."""
from __future__ import annotations

import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.config import Experimental
from kdeval.keydiff.attention import static_mask
from kdeval.keydiff.flex_static import flex_static_attention, static_block_mask
from .helpers import assert_same_run, prompt, tiny

N = 512


def visible_blocks(mask) -> int:
    """Key blocks the kernel visits for the first query block (partial plus full)."""
    return int(mask.kv_num_blocks[0, 0, 0]) + int(mask.full_kv_num_blocks[0, 0, 0])


@pytest.mark.parametrize("t", [1, 16])
def test_flex_equals_masked_sdpa_at_every_fill_level(t):
    g = torch.Generator().manual_seed(5)
    hk, group, d = 2, 3, 16
    q = torch.randn(1, hk * group, t, d, generator=g)
    k = torch.randn(1, hk, N + t, d, generator=g)
    v = torch.randn(1, hk, N + t, d, generator=g)
    blocks = {}
    for cached in (0, 100, 300, N):
        mask = static_mask(N, t, cached, q.device)  # [1, 1, t, N + t]
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True).transpose(1, 2)
        block_mask = static_block_mask(N, t, torch.tensor(cached), q.device)
        got = flex_static_attention(q, k, v, 0.25, block_mask)
        assert got.shape == (1, t, hk * group, d)
        assert torch.allclose(got, want, rtol=0, atol=2e-6), (cached, (got - want).abs().max())
        blocks[cached] = visible_blocks(block_mask)
    # 128-slot key blocks: an empty head leaves only the tail's block; each filled block adds one
    assert blocks == {0: 1, 100: 2, 300: 4, N: 5}


@pytest.mark.parametrize("policy", ["keydiff", "snapkv", "h2o"])
def test_engine_with_flex_attention_keeps_the_gather_stores_tokens(policy, monkeypatch):
    from kdeval.keydiff import attention

    calls = []

    def counted(query, *args):
        calls.append(query.shape[2])
        return flex_static_attention(query, *args)

    monkeypatch.setattr(attention, "flex_static_attention", counted)
    lm = tiny("random:llama-tiny", 2)
    ids = prompt(130, seed=31)
    ref = Engine(lm.model, get_policy(policy), EngineConfig(budget=40, chunk_size=16), store="gather").generate(
        ids, max_new_tokens=8)
    got = Engine(lm.model, get_policy(policy), EngineConfig(budget=40, chunk_size=16, cuda_graphs=True),
                 emulate_graphs=True, experimental=Experimental(flex_attention=True)).generate(ids, max_new_tokens=8)
    layers = lm.model.config.num_hidden_layers
    decode_calls = 7 * layers  # 8 tokens: the first comes from the prefill
    # every layer of the 8 full chunks (room, partial and full steps) and of every decode step; H2O in float32
    # computes a chunk's output from its captured rows instead; the ragged last chunk (2 tokens) takes SDPA
    assert calls.count(1) == decode_calls
    assert calls.count(16) == (0 if policy == "h2o" else 8 * layers) and set(calls) <= {1, 16}
    assert_same_run(got, ref, atol=1e-5, rtol=0)


def test_flex_attention_is_checked():
    with pytest.raises(ValueError, match="flex_attention: FlexAttention replaces attention_splits"):
        Experimental(flex_attention=True, attention_splits=4)
    lm = tiny("random:llama-tiny", 2, "float64")
    with pytest.raises(ValueError, match="flex_attention: FlexAttention on a CPU takes float32, float16 or "
                                         "bfloat16 models; this one is float64"):
        Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=40, chunk_size=16, cuda_graphs=True),
               emulate_graphs=True, experimental=Experimental(flex_attention=True))
