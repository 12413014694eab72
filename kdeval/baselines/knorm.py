"""Key norm (Devoto et al. 2024): keep the keys with the lowest L2 norm."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class KNorm(Policy):
    name = "knorm"
    rule = "keep the keys with the lowest L2 norm"

    def needs(self) -> PolicyNeeds:
        """A repeated token's layer-0 keys have equal norms (RoPE rotates): equal scores are evicted oldest first."""
        return PolicyNeeds(exact_ties=True)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → ``-|k| [b, h, n]``."""
        return -keys.float().norm(dim=-1)
