"""TOVA (Oren et al. 2024): evict the tokens the last query attends to least.

With chunks, the chunk's last query scores every cached key. ``heads="all"`` averages its attention over all
query heads of the layer (the TOVA paper's choice, so every KV head keeps the same tokens); ``heads="group"``
averages over the query heads that share each KV head.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.attention.capture import AttentionNeed
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class TOVA(Policy):
    name = "tova"
    rule = "keep the tokens the last query attends to most (averaged over heads)"

    heads: str = "all"

    def validate(self) -> None:
        if self.heads not in ("all", "group"):
            raise ValueError(f"heads: expected 'all' or 'group', got {self.heads!r}")

    def needs(self) -> PolicyNeeds:
        return PolicyNeeds(attention=AttentionNeed("last"), heads_alike=self.heads == "all")

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``ctx.attention [b, kv_heads, group, n]`` (one query) → ``[b, kv_heads, n]``."""
        per_group = ctx.attention.mean(dim=2)
        if self.heads == "all":
            return per_group.mean(dim=1, keepdim=True).expand_as(per_group)
        return per_group
