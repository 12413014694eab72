"""StreamingLLM (Xiao et al. 2023): keep the first ``n_sink`` tokens (attention sinks) and the most recent ones.

Cached keys keep the positions they were rotated with (kvpress' StreamingLLMPress); ``sink-rerotate``
(kdeval/baselines/sink_rerotate.py) is the paper's variant that re-assigns positions inside the cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext
from kdeval.keydiff.policy.registry import register


@register
@dataclass
class Sink(Policy):
    name = "sink"
    rule = "StreamingLLM: keep the first n_sink tokens and the most recent ones"

    n_sink_tokens: int = 4

    def validate(self) -> None:
        if self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: must be >= 0, got {self.n_sink_tokens}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """Newer = higher: ``positions [b, h, n]`` as float scores."""
        return ctx.positions.float()
