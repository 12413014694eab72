"""Key norm (Devoto et al. 2024): keep the keys with the lowest L2 norm."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy import Policy, ScoreContext
from kdeval.keydiff.registry import register


@register
@dataclass
class KNorm(Policy):
    name = "knorm"
    rule = "keep the keys with the lowest L2 norm"
    ties = True  # a repeated token's layer-0 keys have equal norms (RoPE rotates): break ties oldest first

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → ``-|k| [b, h, n]``."""
        return -keys.float().norm(dim=-1)
