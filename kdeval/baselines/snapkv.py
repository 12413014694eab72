"""SnapKV (Li et al. 2024): vote with the attention of an observation window, pooled, kept per KV group.

The last ``window`` queries of each chunk (one query while decoding) score every cached key; the scores are
summed over those queries, averaged over the query heads of each KV head and max-pooled along the tokens with
``kernel`` (so neighbours of important tokens survive too). The window's own tokens are always kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdeval.keydiff.attention import AttentionNeed
from kdeval.keydiff.policy import Policy, ScoreContext
from kdeval.keydiff.registry import register


def pool_scores(scores: torch.Tensor, kernel: int, pooling: str, order: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, h, n]`` → same shape, pooled with an odd ``kernel`` (stride 1, same padding) along token order.

    Neighbours are neighbours in position: with ``order [b, h, n]``, the indices that sort the tokens by
    position (the slot store keeps them out of order), the scores are sorted, pooled, and put back.
    """
    if kernel <= 1:
        return scores
    if order is not None:
        scores = scores.gather(-1, order)
    b, h, n = scores.shape
    flat = scores.reshape(b * h, 1, n)
    if pooling == "max":
        out = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        out = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2, count_include_pad=False)
    out = out.reshape(b, h, n)
    if order is not None:
        out = torch.empty_like(out).scatter_(-1, order, out)
    return out


@register
@dataclass
class SnapKV(Policy):
    name = "snapkv"
    rule = "keep the tokens the last window of queries attends to most (max-pooled), plus the window"
    ties = True

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

    def attention_need(self) -> AttentionNeed:
        return AttentionNeed("window", self.window)

    def n_recent(self, budget: int) -> int:
        return self.window

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        return pool_scores(ctx.attention.mean(dim=2), self.kernel, self.pooling, ctx.position_order())
