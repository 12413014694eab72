"""CriticalKV and CriticalAdaKV (Feng et al. 2025, arXiv 2502.03805): an inner policy's scores weighted by how much
each value contributes through the output projection, after a first stage that keeps the inner policy's best.

The rule, as kvpress' ``CriticalKVPress`` applies it, per layer and KV head over the cached tokens:

1. stage 1: the inner policy's best ``int(N * first_stage_ratio)`` tokens (at least 1 when the ratio is > 0) are
   kept whatever else happens (the inner policy's protected tokens, e.g. SnapKV's window, rank first);
2. stage 2: every token is scored ``(inner + epsilon) * ||W_o v||_1``: its value ``v`` through each query head's
   slice of ``W_o`` (``[head_dim, hidden]``), L1 norm over the hidden size, averaged over the KV head's query
   heads;
3. the top ``N`` of the stage-2 scores fill the rest.

``criticaladakv`` is kvpress' ``CriticalAdaKVPress``: AdaKV's head-adaptive budgets (kdeval/baselines/adakv.py)
allocated by the inner scores (each head's ``int(alpha_safeguard * N)`` best safeguarded, the best ``H * N`` of
the layer across its heads give each head its count ``n_h``), then the two stages within each head:
``int(n_h * first_stage_ratio)`` by the inner scores, the rest of ``n_h`` by the weighted scores.

Chunk by chunk (the paper's protocol) the rule runs over the ``N + B`` cached tokens at every eviction, with
``N`` the layer's budget, so the cache holds at most ``N + B`` tokens per KV head (a head pool: ``H * (N + B)``
per layer). Equal scores go oldest first at both stages. Protected ranges (kvpress' question under kdeval's
protocol) are held on top and do not count in either stage.

Shapes: ``keys``/``values [batch, kv_heads, tokens, head_dim]``, scores ``[batch, kv_heads, tokens]``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from kdeval.baselines.adakv import AdaKV
from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.attention.reads import LayerProjections
from kdeval.keydiff.policy.registry import register
from kdeval.keydiff.policy.selection import lowest_oldest_first, protect


def output_norms(values: torch.Tensor, projections: LayerProjections) -> torch.Tensor:
    """``values [b, kv_heads, n, d]`` → ``||v W_o^h||_1`` averaged over each KV head's query heads ``[b, kv_heads,
    n]`` (float32, or float64 for float64 values). One query head at a time: ``[b, n, hidden]`` at most."""
    weight = projections.o_proj.weight  # [hidden, q_heads * d]
    d = projections.head_dim
    q_heads, kv_heads = weight.shape[1] // d, values.shape[1]
    group = q_heads // kv_heads
    dtype = torch.promote_types(values.dtype, torch.float32)
    w_o = weight.t().to(dtype).reshape(q_heads, d, weight.shape[0])  # [q_heads, d, hidden]
    v = values.to(dtype)
    norms = torch.stack([torch.norm(v[:, h // group] @ w_o[h], p=1, dim=-1) for h in range(q_heads)], dim=1)
    b, _, n = norms.shape
    return norms.view(b, kv_heads, group, n).mean(dim=2)


def ranks_best_first(scores: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
    """Each token's rank in its head by ``scores [b, h, n]``, best first, equal scores oldest first ``[b, h, n]``."""
    n = scores.shape[-1]
    order = lowest_oldest_first(-scores, ctx.positions, n, ctx.position_order, sorted=True)
    rank = torch.arange(n, device=scores.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, rank)


def check_stages(epsilon: Any, first_stage_ratio: Any) -> None:
    for name, value in (("epsilon", epsilon), ("first_stage_ratio", first_stage_ratio)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: expected a number, got {value!r}")
    if epsilon < 0:
        raise ValueError(f"epsilon: must be >= 0, got {epsilon}")
    if not 0 <= first_stage_ratio <= 1:
        raise ValueError(f"first_stage_ratio: must be in [0, 1], got {first_stage_ratio}")


class TwoStages:
    """What both policies share: the inner scores ranked with its protected tokens first and empty slots last,
    and the stage-2 weighting."""

    _inner: Policy
    epsilon: float
    first_stage_ratio: float

    def ranked(self, inner: torch.Tensor, ctx: ScoreContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``inner [b, h, n]`` → (the same with the inner policy's protected tokens at +inf and the slots that
        hold no token at -inf, ``valid [b, h, n]``: the slots that hold a token)."""
        valid = ctx.positions < ctx.seen
        raised = protect(inner, ctx.positions, ctx.seen, self._inner.n_sink(), self._inner.n_recent(ctx.budget))
        return raised.masked_fill(~valid, float("-inf")), valid

    def first_count(self, kept: int | torch.Tensor) -> int | torch.Tensor:
        """Stage 1's share of ``kept`` tokens: ``int(kept * first_stage_ratio)``, at least 1 when the ratio is > 0
        (kvpress' floor)."""
        if isinstance(kept, torch.Tensor):
            first = (kept * self.first_stage_ratio).long()
            return first.clamp(min=1) if self.first_stage_ratio > 0 else first
        first = int(kept * self.first_stage_ratio)
        return max(1, first) if self.first_stage_ratio > 0 else first

    def weighted(self, inner: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """Stage 2's scores ``(inner + epsilon) * ||W_o v||_1``, ``[b, h, n]``."""
        return (inner + self.epsilon) * output_norms(ctx.values, ctx.projections)


def per_head_scorer_reason(policy: Policy) -> str | None:
    """Why CriticalKV cannot weight ``policy``'s scores, or ``None``."""
    if not policy.evicts:
        return f"expected a policy that scores tokens, got {policy.name!r}"
    if policy.needs().shares_heads:
        return f"{policy.name!r} shares a layer's slots among its KV heads (use criticaladakv)"
    return None


@register
@dataclass
class CriticalKV(TwoStages, PassesOn, Policy):
    name = "criticalkv"
    rule = ("keep an inner policy's best first_stage_ratio x N tokens, then the best by inner score x the value's "
            "L1 norm through W_o (CriticalKV)")

    #: the policy whose scores are weighted: a registered name (at its defaults) or a policy object
    inner: Any = "snapkv"
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5

    def validate(self) -> None:
        check_stages(self.epsilon, self.first_stage_ratio)
        inner = built_inner(self.inner, per_head_scorer_reason)
        self._inner: Policy = inner

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs, the cached values and ``W_o``; the weighting differs per head."""
        return replace(self._inner.needs(), values=True, projections=True, heads_alike=False)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]`` → ``[b, h, n]``: +inf for stage 1's tokens, the weighted inner scores else."""
        inner = self._inner.score(keys, ctx)
        inner = inner if inner.dtype == torch.float64 else inner.float()
        ranked, valid = self.ranked(inner, ctx)
        first = ranks_best_first(ranked, ctx) < self.first_count(ctx.budget)
        out = torch.where(first & valid, float("inf"), self.weighted(inner, ctx))
        return out.masked_fill(~valid, float("-inf"))


@register
@dataclass
class CriticalAdaKV(TwoStages, AdaKV):
    name = "criticaladakv"
    rule = ("AdaKV's head budgets by an inner policy's scores, then CriticalKV's two stages within each head "
            "(CriticalAdaKV)")

    inner: Any = "snapkv"
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5

    def validate(self) -> None:
        check_stages(self.epsilon, self.first_stage_ratio)
        super().validate()

    def needs(self) -> PolicyNeeds:
        return replace(super().needs(), values=True, projections=True)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, H, L, d]`` (a layer's tokens regrouped per head, kdeval/keydiff/cache/headpool.py) → ``[b, H, L]``:
        +inf for each head's ``n_h`` chosen tokens, the weighted inner scores else."""
        inner = self._inner.score(keys, ctx)
        inner = inner if inner.dtype == torch.float64 else inner.float()
        ranked, valid = self.ranked(inner, ctx)
        safe = self.head_safeguard(ctx.budget)
        from kdeval.keydiff.cache.headpool import select_across_heads  # not at the top: it loads transformers

        # each head's count: AdaKV's selection of the layer's H x N best by the inner scores
        counts = select_across_heads(ranked, ctx.positions, valid, safe, keys.shape[1] * ctx.budget).sum(-1)
        counts = counts.unsqueeze(-1)  # [b, H, 1]
        # stage 1 keeps the safeguarded tokens and the head's best first_count(n_h): the best max(...) by rank
        first = ranks_best_first(ranked, ctx) < self.first_count(counts).clamp(min=safe)
        weighted = torch.where(first, float("inf"), self.weighted(inner, ctx)).masked_fill(~valid, float("-inf"))
        chosen = ranks_best_first(weighted, ctx) < counts
        return torch.where(chosen & valid, float("inf"), weighted)
