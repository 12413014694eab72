"""The full cache as a policy (``full``): the same chunked engine with nothing evicted, the reference every
policy is compared with."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class Full(Policy):
    name = "full"
    rule = "no eviction: the whole cache (same chunking, the fair baseline)"
    evicts = False

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        raise RuntimeError("the full cache never evicts; the engine does not call score()")
