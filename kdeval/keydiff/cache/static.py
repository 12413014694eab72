"""The static slot layout in one place: what the captured CUDA-graph step (kdeval/keydiff/step/graphs.py) runs on.

A static-layout cache (``BudgetCache.static_base = N``, its layers :class:`~kdeval.keydiff.cache.budget_cache.StaticLayer`) has
``N + B`` slots per layer from the first chunk on. Every chunk of ``t`` tokens is written to the tail slots
``[N, N + t)`` and attention, scoring and eviction always see all ``N + t`` slots, so every full chunk has the
same shapes. While fewer than ``N`` tokens are cached, slots ``[cached, N)`` are empty (zero keys,
:data:`~kdeval.keydiff.cache.slot_buffers.EMPTY_POSITION`): :func:`static_mask` hides them from attention and
:class:`EmptySlots` makes eviction free them first, lowest slot first, so the valid tokens stay in
``[0, cached)`` with ``cached = min(tokens seen, N)``.

A step's kind (:func:`phase`, each its own captured graph): ``room`` (the empty head slots take the whole chunk:
nothing to score, the chunk moves there), ``partial`` (some empty slots, some eviction) or ``full`` (no empty
slot: no mask, plain lower-right causal attention). :func:`static_inputs` gives a step its empty slots and mask;
:func:`static_attention_forward` (implementation ``kdeval_static``) attends under them. It also serves a dynamic
cache whose layers hold different counts (per-layer budgets), with no mask.
"""
from __future__ import annotations

import torch
from torch.nn.attention.bias import causal_lower_right
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from kdeval.keydiff.attention.capture import STATIC_IMPL, AttentionCapture
from kdeval.keydiff.attention.functions import no_mask, sdpa_attend


def static_visible(row, slot, cached, budget: int):
    """The static layout's attention rule: query ``row`` of the chunk sees ``slot`` when it is one of the
    ``cached`` valid head slots ``[0, cached)``, or a tail slot ``[budget, budget + t)`` at or before its own.
    Broadcasts over tensors (the dense mask) and works on FlexAttention's scalar indices (its ``mask_mod``)."""
    return (slot < cached) | ((slot >= budget) & (slot - budget <= row))


class EmptySlots:
    """Static layout: the empty head slots ``[cached, budget)`` of the ``budget + t`` slots a step scores. Eviction
    ranks them below every real score, lowest slot lowest (:func:`kdeval.keydiff.policy.selection.rank_empty`), so it
    frees them first and in slot order (the chunk then moves into ``[cached, cached + t)`` in every layer and
    head: the valid slots stay a prefix). Which slots are empty is the same for every layer: computed once per
    step.

    ``room``: the host knows that the empty slots hold the whole chunk (``cached + t <= budget``). Eviction
    would then free exactly ``[cached, cached + t)``, so the engine skips scoring and moves the chunk there
    (:func:`move_tail`); ``room_slots`` ``[t]`` are those slots.
    """

    def __init__(self, budget: int, t: int, cached: int | torch.Tensor, device: torch.device, room: bool = False):
        slots = torch.arange(budget + t, device=device)
        self.room_slots = slots[:t] + cached if room else None
        #: ``[budget + t]``, True at the empty slots (``None`` with ``room``)
        self.mask = None if room else (slots >= cached) & (slots < budget)


def static_mask(budget: int, t: int, cached: int | torch.Tensor, device: torch.device, group: int = 1) -> torch.Tensor:
    """The static layout's mask ``[1, 1, group * t, budget + t]`` (True: visible): the ``cached`` valid head
    slots ``[0, cached)`` for every query, and the chunk's tail slots ``[budget, budget + t)`` causally; the
    ``t`` rows repeated ``group`` times (the query heads of a KV head, folded into the query axis)."""
    slots = torch.arange(budget + t, device=device)
    rows = torch.arange(t, device=device).repeat(group).unsqueeze(-1)
    return static_visible(rows, slots, cached, budget).view(1, 1, group * t, budget + t)


def static_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention for the static layout: ``query [b, hq, t, d]`` over ``key``/``value [b, hk, N + t, d]``;
    returns ``[b, t, hq, d]``.

    ``attention_mask``: :func:`static_mask` ``[1, 1, g * t, N + t]`` while the head fills, with the ``g = hq /
    hk`` query heads of a KV head folded into the query axis (``[b, hk, g * t, d]``), so SDPA's masked kernels
    run without repeating the keys and values; ``None`` once the head is full (plain lower-right causal, no
    mask tensor).
    """
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    layer_masks = kwargs.pop("kdeval_layer_masks", None)  # a dynamic cache's windowed layers (layouts.py)
    sinks = kwargs.pop("s_aux", None)  # GPT-OSS's learned sink logits [q_heads]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    b, hq, t, d = query.shape
    window = layer_masks[module.layer_idx] if layer_masks is not None and attention_mask is None else None
    if window is not None or sinks is not None:  # a windowed layer's mask by position, or the model's sinks
        if capture is not None and capture.fuses_output(query):
            return capture.attend(module.layer_idx, query, key, value, scale, window, sinks), None
        out = sdpa_attend(query, key, value, window, scale, sinks).transpose(1, 2).contiguous()
        if capture is not None:
            capture.record(module.layer_idx, query, key, scale, window, sinks)
        return out, None
    rows = None if attention_mask is None else attention_mask[:, :, :t]  # one query head's rows [1, 1, t, N + t]
    if capture is not None and capture.fuses_output(query):
        return capture.attend(module.layer_idx, query, key, value, scale, rows), None
    if attention_mask is None:
        # Every head slot is valid: the mask is "all of the head, causal within the tail", i.e. causal aligned
        # to the lower right, which SDPA's flash kernel takes without a mask tensor (and with GQA).
        bias = causal_lower_right(t, key.shape[2]) if t > 1 else None
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scale,
                                                               enable_gqa=True).transpose(1, 2).contiguous()
        if capture is not None:
            capture.record(module.layer_idx, query, key, scale)
        return out, None
    hk = key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, hk, hq // hk * t, d), key, value, attn_mask=attention_mask, scale=scale)
    out = out.view(b, hq, t, -1).transpose(1, 2).contiguous()
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale, rows)
    return out, None


def phase(length: int, budget: int, t: int) -> str:
    """The static layout's step kind for ``t`` more tokens after ``length`` held of ``budget`` (module docstring):
    ``room``, ``partial`` or ``full``."""
    return "full" if length >= budget else "room" if length + t <= budget else "partial"


def static_inputs(budget: int, length: int, t: int, seen_after: int | torch.Tensor, device: torch.device,
                  group: int) -> tuple[EmptySlots, torch.Tensor | None]:
    """A static step's empty slots and attention mask (``None`` once the head is full: the causal rule needs none)
    for ``t`` tokens after ``length`` held (host bookkeeping, exact); ``seen_after``: tokens seen after the step,
    an int or a 0-d device tensor under graphs."""
    cached = (seen_after - t).clamp(max=budget) if isinstance(seen_after, torch.Tensor) else min(seen_after - t,
                                                                                                     budget)
    kind = phase(length, budget, t)
    empty = EmptySlots(budget, t, cached, device, room=kind == "room")
    # A full head needs no mask (lower-right causal); a 4-D mask reaches the attention function as it is.
    mask = static_mask(budget, t, cached, device, group) if kind != "full" else None
    return empty, mask


AttentionInterface.register(STATIC_IMPL, static_attention_forward)
AttentionMaskInterface.register(STATIC_IMPL, no_mask)
