"""Slot moves of the slot buffers (kdeval/keydiff/slot_buffers.py) and the empty slot's position.

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
