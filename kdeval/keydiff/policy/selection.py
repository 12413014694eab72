"""Which cached tokens a step frees: one pipeline for every cache layout (dynamic, static, per-layer, ragged,
head pool).

1. the policy's scores ``[rows, kv_heads, slots]`` over every cached token, protected ones included
   (higher = keep);
2. the tokens always kept raised to +inf (:func:`raise_kept`): the policy's first ``n_sink`` positions, its
   ``n_recent`` most recent ones, and the protected position ranges (kvpress's question);
3. slots that hold no token (the static layout's empty head slots, a ragged batch's empty and padding slots)
   lowered below every real score, lowest slot lowest (:func:`rank_empty`), so they are freed first, in slot
   order;
4. the ``k`` lowest freed (:func:`lowest`): equal scores oldest position first when the policy's scores tie
   exactly (``PolicyNeeds.exact_ties``), else ``topk``'s choice.

:class:`Selector` runs the four for one policy. A head-shared pool (AdaKV) takes steps 1 and 2 and then keeps
the best tokens of a whole layer across its KV heads (:meth:`Selector.scores`, kdeval/keydiff/cache/headpool.py).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext

Ranges = Sequence[tuple[int, int]]


def held_mask(positions: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """Which of ``positions`` (any shape) fall in the protected position ``ranges`` (``(start, end)`` pairs)."""
    held = torch.zeros_like(positions, dtype=torch.bool)
    for start, end in ranges:
        held |= (positions >= start) & (positions < end)
    return held


def protect(scores: torch.Tensor, positions: torch.Tensor, seen: int | torch.Tensor, n_sink: int,
            n_recent: int) -> torch.Tensor:
    """``scores`` with the first ``n_sink`` and the ``n_recent`` most recent positions (``seen``: tokens
    processed so far) raised to +inf."""
    if n_sink <= 0 and n_recent <= 0:
        return scores
    mask = torch.zeros_like(positions, dtype=torch.bool)
    if n_sink > 0:
        mask |= positions < n_sink
    if n_recent > 0:
        mask |= positions >= seen - n_recent
    return scores.masked_fill(mask, float("inf"))


def raise_kept(scores: torch.Tensor, positions: torch.Tensor, seen: int | torch.Tensor, policy: Policy, budget: int,
               protected: Ranges | Sequence[Ranges] = (), per_row: bool = False) -> torch.Tensor:
    """Step 2: ``scores [rows, h, n]`` with the tokens ``policy`` always keeps under ``budget`` and the
    ``protected`` ranges raised to +inf. ``per_row``: ``protected[r]`` are row ``r``'s ranges (a ragged batch);
    else the ranges hold for every row."""
    scores = protect(scores, positions, seen, policy.n_sink(), policy.n_recent(budget))
    if per_row and any(protected):
        held = torch.stack([held_mask(positions[r], ranges) for r, ranges in enumerate(protected)])
        return scores.masked_fill(held, float("inf"))
    if not per_row and protected:
        return scores.masked_fill(held_mask(positions, protected), float("inf"))
    return scores


def rank_empty(scores: torch.Tensor, empty: torch.Tensor, memo: dict | None = None) -> torch.Tensor:
    """Step 3: ``scores [rows, h, m]`` with the slots where ``empty`` (bool, broadcast to the scores) is True
    below every real score, distinct, lowest slot lowest (from -2e30 at slot 0 towards -1e30): float32 at least,
    for that range. ``memo``: a dict that keeps the ranks per (m, dtype, device) from step to step."""
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    m = scores.shape[-1]
    key = (m, scores.dtype, scores.device)
    ranks = memo.get(key) if memo is not None else None
    if ranks is None:
        ranks = -1e30 * (2.0 - torch.arange(m, device=scores.device, dtype=scores.dtype) / m)
        if memo is not None:
            memo[key] = ranks
    return torch.where(empty, ranks, scores)


def sort_oldest_first(scores: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` lowest of ``scores [rows, h, n]``, equal scores oldest first, by a stable sort of the scores
    taken in position order (``order``: the indices that sort the positions) → indices ``[rows, h, k]``."""
    pick = torch.sort(scores.gather(-1, order), dim=-1, stable=True).indices[..., :k]
    return order.gather(-1, pick)


def lowest_oldest_first(scores: torch.Tensor, positions: torch.Tensor, k: int,
                        position_order: Callable[[], torch.Tensor] | None = None, sorted: bool = False
                        ) -> torch.Tensor:
    """The ``k`` lowest of ``scores [rows, h, n]`` per row, equal scores taken oldest position first →
    indices ``[rows, h, k]`` (in no particular order; ``sorted``: lowest first).

    float32 (and half-precision) scores: one ``topk`` over 64-bit keys, the score's bits mapped to an integer
    of the same order above the position, instead of :func:`sort_oldest_first`. float64 scores do not fit such
    a key and take the sort, in the order ``position_order()`` gives (``ScoreContext.position_order``, which
    pooling may have computed already), else one computed here.
    """
    if scores.dtype == torch.float64:
        order = position_order() if position_order is not None else positions.argsort(dim=-1)
        return sort_oldest_first(scores, order, k)
    bits = (scores.float() + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 becomes +0.0, equal to it
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: larger bits, lower value
    key = (ordered << 32) | positions.clamp(max=2**31 - 1)  # empty slots' huge positions: their scores differ
    return torch.topk(key, k, dim=-1, largest=False, sorted=sorted).indices


def lowest(scores: torch.Tensor, positions: torch.Tensor, k: int, ties: bool,
           position_order: Callable[[], torch.Tensor] | None = None, sorted: bool = False) -> torch.Tensor:
    """Step 4: the ``k`` lowest of ``scores [rows, h, n]`` → indices ``[rows, h, k]`` (``sorted``: lowest
    first); ``ties``: equal scores oldest position first (:func:`lowest_oldest_first`)."""
    if ties:
        return lowest_oldest_first(scores, positions, k, position_order, sorted=sorted)
    return torch.topk(scores, k, dim=-1, largest=False, sorted=sorted).indices


class Selector:
    """The four steps for one policy (module docstring)."""

    def __init__(self, policy: Policy, exact_ties: bool):
        self.policy, self.exact_ties = policy, exact_ties
        self.ranks: dict = {}  # rank_empty's memo: one tensor per slot count, also under CUDA graph capture

    def free(self, keys: torch.Tensor, ctx: ScoreContext, k: int, budget: int, protected=(), per_row: bool = False,
             empty: torch.Tensor | None = None, sorted: bool = False) -> torch.Tensor:
        """The ``k`` slots to free per row and head of ``keys [rows, h, slots, d]`` in a layer that keeps
        ``budget`` → ``[rows, h, k]``. ``protected``/``per_row``: as :func:`raise_kept`; ``empty``: bool,
        broadcast to ``[rows, h, slots]``, the slots that hold no token (``None``: every slot holds one)."""
        scores = self.scores(keys, ctx, budget, protected, per_row)
        if empty is not None:
            scores = rank_empty(scores, empty, self.ranks)
        return lowest(scores, ctx.positions, k, self.exact_ties, ctx.position_order, sorted)

    def scores(self, keys: torch.Tensor, ctx: ScoreContext, budget: int, protected=(), per_row: bool = False
               ) -> torch.Tensor:
        """Steps 1 and 2: the policy's scores of ``keys [rows, h, slots, d]`` ``[rows, h, slots]``, the tokens
        always kept raised (what a head-shared pool selects across heads from)."""
        ctx.budget = budget
        scores = self.policy.score(keys, ctx)
        return raise_kept(scores, ctx.positions, ctx.seen, self.policy, budget, protected, per_row)
