"""Keep the newest tokens: a sliding window of N, with the first ``n_sink_tokens`` always kept."""
from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext


@dataclass
class Newest(Policy):
    """Scores each cached token by its position: the newest score highest."""

    name = "newest"
    rule = "keep the N most recent tokens (and the first n_sink_tokens)"
    n_sink_tokens: int = 4

    def validate(self) -> None:
        if self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: expected >= 0, got {self.n_sink_tokens}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [batch, kv_heads, tokens, head_dim]`` -> ``[batch, kv_heads, tokens]``: the positions."""
        return ctx.positions.float()
