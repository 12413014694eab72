"""What a policy reads besides the keys and their positions, gathered during a step and handed to its scores.

A policy declares its reads in ``PolicyNeeds`` (kdeval/keydiff/policy/interface.py); the step (kdeval/keydiff/step/step.py)
captures them during the forward (queries by :func:`~kdeval.keydiff.attention.queries.capture_queries`) and every cache
layout's eviction (kdeval/keydiff/cache/layouts.py) fills them into each layer's ``ScoreContext`` the same way
(:meth:`StepReads.fill`), so a policy that reads something new needs no edit outside its own file:

- ``attention``: the attention rows of the chunk's queries, computed beside SDPA (kdeval/keydiff/attention/capture.py);
- ``queries``: the layer's recent queries before RoPE and RoPE ahead (kdeval/keydiff/attention/queries.py);
- ``values``: the cached values ``[batch, kv_heads, tokens, head_dim]`` beside the keys, in the layout's order;
- ``projections``: the layer's attention projections and the model's RoPE (:class:`LayerProjections`), e.g. to
  take values through ``W_o`` or the cached keys back to before RoPE;
- ``repeat``: the scores a repeat pass gave the step's chunk (kdeval/keydiff/step/repeat_pass.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from kdeval.keydiff.attention.capture import AttentionCapture
from kdeval.keydiff.attention.queries import StepQueries, attention_modules
from kdeval.keydiff.attention.layer_kinds import decoder_config


@dataclass(frozen=True)
class LayerProjections:
    """One decoder layer's attention projections (``torch.nn.Linear``-like modules): ``q_proj`` ``[hidden ->
    q_heads * head_dim]``, ``k_proj``/``v_proj`` ``[hidden -> kv_heads * head_dim]``, ``o_proj`` ``[q_heads *
    head_dim -> hidden]``; and the model's rotary embedding (``None`` for a model without RoPE), to take the cached
    keys back to before RoPE (:meth:`unrotated_keys`)."""

    q_proj: torch.nn.Module
    k_proj: torch.nn.Module
    v_proj: torch.nn.Module
    o_proj: torch.nn.Module
    head_dim: int
    rotary: torch.nn.Module | None = None

    def unrotated_keys(self, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cached ``keys [b, h, n, d]``, rotated by RoPE at ``positions [b, h, n]``, rotated back: the keys
        before RoPE (after the layer's key norm, where it has one) ``[b, h, n, d]``, float32 or wider. Slots that
        hold no token (zero keys) stay zero."""
        # imported here: the policy interface imports this module where grids are validated, without transformers
        from transformers.models.llama.modeling_llama import rotate_half

        from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION

        if self.rotary is None:
            raise ValueError("model: it has no rotary embedding (rotary_emb) to take the keys back to before RoPE")
        b, h, n, d = keys.shape
        dtype = torch.promote_types(keys.dtype, torch.float32)
        at = positions.masked_fill(positions >= EMPTY_POSITION, 0).reshape(b, h * n)
        cos, sin = self.rotary(torch.empty(0, dtype=dtype, device=keys.device), at)
        cos, sin = cos.view(b, h, n, d), sin.view(b, h, n, d)
        k = keys.to(dtype)
        # stored keys are s * R(p) k (s: the embedding's attention_scaling, in its cos and sin): R(-p) is the same
        # cos and the opposite sin, and brings s once more
        scale = getattr(self.rotary, "attention_scaling", 1.0)
        return (k * cos - rotate_half(k) * sin) / (scale * scale)

    def rotated(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``x [b, h, w, d]`` (queries before RoPE) rotated by RoPE at ``positions [b, w]`` (``-1``: none, rotated
        at 0), as the model rotates its queries: ``[b, h, w, d]``, float32 or wider."""
        from transformers.models.llama.modeling_llama import rotate_half  # here: see unrotated_keys

        dtype = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self.rotary(torch.empty(0, dtype=dtype, device=x.device), positions.clamp(min=0))
        x = x.to(dtype)
        return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def layer_projections(model: torch.nn.Module) -> list[LayerProjections]:
    """Every decoder layer's :class:`LayerProjections` (``ValueError`` naming ``model`` when one is missing)."""
    out = []
    base = getattr(model, model.base_model_prefix, model)
    rotary = getattr(base, "rotary_emb", None)
    for idx, attn in enumerate(attention_modules(model)):
        mods = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        if any(m is None for m in mods):
            raise ValueError(f"model: layer {idx}'s attention lacks q_proj/k_proj/v_proj/o_proj, which the policy reads")
        head_dim = getattr(attn, "head_dim", None) or _head_dim(decoder_config(model.config))
        out.append(LayerProjections(*mods, head_dim=head_dim, rotary=rotary))
    return out


class StepReads:
    """What one step hands the policy's scores, per layer (module docstring); ``needs``: the policy's
    ``PolicyNeeds``."""

    def __init__(self, needs, attention: AttentionCapture | None = None,
                 queries: StepQueries | None = None,
                 projections: list[LayerProjections] | None = None, repeat: dict[int, torch.Tensor] | None = None,
                 fold_heads: bool = False):
        """``fold_heads``: the cache holds one row a token for every query head (MLA): the captured rows of the
        ``q_heads`` heads become one KV head's group."""
        self.needs, self.capture, self.queries = needs, attention, queries
        self.fold_heads = fold_heads
        self.repeat = repeat  # per layer, the step's repeat-pass scores [batch, kv_heads, n_new]
        self.projections = projections if needs.projections else None

    def attention(self, idx: int) -> torch.Tensor | None:
        """Layer ``idx``'s captured rows ``[batch, kv_heads, group, slots]`` (``None``: the policy reads none)."""
        rows = self.capture.by_layer.get(idx) if self.capture is not None else None
        if rows is not None and self.fold_heads:  # MLA: every query head reads the layer's one latent row
            rows = rows.reshape(rows.shape[0], 1, -1, rows.shape[-1])
        return rows

    def fill(self, ctx, values: Callable[[], torch.Tensor]) -> None:
        """Give ``ctx`` (its layer's context) what the policy reads besides keys, positions, rows and state;
        ``values()``: the layer's values beside the keys the context scores."""
        idx = ctx.layer_idx
        if self.queries is not None:
            ctx.queries = self.queries.layer(idx)
        if self.needs.values:
            ctx.values = values()
        if self.projections is not None:
            ctx.projections = self.projections[idx]
        if self.repeat is not None:
            ctx.repeat = self.repeat[idx]

    def done(self) -> None:
        """Drop the step's captured rows (the capture is reused by the next step's forward)."""
        if self.capture is not None:
            self.capture.clear()


def _head_dim(config) -> int:
    return config.hidden_size // config.num_attention_heads
