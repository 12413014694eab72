"""Captured attention in a half-precision model: logits in the model's precision (as transformers' eager
attention computes them for H2O's and kvpress' reference code), softmax in float32, output from SDPA."""
from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.attention.capture import AttentionCapture, AttentionNeed
from kdeval.keydiff.cache.static import static_attention_forward, static_mask

from .helpers import prompt, tiny
from .oracles import EMULATED

B, HK, G, T, M, D = 1, 2, 3, 4, 40, 64


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, HK * G, T, D, generator=gen) * 2).to(torch.bfloat16)
    k = (torch.randn(B, HK, M, D, generator=gen) * 2).to(torch.bfloat16)
    v = torch.randn(B, HK, M, D, generator=gen).to(torch.bfloat16)
    return q, k, v


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_half_precision_logits_are_as_precise_as_eager_attention(seed):
    q, k, v = _inputs(seed)
    scale = D ** -0.5
    exact = AttentionCapture(AttentionNeed("all")).probabilities(q.double(), k.double(), scale, T)  # of these inputs
    half = AttentionCapture(AttentionNeed("all")).probabilities(q, k, scale, T)
    f32 = AttentionCapture(AttentionNeed("all"), float32_logits=True).probabilities(q, k, scale, T)
    assert half.dtype == f32.dtype == torch.float32
    hidden = torch.arange(M).unsqueeze(0) > torch.arange(M - T, M).unsqueeze(-1)  # causal within the chunk
    mask = torch.zeros(1, 1, T, M, dtype=torch.bfloat16).masked_fill(hidden, float("-inf"))
    _, eager = eager_attention_forward(SimpleNamespace(num_key_value_groups=G, training=False), q, k, v, mask,
                                       scaling=scale)
    err = lambda p: float((p.double().reshape(exact.shape) - exact).abs().max())  # noqa: E731
    assert err(f32) < 1e-5
    assert 10 * err(f32) < err(half) <= 1.25 * err(eager)


def test_half_precision_output_comes_from_sdpa_and_float32_logits_from_the_probabilities():
    """H2O (every row captured): in a bf16 model the chunk's output is SDPA's, exactly as without capture;
    with float32 logits it is the product of the float32 probabilities with the values."""
    budget, t, cached = 30, 6, 12
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, HK * G, t, D, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, HK, budget + t, D, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, HK, budget + t, D, generator=gen).to(torch.bfloat16)
    folded = static_mask(budget, t, cached, torch.device("cpu"), group=G)
    layer = SimpleNamespace(layer_idx=0)
    plain, _ = static_attention_forward(layer, q, k, v, folded, scaling=0.125)
    for float32_logits in (False, True):
        capture = AttentionCapture(AttentionNeed("all"), float32_logits=float32_logits)
        out, _ = static_attention_forward(layer, q, k, v, folded, scaling=0.125, kdeval_capture=capture)
        assert capture.by_layer[0].shape == (1, HK, G, budget + t)
        assert float(capture.by_layer[0][..., cached:budget].abs().max()) == 0.0  # empty slots get nothing
        assert torch.equal(out, plain) != float32_logits


@pytest.mark.parametrize("precision", ["model", "float32"])
def test_bf16_attention_policies_run_under_the_budget(precision):
    lm = tiny("random:llama-tiny", 2, "bfloat16")
    for policy in ("h2o", "snapkv", "tova"):
        for graphs in (False, True):
            eng = Engine(lm.model, get_policy(policy), EngineConfig(
                budget=40, chunk_size=16, cuda_graphs=graphs, score_precision=precision), **(EMULATED if graphs else {}))
            res = eng.generate(prompt(100, seed=5), max_new_tokens=4)
            assert res.stats.peak_kv_tokens <= 40 + 16 and res.stats.kept_tokens == 40


def test_score_precision_is_checked():
    with pytest.raises(ValueError, match=r"score_precision: expected one of \['model', 'float32'\], got 'fp16'"):
        EngineConfig(score_precision="fp16")
