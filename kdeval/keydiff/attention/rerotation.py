"""Key re-rotation (StreamingLLM's cache positions): after an eviction the kept keys are moved to contiguous RoPE
positions ``0 .. n-1`` in the order of their absolute positions.

For a policy with ``rerotates`` the engine feeds every step at RoPE positions ``n ..`` (``n``: the tokens cached,
the same in every layer), so before an eviction the cached tokens and the chunk sit at RoPE positions equal to
their rank by absolute position. After it, a kept token's rank among the kept ones is its new RoPE position;
keys are stored rotated, and rotations compose, so re-rotating is one RoPE rotation by
``delta = new rank - old rank`` (``<= 0``). The rotation is the model's rotary embedding at positions ``delta``
(its frequencies and scaling rule) divided by its ``attention_scaling`` (the stored keys carry that factor once
already). The engine's bookkeeping positions (``ScoreContext.positions``: protection, reports) stay absolute.

In half precision each re-rotation rounds the keys once more: a token shifted at every step accumulates that
rounding (as in transformers' former ``SinkCache``, which re-rotated the same way).

Shapes: ``keys [batch, kv_heads, tokens, head_dim]``, ``positions [batch, kv_heads, tokens]``.
"""
from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import rotate_half

from kdeval.keydiff.attention.queries import rotary_embedding


def rotation(model: torch.nn.Module, delta: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``/``sin [*delta.shape, head_dim]`` of RoPE's rotation by ``delta [b, h, n]`` positions, without the
    embedding's ``attention_scaling``; float32 or wider (``like``'s dtype, promoted)."""
    rope = rotary_embedding(model)
    dtype = torch.promote_types(like.dtype, torch.float32)
    probe = torch.empty(0, dtype=dtype, device=like.device)
    cos, sin = rope(probe, delta.reshape(delta.shape[0], -1))
    scale = getattr(rope, "attention_scaling", 1.0)
    return (cos / scale).view(*delta.shape, -1), (sin / scale).view(*delta.shape, -1)


def rotate(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of ``keys`` (transformers' layout: ``rotate_half`` pairs dimension ``i`` with ``i + d/2``)."""
    return keys * cos + rotate_half(keys) * sin


def ranks(positions: torch.Tensor, sorted_positions: torch.Tensor) -> torch.Tensor:
    """For each of ``positions [b, h, n]``, how many of ``sorted_positions [b, h, m]`` (ascending) are lower."""
    return torch.searchsorted(sorted_positions.contiguous(), positions.contiguous())


def rerotate(model: torch.nn.Module, keys: torch.Tensor, positions: torch.Tensor, before: torch.Tensor) -> None:
    """Re-rotate, in place, the kept ``keys [b, h, n, d]`` at absolute ``positions [b, h, n]`` from their RoPE
    positions before the eviction (their ranks in ``before [b, h, m]``, the sorted absolute positions held then)
    to their ranks among the kept ones. Slots past a row's kept tokens hold zero keys and stay zero."""
    delta = ranks(positions, positions.sort(dim=-1).values) - ranks(positions, before)
    cos, sin = rotation(model, delta, keys)
    keys.copy_(rotate(keys.to(cos.dtype), cos, sin).to(keys.dtype))
