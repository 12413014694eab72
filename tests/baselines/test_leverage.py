"""LeverageScore: the leverage of the centred, sketched keys before RoPE, against a float64 oracle that takes the
keys from ``k_proj`` of the hidden states and inverts the regularized Gram matrix outright."""
import pytest
import torch

from kdeval.baselines import get_policy
from kdeval.baselines.leverage import gaussian_sketch, z_scores
from kdeval.keydiff import Engine, EngineConfig
from kdeval.keydiff.attention.reads import layer_projections

from ..keydiff.helpers import capture_hidden_states, kept_positions, prompt, tiny

L, N = 64, 24


def keys_before_rope(lm, ids):
    """Per layer ``[1, kv_heads, L, d]``: ``k_proj`` of the hidden states entering the layer's attention."""
    with torch.no_grad(), capture_hidden_states(lm.model) as hidden:
        cache = lm.model(ids, use_cache=True).past_key_values
    out = []
    for idx, proj in enumerate(layer_projections(lm.model)):
        k = proj.k_proj(hidden[idx])
        out.append(k.view(1, L, -1, proj.head_dim).transpose(1, 2))
    return out, cache


def oracle(pre, sketch):
    x = (pre - pre.mean(dim=-2, keepdim=True)) @ sketch.unsqueeze(0)  # [1, h, L, k]
    gram = x.transpose(-2, -1) @ x + 1e-2 * torch.eye(x.shape[-1], dtype=x.dtype)
    return torch.einsum("bhnk,bhkj,bhnj->bhn", x, torch.linalg.inv(gram), x).clamp_min(0)


def test_the_cached_keys_rotated_back_are_the_keys_before_rope():
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=2)
    pre, cache = keys_before_rope(lm, ids)
    positions = torch.arange(L).flip(0).expand(1, 2, -1)  # any slot order: each key with its own position
    for idx, proj in enumerate(layer_projections(lm.model)):
        keys = cache.layers[idx].keys.flip(2)
        # RoPE's cos/sin are float32 even in a float64 model: cos^2 + sin^2 = 1 to ~1e-7
        torch.testing.assert_close(proj.unrotated_keys(keys, positions), pre[idx].flip(2), rtol=0, atol=1e-6)


@pytest.mark.parametrize("width", [4, 48])  # a sketch narrower than head_dim (16), and kvpress' default
def test_leverage_keeps_the_oracles_top_n(width):
    lm = tiny("random:llama-tiny", 2, "float64")
    ids = prompt(L, seed=2)
    pre, _ = keys_before_rope(lm, ids)
    state = Engine(lm.model, get_policy("leverage", sketch_dimension=width, seed=3),
                   EngineConfig(budget=N, chunk_size=L)).prefill(ids)
    for idx, kept in enumerate(kept_positions(state)):
        sketch = gaussian_sketch(3, idx, 2, pre[idx].shape[-1], width, pre[idx])
        want = oracle(pre[idx], sketch).topk(N, dim=-1).indices.sort(-1).values
        assert torch.equal(kept, want)


def test_z_scores_leave_out_empty_slots():
    scores = torch.tensor([[[1.0, 2.0, 3.0, 99.0]]])
    valid = torch.tensor([[[True, True, True, False]]])
    assert torch.equal(z_scores(scores, valid), torch.tensor([[[-1.0, 0.0, 1.0, 0.0]]]))


def test_bad_sketch_dimension_names_the_field():
    with pytest.raises(ValueError, match="sketch_dimension: must be an integer > 0, got 0"):
        get_policy("leverage", sketch_dimension=0)
