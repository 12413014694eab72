"""Eviction from a head-shared pool (kdeval/keydiff/headpool.py): a layer's ``H * N`` kept tokens shared among
its KV heads by score (AdaKV, Feng et al. 2024, arXiv 2407.11550).

Per layer and step: each head's filled slots are gathered in position order into a padded ``[b, H, L]`` layout
(:class:`HeadTokens`; padding: zero keys, the empty position, no attention) and scored there by the policy as
any per-head score; :func:`~kdeval.keydiff.selection.raise_kept` raises the policy's protected tokens (sink,
recent window, protected ranges) to +inf, as every layout does, and :func:`select_across_heads` raises each
head's ``safeguard`` best tokens too and keeps the ``keep`` best tokens of the row across all heads, equal
scores evicted oldest position first (then lower head first), padding never kept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.attention import AttentionCapture
from kdeval.keydiff.policy import ScoreContext, held_tokens
from kdeval.keydiff.selection import lowest_oldest_first, raise_kept
from kdeval.keydiff.slots import EMPTY_POSITION, expand_index

if TYPE_CHECKING:
    from kdeval.keydiff.plan import Plan
    from kdeval.keydiff.policy import Policy
    from kdeval.keydiff.headpool import HeadPoolCache, HeadPoolLayer


class HeadTokens:
    """A layer's filled slots regrouped per KV head, in position order, padded to the fullest head:
    ``slots [b, H, L]`` (pool slot of each entry), ``valid [b, H, L]``, ``keys [b, H, L, d]`` (zero where not
    valid), ``positions [b, H, L]`` (:data:`EMPTY_POSITION` where not valid)."""

    def __init__(self, layer: "HeadPoolLayer", seen: int):
        """``seen``: tokens processed so far (every cached position is below it)."""
        m, h = layer.filled(), layer.heads
        tags, positions = layer.tags[:, 0, :m], layer.positions[:, 0, :m]
        order = (tags * (seen + 1) + positions).argsort(dim=-1)  # head-major, then position
        counts = layer.head_counts()  # [b, H]
        starts = counts.cumsum(dim=-1) - counts
        length = int(counts.max())
        j = torch.arange(length, device=tags.device)
        self.valid = j < counts.unsqueeze(-1)  # [b, H, L]
        at = (starts.unsqueeze(-1) + j).clamp(max=m - 1).view(tags.shape[0], -1)
        self.slots = order.gather(1, at).view(*self.valid.shape)
        flat = self.slots.view(tags.shape[0], 1, -1)
        keys = layer.keys[:, :, :m].gather(2, expand_index(flat, layer.keys)).view(*self.valid.shape, -1)
        self.keys = keys.masked_fill(~self.valid.unsqueeze(-1), 0)
        self.positions = positions.gather(1, flat[:, 0]).view(*self.valid.shape).masked_fill(~self.valid,
                                                                                               EMPTY_POSITION)

    def take(self, per_slot: torch.Tensor) -> torch.Tensor:
        """``[b, H, group, M]`` per pool slot (captured attention) → ``[b, H, group, L]``, zero where not valid."""
        index = self.slots.unsqueeze(2).expand(-1, -1, per_slot.shape[2], -1)
        return per_slot.gather(-1, index).masked_fill(~self.valid.unsqueeze(2), 0)

    def kept_slots(self, kept: torch.Tensor) -> torch.Tensor:
        """``kept [b, H, L]`` (the same count per row) → their pool slots ``[b, K]`` in (head, position) order."""
        return self.slots[kept].view(kept.shape[0], -1)


def select_across_heads(scores: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, safeguard: int,
                        keep: int) -> torch.Tensor:
    """Which of the ``[b, H, L]`` entries to keep: ``keep`` per row (module docstring) → bool ``[b, H, L]``.

    ``scores``: the policy's, the entries always kept (the protected tokens) raised to +inf
    (:func:`kdeval.keydiff.selection.raise_kept`); ``safeguard``: each head's best tokens also always kept
    (equal scores: oldest first). Entries not ``valid`` are freed first, whatever their score. Needs at most
    ``keep`` raised valid entries and at least ``keep`` valid ones per row."""
    scores = scores if scores.dtype == torch.float64 else scores.float()
    if safeguard > 0:
        best = lowest_oldest_first((-scores).masked_fill(~valid, float("inf")), positions, safeguard)
        scores = scores.scatter(-1, best, float("inf"))
    b, h, n = scores.shape
    flat_scores, flat_valid = scores.reshape(b, -1), valid.reshape(b, -1)
    head = torch.arange(h, device=scores.device).repeat_interleave(n)
    order = (positions.masked_fill(~valid, 0).reshape(b, -1) * h + head).argsort(dim=-1)  # oldest, then head
    order = order.gather(1, torch.sort(flat_scores.gather(1, order), dim=-1, stable=True).indices)  # lowest first
    order = order.gather(1, torch.sort(flat_valid.gather(1, order).to(torch.uint8), dim=-1, stable=True).indices)
    kept = torch.ones_like(flat_valid).scatter_(1, order[:, : h * n - keep], False)
    return kept.view(b, h, n)


def evict_pool(policy: "Policy", plan: "Plan", cache: "HeadPoolCache", t: int, seen: int, steps: int,
               capture: AttentionCapture | None, evict: bool, protected: tuple[tuple[int, int], ...]) -> None:
    """Eviction after a step over a head-shared pool (``plan``'s budgets, ``policy``'s scores): layer ``idx``
    keeps ``H * (budgets[idx] + held)`` tokens (``held``: the protected ranges' tokens, per head);
    ``evict=False``: the policy observes the step and everything is kept."""
    held = held_tokens(protected)
    for idx, layer in enumerate(cache.layers):
        if not plan.evicting:
            layer.commit(None)
            continue
        budget = plan.budgets[idx]
        keep = layer.heads * (budget + held)
        heads = HeadTokens(layer, seen)
        attention = capture.by_layer.get(idx) if capture is not None else None
        ctx = ScoreContext(idx, heads.positions, seen, t, None if attention is None else heads.take(attention), {},
                           steps)
        policy.observe(ctx)
        if not evict or layer.filled() <= keep:
            layer.commit(None)
            continue
        scores = raise_kept(policy.score(heads.keys, ctx), heads.positions, seen, policy, budget, protected)
        kept = select_across_heads(scores, heads.positions, heads.valid, policy.head_safeguard(budget), keep)
        layer.commit(heads.kept_slots(kept))
    if capture is not None:
        capture.clear()
