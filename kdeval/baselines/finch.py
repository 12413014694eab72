"""Finch (Corallo & Papotti 2024, TACL): SnapKV-like votes of the prompt's last queries, each query's row weighted
by how many keys it sees, without pooling, and the kept keys re-rotated to contiguous positions.

The rule of kvpress' ``FinchPress``, per layer and KV head: the last ``window`` queries (kvpress: the question,
the tokens after a delimiter) attend causally to the cached keys (``q . k / sqrt(d)``, softmax in float32); with
``normalize`` each query's probabilities are multiplied by the number of keys before it (kvpress' "non-zero
count", ``arange(L - window, L)``), so late queries, whose attention is spread over more keys, are not outvoted;
a token's score is the mean of those rows over the window's queries and its KV head's query heads. The window is
always kept (kvpress pads its scores with the maximum + 1), inside the budget N. With ``rerotate`` the kept keys are
re-rotated to RoPE positions ``0 .. n-1`` after every eviction (kdeval/keydiff/attention/rerotation.py), as kvpress'
``rerotate_keys`` does.

The window is a fixed number of tokens here: kdeval's engine is not told where the question starts, so kvpress'
dynamic window (the question's length) is matched by setting ``window`` to it. Query-aware (``compress: prompt``)
the window's end is the question's end; query-agnostic (``compress: context``) it is the context's last
``window`` tokens, and Finch is SnapKV without pooling, re-rotated.

Chunk by chunk, at every eviction the last ``window`` queries (kept per layer across chunks, before RoPE) score
the cached ``N + B`` tokens; each query is rotated at its RoPE position, its rank among the cached tokens (its
absolute position without ``rerotate``), and its row is weighted by that rank, the keys it sees in the cache. In
one shot both equal its position: kvpress' rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.attention.queries import QueryNeed
from kdeval.keydiff.policy.registry import register


def window_votes(q: torch.Tensor, q_rank: torch.Tensor, keys: torch.Tensor, k_rank: torch.Tensor,
                 normalize: bool) -> torch.Tensor:
    """Causal attention of the window's queries, summed per key.

    ``q [b, hq, w, d]``: rotated queries at ranks ``q_rank [b, w]`` (``-1``: no query); ``keys [b, hk, n, d]`` at
    ranks ``k_rank [b, hk, n]`` (``-1``: an empty slot, never attended); a query sees the keys of rank ``<=`` its
    own. ``normalize``: each row times its query's rank → ``[b, hk, n]``, averaged over the ``w`` rows and the
    query heads of each KV head (float32 or wider)."""
    b, hq, w, d = q.shape
    hk, n = keys.shape[1], keys.shape[2]
    group = hq // hk
    dtype = torch.promote_types(q.dtype, torch.float32)
    weight = q_rank.clamp(min=0).to(dtype) if normalize else torch.ones(b, w, dtype=dtype, device=q.device)
    weight = weight * (q_rank >= 0)  # [b, w]
    out = torch.zeros(b, hq, n, dtype=dtype, device=q.device)
    for h in range(hq):
        kv = h // group
        logits = (q[:, h].to(dtype) @ keys[:, kv].to(dtype).transpose(-1, -2)) / d ** 0.5  # [b, w, n]
        seen = (k_rank[:, kv].unsqueeze(1) <= q_rank.unsqueeze(-1)) & (k_rank[:, kv] >= 0).unsqueeze(1)
        probs = logits.masked_fill(~seen, float("-inf")).softmax(-1).nan_to_num(0.0)
        out[:, h] = (probs * weight.unsqueeze(-1)).sum(1) / w
    return out.view(b, hk, group, n).mean(2)


@register
@dataclass
class Finch(Policy):
    name = "finch"
    rule = ("keep the tokens the last window of queries attends to most, each query's row weighted by the keys it "
            "sees (no pooling), plus the window; kept keys re-rotated (Finch)")

    window: int = 32
    normalize: bool = True
    rerotate: bool = True

    def validate(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            raise ValueError(f"window: must be an integer > 0, got {self.window!r}")
        for name in ("normalize", "rerotate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")

    def needs(self) -> PolicyNeeds:
        """The last ``window`` queries before RoPE and RoPE itself (to rotate them); re-rotation of the kept keys."""
        return PolicyNeeds(queries=QueryNeed(self.window, 1), projections=True, rerotates=self.rerotate)

    def n_recent(self, budget: int) -> int:
        return self.window

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, hk, n, d]`` → ``[b, hk, n]``; the window's own tokens are kept by the engine whatever their
        scores, empty slots score 0."""
        seen = ctx.seen if isinstance(ctx.seen, torch.Tensor) else torch.tensor(ctx.seen, device=keys.device)
        seen = seen.reshape(-1, 1)  # [b or 1, 1]
        real = ctx.positions < seen.unsqueeze(-1)  # [b, hk, n]
        q, q_pos = ctx.queries.last(seen)  # [b, hq, w, d], [b, w]
        if self.rerotate:  # RoPE positions are ranks among each head's cached tokens; a query's is the same in
            # every head (the window and all after it are kept), read from head 0
            held = ctx.positions.masked_fill(~real, torch.iinfo(ctx.positions.dtype).max)
            ordered = held.sort(dim=-1).values  # [b, hk, n]
            q_at = torch.searchsorted(ordered[:, 0].contiguous(), q_pos.clamp(min=0).contiguous())
            k_rank = torch.searchsorted(ordered, ctx.positions.contiguous())
        else:
            q_at, k_rank = q_pos.clamp(min=0), ctx.positions
        q_rank = torch.where(q_pos >= 0, q_at, -1)
        k_rank = torch.where(real, k_rank, -1)
        q = ctx.projections.rotated(q, q_rank)
        return window_votes(q, q_rank, keys, k_rank, self.normalize) * real
