"""H2O (Zhang et al. 2023): heavy hitters by accumulated attention, plus a window of recent tokens.

Every cached token accumulates the attention it receives from every query (all of each chunk's queries and
every decode step), summed over the query heads of its KV head. ``recent_fraction`` of the budget always holds
the newest tokens (the paper's default: half heavy hitters, half recent).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.attention.capture import AttentionNeed
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class H2O(Policy):
    name = "h2o"
    rule = "keep the tokens with the most accumulated attention, plus a recent window"

    recent_fraction: float = 0.5

    def validate(self) -> None:
        if not 0.0 <= self.recent_fraction < 1.0:
            raise ValueError(f"recent_fraction: must be in [0, 1), got {self.recent_fraction}")

    def needs(self) -> PolicyNeeds:
        return PolicyNeeds(attention=AttentionNeed("all"), token_state=("acc",))

    def n_recent(self, budget: int) -> int:
        return int(self.recent_fraction * budget)

    def observe(self, ctx: ScoreContext) -> None:
        """Add this forward's attention ``[b, kv_heads, group, n]`` (summed over queries) to ``acc``."""
        ctx.state["acc"] += ctx.attention.sum(dim=2)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        return ctx.state["acc"]
