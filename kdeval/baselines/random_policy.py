"""Random eviction (a sanity baseline), seeded and reproducible.

Each token's score is a hash of (seed, layer, KV head, eviction step, absolute position), so a run is
deterministic and does not depend on where a token sits in the cache's slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register

_M = 2147483647  # 2^31 - 1, the Park-Miller modulus: products stay inside int64


def position_hash(positions: torch.Tensor, salt: int) -> torch.Tensor:
    """``positions`` (int64, any shape) → float32 pseudo-random values in [0, 1)."""
    x = (positions * 1000003 + salt) % _M
    for _ in range(3):
        x = (x * 48271) % _M
        x = x ^ (x >> 11)
    return x.float() / _M


def step_salt(seed: int, layer: int, step: int | torch.Tensor) -> int | torch.Tensor:
    """The hash's salt for one (seed, layer, step); ``step`` may be a tensor (one count per batch row)."""
    return (seed * 7919 + layer * 104729 + step * 15485863) % _M


@register
@dataclass
class Random(Policy):
    name = "random"
    rule = "evict uniformly at random (seeded)"

    seed: int = 0

    def needs(self) -> PolicyNeeds:
        return PolicyNeeds(reads_step=True)  # it salts the hash (the layer index too, which needs no declaring)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        heads = torch.arange(keys.shape[1], device=keys.device).view(1, -1, 1)
        return position_hash(ctx.positions + heads * (1 << 40), step_salt(self.seed, ctx.layer_idx, ctx.step))
