"""The attention functions transformers runs under the engine's implementation names, registered on import.

The model runs under ``kdeval_capture`` only while a policy that needs attention is being evaluated: it returns
SDPA's output and, when an :class:`~kdeval.keydiff.attention.capture.AttentionCapture` is passed through the forward's
keyword arguments (``kdeval_capture=``), also computes the softmax rows of just the queries asked for (the
chunk's last query, its last ``window`` queries, or all of its queries) against the whole cache, and stores
their sum over those queries per layer.

Both interfaces must be registered: without ``AttentionMaskInterface`` the mask would silently be ``None``.

``kdeval_sdpa`` is transformers' SDPA attention under an additive mask: the chunk's mask (all cached tokens,
causal within the chunk) is built once per forward as transformers builds it and turned into ``0``/``-inf`` of
the model's dtype there, instead of SDPA turning the boolean mask into that same float mask again in every
layer's call. The output is identical; on a CPU the conversion cost as much as the attention itself
(bench/RESULTS.md, "Attention mask"). ``kdeval_capture`` takes the same mask.

``kdeval_ragged`` serves a batch of independent requests (kdeval/keydiff/cache/ragged.py): the engine passes a
boolean mask ``[batch, 1, t, m]`` per row (padding and empty slots hidden), which both SDPA and the captured
rows use.

A model only ever runs under these names inside :func:`attention_implementation`, which lives here, so they are
registered before any forward that uses them.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from kdeval.keydiff.attention.capture import (CAPTURE_IMPL, RAGGED_IMPL, SDPA_IMPL, STATIC_IMPL,
                                      AttentionCapture, has_sinks)


def capture_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA's output, plus the rows the ``kdeval_capture`` keyword asks for.

    When every row of a chunk is needed (H2O), the output is computed from those rows' probabilities instead
    of running SDPA as well: the chunk's score matrix is then computed once, not twice. A single query (a
    decode step) takes SDPA plus the one recorded row, which is cheaper than a probabilities-times-values
    product.
    """
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if capture is not None and capture.fuses_output(query) and dropout == 0.0:
        return capture.attend(module.layer_idx, query, key, value, scale), None
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale)
    return out


def sdpa_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                scale: float, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA of ``query [b, hq, t, d]`` over ``key``/``value [b, hk, m, d]`` (grouped heads as they are) →
    ``[b, hq, t, d_v]``. ``mask [1 or b, 1, t, m]`` (True: visible); ``None``: all keys, causal within the chunk
    (the last ``t`` keys). ``sinks [hq]``: the model's learned sink logits (GPT-OSS), one more softmax entry per
    query head that no value holds: expressed as a zero key and value whose additive bias is the sink logit."""
    t, m = query.shape[2], key.shape[2]
    gqa = key.shape[1] != query.shape[1]
    if sinks is None:
        if mask is None:
            mask = causal_lower_right(t, m) if t > 1 else None
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                                enable_gqa=gqa)
    if mask is None:
        mask = (torch.arange(m, device=key.device) <= torch.arange(t, device=key.device).view(-1, 1) + m - t
                ).view(1, 1, t, m)
    hq = query.shape[1]
    bias = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    sink = sinks.to(query.dtype).view(1, hq, 1, 1).expand(mask.shape[0], hq, t, 1)
    bias = torch.cat([bias.expand(-1, hq, -1, -1), sink], dim=-1)
    zero_key, zero_value = key.new_zeros(*key.shape[:2], 1, key.shape[3]), value.new_zeros(*value.shape[:2], 1,
                                                                                           value.shape[3])
    return torch.nn.functional.scaled_dot_product_attention(
        query, torch.cat([key, zero_key], dim=2), torch.cat([value, zero_value], dim=2), attn_mask=bias,
        scale=scale, enable_gqa=gqa)


def ragged_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A ragged batch: SDPA under the engine's mask ``[b, 1, t, m]`` (``query [b, hq, t, d]``, ``key``/``value
    [b, hk, m, d]``), and the rows a ``kdeval_capture`` asks for under the same mask; returns ``[b, t, hq, d]``.

    SDPA takes the grouped KV heads as they are (``enable_gqa``): transformers' SDPA path would repeat the
    keys and values per query head whenever a mask is passed. ``kdeval_layer_masks`` (one mask per layer, when
    the layers keep budgets of their own and so hold different numbers of slots) replaces the mask."""
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    layer_masks = kwargs.pop("kdeval_layer_masks", None)
    sinks = kwargs.pop("s_aux", None)  # GPT-OSS's learned sink logits [q_heads]
    if layer_masks is not None:
        attention_mask = layer_masks[module.layer_idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if capture is not None and capture.fuses_output(query):
        return capture.attend(module.layer_idx, query, key, value, scale, attention_mask, sinks), None
    out = sdpa_attend(query, key, value, attention_mask, scale, sinks)
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale, attention_mask, sinks)
    return out.transpose(1, 2).contiguous(), None


def additive_mask(*args, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor | None:
    """transformers' SDPA mask (boolean ``[b, 1, t, m]``, True: visible; ``None`` where SDPA's causal path needs
    none) as the additive mask SDPA would make of it: ``0`` where visible, ``-inf`` elsewhere, in ``dtype`` (the
    model's, which transformers passes to every mask function)."""
    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def no_mask(*args, **kwargs) -> None:
    """The mask function of an attention implementation whose mask the engine passes itself (the static layout,
    a ragged batch) or its attention function builds (a head-shared pool)."""
    return None


AttentionInterface.register(SDPA_IMPL, sdpa_attention_forward)
AttentionMaskInterface.register(SDPA_IMPL, additive_mask)
AttentionInterface.register(CAPTURE_IMPL, capture_attention_forward)
AttentionMaskInterface.register(CAPTURE_IMPL, additive_mask)
AttentionInterface.register(RAGGED_IMPL, ragged_attention_forward)
AttentionMaskInterface.register(RAGGED_IMPL, no_mask)


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, impl: str | None) -> Iterator[None]:
    """Temporarily run ``model`` under attention implementation ``impl`` (no-op for ``None``)."""
    if impl is None:
        yield
        return
    config = model.config
    before = config._attn_implementation
    if before not in ("sdpa", SDPA_IMPL, CAPTURE_IMPL, STATIC_IMPL, RAGGED_IMPL) and not (
            before == "eager" and has_sinks(model)):
        raise ValueError(
            f"attn_implementation: the engine's own attention functions run on SDPA; the model uses {before!r}"
        )
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = before
