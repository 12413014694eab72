"""ChunkKV (Liu et al. 2025, arXiv 2502.00299): keep whole groups of adjacent tokens, ranked by an inner policy.

Tokens are grouped by absolute position: group ``g`` holds positions ``[g * group_size, (g + 1) * group_size)``
(a fixed grid, so a group keeps its identity from chunk to chunk). A group's score is the mean of the ``inner``
policy's scores over its cached tokens, and every token takes its group's score: the engine's top ``N`` then
keeps whole groups, best first. The group at the budget's edge is cut (the engine evicts equal scores oldest
first, so it keeps its newest tokens); the inner policy's protected tokens (sink, recent window) are kept
whatever their group's score.

``heads="all"`` is kvpress's ``ChunkKVPress``: the inner scores are summed over the KV heads before grouping,
so every KV head of a layer keeps the same groups (and then holds the same positions, as TOVA's ``all``).
``heads="each"`` chooses groups per KV head.

Differences from kvpress: kvpress keeps ``int(n_groups * (1 - ratio))`` whole groups, so its kept count is a
multiple of the group size; here exactly ``N`` tokens are kept. The paper's layer-wise index reuse (one layer's
selection reused by the next) is not implemented.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


def group_means(scores: torch.Tensor, positions: torch.Tensor, order: torch.Tensor, group_size: int,
                average: bool = True) -> torch.Tensor:
    """``scores [rows, h, n]`` → each token's group mean ``[rows, h, n]`` (``average=False``: the group's sum),
    groups ``positions // group_size``.

    ``order [rows, h, n]`` sorts the tokens by position, so a group is a contiguous run; its sum is a difference
    of two float64 prefix sums taken in position order: the same on every device and whatever slot a token sits
    in (a scatter-add's order is not fixed on CUDA), and one value for all of a group's tokens.
    """
    s = scores.gather(-1, order)
    group = torch.div(positions.gather(-1, order), group_size, rounding_mode="floor")
    n = s.shape[-1]
    idx = torch.arange(n, device=s.device).expand_as(group)
    first_of_run = torch.ones_like(group, dtype=torch.bool)
    first_of_run[..., 1:] = group[..., 1:] != group[..., :-1]
    last_of_run = torch.ones_like(first_of_run)
    last_of_run[..., :-1] = first_of_run[..., 1:]
    first = torch.where(first_of_run, idx, 0).cummax(-1).values  # [rows, h, n]: where each token's run starts
    last = torch.where(last_of_run, idx, n - 1).flip(-1).cummin(-1).values.flip(-1)  # ... and where it ends
    prefix = F.pad(s.double().cumsum(-1), (1, 0))
    total = prefix.gather(-1, last + 1) - prefix.gather(-1, first)
    mean = (total / (last - first + 1) if average else total).to(s.dtype)
    return torch.empty_like(mean).scatter_(-1, order, mean)


def group_scorer_reason(policy: Policy) -> str | None:
    """Why ChunkKV cannot rank its groups by ``policy``'s scores, or ``None``. ChunkKV ranks the groups of every KV
    head alike; a policy that shares slots among heads (AdaKV) chooses per layer, across heads, and is not an
    inner scorer."""
    if policy.name == ChunkKV.name:
        return f"cannot be {ChunkKV.name!r} itself"
    if not policy.evicts:
        return f"expected a policy that scores tokens, got {policy.name!r}"
    if policy.needs().shares_heads:
        return f"{policy.name!r} shares a layer's slots among its KV heads; expected a per-head scorer"
    return None


@register
@dataclass
class ChunkKV(PassesOn, Policy):
    name = "chunkkv"
    rule = "keep whole groups of group_size adjacent tokens, ranked by the mean of an inner policy's scores"

    #: the policy whose scores rank the groups: a registered name (at its defaults) or a policy object
    inner: Any = "keydiff"
    group_size: int = 10
    heads: str = "all"

    def validate(self) -> None:
        if not isinstance(self.group_size, int) or self.group_size <= 0:
            raise ValueError(f"group_size: must be an integer > 0, got {self.group_size!r}")
        if self.heads not in ("all", "each"):
            raise ValueError(f"heads: expected 'all' or 'each', got {self.heads!r}")
        inner = built_inner(self.inner, group_scorer_reason)
        self._inner: Policy = inner

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs; a group's tokens share one score, so the edge group is cut by position;
        ``heads="all"`` gives every KV head the same groups."""
        return replace(self._inner.needs(), exact_ties=True, heads_alike=self.heads == "all")

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → the inner scores averaged over each group ``[b, h, n]`` (float32, or float64
        for float64 inner scores)."""
        inner = self._inner.score(keys, ctx)
        inner = inner if inner.dtype == torch.float64 else inner.float()
        order = ctx.position_order()
        if self.heads == "all":
            # Every head holds the same positions (the selection is shared): sum the heads in position order.
            summed = inner.gather(-1, order).sum(dim=1, keepdim=True).expand_as(inner)
            inner = torch.empty_like(inner).scatter_(-1, order, summed)
        return group_means(inner, ctx.positions, order, self.group_size)
