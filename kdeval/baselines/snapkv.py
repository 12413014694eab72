"""SnapKV (Li et al. 2024): vote with the attention of an observation window, pooled, kept per KV group.

The published rule (the reference ``SnapKVCluster.update_kv`` and kvpress' ``SnapKVPress``), applied after every
chunk and decode step: the last ``window`` queries of the chunk (one query while decoding) score every cached
key; their probabilities are summed over those queries. The window's own columns (the last ``window``
positions, which are always kept) are dropped, and each query head's votes on the older tokens are pooled
along positions with ``kernel`` (stride 1, ``kernel // 2`` zeros of padding on each side, counted by the
average), then averaged over the query heads of each KV head (kvpress' answer to GQA, FasterDecoding/SnapKV
issue 22). The defaults (window 32, kernel 7, max pooling) are the reference's LongBench configuration.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdeval.keydiff.attention.capture import AttentionNeed
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


def pool_scores(scores: torch.Tensor, kernel: int, pooling: str, order: torch.Tensor | None = None,
                pooled: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., n]`` → same shape, pooled with an odd ``kernel`` (stride 1, ``kernel // 2`` padding) along
    token order, as ``F.max_pool1d`` / ``F.avg_pool1d`` with their default padding (zeros, counted by the
    average).

    ``order [..., n]``: the indices that sort the tokens by position (the slot store keeps them out of order);
    the scores are sorted, pooled and put back, so neighbours are neighbours in position. ``pooled [..., n]``
    (bool): the tokens that take part; the others count as zeros, which is the reference's zero padding when
    they come after every pooled token in position order. Scores must be >= 0 for ``max`` (attention votes).
    """
    if pooled is not None:
        scores = scores.masked_fill(~pooled, 0.0)
    if kernel <= 1:
        return scores
    if order is not None:
        scores = scores.gather(-1, order)
    lead, n = scores.shape[:-1], scores.shape[-1]
    flat = scores.reshape(-1, 1, n)
    if pooling == "max":
        out = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        out = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    out = out.reshape(*lead, n)
    if order is not None:
        out = torch.empty_like(out).scatter_(-1, order, out)
    return out


@register
@dataclass
class SnapKV(Policy):
    name = "snapkv"
    rule = "keep the tokens the last window of queries attends to most (pooled per query head), plus the window"

    window: int = 32
    kernel: int = 7
    pooling: str = "max"

    def validate(self) -> None:
        if self.window <= 0:
            raise ValueError(f"window: must be > 0, got {self.window}")
        if self.kernel <= 0 or self.kernel % 2 == 0:
            raise ValueError(f"kernel: must be a positive odd number, got {self.kernel}")
        if self.pooling not in ("max", "avg"):
            raise ValueError(f"pooling: expected 'max' or 'avg', got {self.pooling!r}")

    def needs(self) -> PolicyNeeds:
        """The last ``window`` queries' rows; max-pooled votes tie exactly."""
        return PolicyNeeds(attention=AttentionNeed("window", self.window), exact_ties=True)

    def n_recent(self, budget: int) -> int:
        return self.window

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``ctx.attention [b, kv_heads, group, n]`` → ``[b, kv_heads, n]``. The window's tokens (and the static
        layout's empty slots, whose positions sort last) are left out of the pooling; the engine keeps the
        window (``n_recent``) whatever their scores."""
        votes = ctx.attention
        older = (ctx.positions < ctx.seen - self.window).unsqueeze(2).expand_as(votes)  # [b, kv, group, n]
        order = ctx.position_order().unsqueeze(2).expand_as(votes)
        return pool_scores(votes, self.kernel, self.pooling, order, older).mean(dim=2)
