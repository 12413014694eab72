"""Slot moves of the slot buffers (kdeval/keydiff/buffers.py) and the static layout's empty slots (see
kdeval/keydiff/cache.py).

Buffers are ``[rows, kv_heads, slots, ...]``; index tensors ``[rows, kv_heads, k]``.
"""
from __future__ import annotations

import torch


def expand_index(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``index [b, h, k]`` → ``[b, h, k, *like.shape[3:]]`` for gather/scatter along dim 2."""
    return index.view(*index.shape, *([1] * (like.dim() - 3))).expand(*index.shape, *like.shape[3:])


#: The position recorded for an empty slot of the static layout: sorts after every real position.
EMPTY_POSITION = 2**62


def resized(buf: torch.Tensor, capacity: int, keep: int, fill: int | float = 0) -> torch.Tensor:
    """A new buffer ``[rows, heads, capacity, ...]`` holding ``buf``'s first ``keep`` slots, the others ``fill``:
    how every slot buffer (uniform, per-layer, ragged, head pool) grows or is copied."""
    out = buf.new_full((*buf.shape[:2], capacity, *buf.shape[3:]), fill)
    out[:, :, :keep] = buf[:, :, :keep]
    return out


def static_visible(row, slot, cached, budget: int):
    """The static layout's attention rule: query ``row`` of the chunk sees ``slot`` when it is one of the
    ``cached`` valid head slots ``[0, cached)``, or a tail slot ``[budget, budget + t)`` at or before its own.
    Broadcasts over tensors (the dense mask) and works on FlexAttention's scalar indices (its ``mask_mod``)."""
    return (slot < cached) | ((slot >= budget) & (slot - budget <= row))


class EmptySlots:
    """Static layout: the empty head slots ``[cached, budget)`` of the ``budget + t`` slots a step scores. Eviction
    ranks them below every real score, lowest slot lowest (:func:`kdeval.keydiff.selection.rank_empty`), so it
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


def move_tail(buffers, slots: torch.Tensor, base: int) -> None:
    """Move the ``t`` tail slots ``[base, base + t)`` of every buffer ``[rows, h, slots, ...]`` into ``slots [t]``
    (empty head slots, below ``base``): what :func:`compact` does when the dropped slots are exactly those."""
    t = slots.shape[0]
    for buf in buffers:
        buf.index_copy_(2, slots, buf[:, :, base : base + t].clone())  # the clone: source and target share a buffer


def compact(buffers, drop: torch.Tensor, keep_n: int) -> None:
    """Free the slots ``drop [rows, h, k]`` of every buffer ``[rows, h, slots, ...]`` so that the kept tokens
    fill ``[0, keep_n)``: each dropped slot below ``keep_n`` (a hole) receives one surviving token from the
    tail ``[keep_n, keep_n + k)``; an O(k) move, no gather of the whole cache."""
    k = drop.shape[-1]
    dst = drop.sort(dim=-1).values  # holes first (< keep_n), then dropped tail slots
    in_tail = dst >= keep_n
    n_holes = (~in_tail).sum(dim=-1, keepdim=True)
    tail_dropped = torch.zeros_like(dst).scatter_add_(-1, (dst - keep_n).clamp(min=0), in_tail.long())
    movers = keep_n + torch.argsort(tail_dropped.clamp(max=1), dim=-1, stable=True)  # survivors first
    slot = torch.arange(k, device=dst.device)
    src = torch.where(slot < n_holes, movers, dst)  # past the holes: copy a dropped tail slot onto itself
    for buf in buffers:
        moved = buf.gather(2, expand_index(src, buf))
        buf.scatter_(2, expand_index(dst, buf), moved)
