"""Merging (kvpress' ``MergingPress``, after Token Merging and D2O): an inner policy chooses the tokens to evict, and
each evicted token's value is folded into the value of its most similar kept token instead of being dropped.

The rule, per layer and KV head, at an eviction that frees ``k`` of the ``n`` cached tokens:

1. similarity: the cosine of the keys (float32 or wider, norms clamped at ``1e-6``); each freed token's target is
   the kept token whose key is most similar, ``s`` that similarity (the keys are never changed: RoPE stays right);
2. gates: a freed token merges when ``s >= similarity_threshold``; with ``merge_fraction < 1`` also when ``s`` is
   at least the ``1 - merge_fraction`` quantile (linear interpolation, as ``torch.quantile``) of the head's freed
   tokens' ``s``, those that failed the first gate counted at ``-inf``;
3. weight: ``w = max(s, 0) * |v| / (|v| + |v_target| + 1e-6)``, the value norms before merging;
4. merge: a kept token that receives anything takes ``(v_target + sum w v) / (1 + sum w)`` (float32 accumulation,
   then the cache's dtype); the other kept values are unchanged, the freed ones leave with their tokens.

Chunk by chunk (the paper's protocol) the rule runs at every eviction over the ``N + B`` cached tokens: the merged
values are what later steps read and score, and a kept token that was merged into carries its merged value into
later merges. The cache holds exactly the inner policy's kept tokens, ``N + B`` at most during a step: the KV bytes
are the inner policy's. Through ``PolicyNeeds.merges`` the engine calls :meth:`Merging.merge` between selection
and commit (kdeval/keydiff/step/eviction.py), on the slot caches, the static layout of the graph path and ragged batches;
under ``kv_quant`` a merged value the store held quantized is quantized again (kdeval/keydiff/quant/store.py), one not
yet quantized is when it leaves the window. A head-shared pool (``ada*``) is refused.

Differences from kvpress: none in the rule. kvpress breaks an exact tie of two kept keys' similarities by the kept
tokens' score order, kdeval by slot; and each freed token's quantile is taken over its own row's freed tokens, so
a ragged batch's padding never counts. On CUDA the scatter-add's order is not fixed (as in kvpress).

Shapes: ``keys``/``values [batch, kv_heads, tokens, head_dim]``, freed slots ``[batch, kv_heads, k]``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.policy.interface import Freed, Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register

if TYPE_CHECKING:
    from kdeval.keydiff.step.eviction import LayerEviction

#: kvpress' epsilon for the key norms and the value-norm ratio
EPS = 1e-6


def wrap_reason(policy: Policy) -> str | None:
    """Why merging cannot wrap ``policy``, or ``None`` when it can."""
    if not policy.evicts:
        return "does not score tokens"
    needs = policy.needs()
    if needs.merges:
        return "already merges"
    if needs.shares_heads:
        return "shares a layer's slots among its KV heads (a head pool does not merge)"
    return None


def named_reason(policy: Policy) -> str | None:
    """:func:`wrap_reason` naming the policy, as the ``inner`` error says it."""
    why = wrap_reason(policy)
    return None if why is None else f"policy {policy.name!r} {why}"


def row_quantile(x: torch.Tensor, counted: torch.Tensor, q: float) -> torch.Tensor:
    """``torch.quantile(x[r], q)`` of each row ``r`` of ``x [..., k]`` over its ``counted [..., k]`` entries only
    (linear interpolation, the same arithmetic) → ``[..., 1]``; a row with none counted gives a meaningless value."""
    ordered = x.masked_fill(~counted, float("inf")).sort(dim=-1).values  # uncounted entries last
    last = (counted.sum(-1, keepdim=True) - 1).clamp(min=0).to(x.dtype)
    ranks = last * q  # q rounded to x's dtype first, as torch.quantile's
    below = ranks.long()
    weights = ranks - below
    return ordered.gather(-1, below).lerp(ordered.gather(-1, ranks.ceil().long()), weights)


def merge_values(keys: torch.Tensor, freed: Freed, ctx: ScoreContext, threshold: float, fraction: float
                 ) -> torch.Tensor:
    """The module docstring's rule: ``freed.values`` rewritten in place at the kept slots that receive a freed
    token, which are returned (``[b, h, n]`` bool). ``keys [b, h, n, d]``; ``freed.slots [b, h, k]``; no host
    synchronisation (the graph path captures it)."""
    values = freed.values
    d, dv = keys.shape[-1], values.shape[-1]
    real = freed.real(ctx)
    targets = freed.kept & real  # [b, h, n]
    gone = freed.dropped(ctx)  # [b, h, k]
    # the freed tokens in position order (kvpress sums them so), those that hold none last
    at = ctx.positions.gather(-1, freed.slots).masked_fill(~gone, torch.iinfo(torch.long).max)
    order = at.argsort(dim=-1, stable=True)
    slots, gone = freed.slots.gather(-1, order), gone.gather(-1, order)
    dtype = torch.promote_types(keys.dtype, torch.float32)
    unit = keys.to(dtype)
    unit = unit / unit.norm(dim=-1, keepdim=True).clamp(min=EPS)
    sim = unit.gather(2, slots.unsqueeze(-1).expand(-1, -1, -1, d)) @ unit.transpose(-1, -2)  # [b, h, k, n]
    best, target = sim.masked_fill(~targets.unsqueeze(-2), float("-inf")).max(dim=-1)  # [b, h, k]
    ok = gone & (best >= threshold)
    if fraction < 1.0:
        cut = row_quantile(best.masked_fill(~ok, float("-inf")), gone, 1.0 - fraction)
        ok = ok & (best >= cut)
    v = values.to(torch.promote_types(values.dtype, torch.float32))
    norms = v.norm(dim=-1)  # [b, h, n]
    src_norm, dst_norm = norms.gather(-1, slots), norms.gather(-1, target)
    weights = best.clamp(min=0) * ok.to(best.dtype)
    weights = (weights * src_norm / (src_norm + dst_norm + EPS)).to(v.dtype)
    src = v.gather(2, slots.unsqueeze(-1).expand(-1, -1, -1, dv))  # [b, h, k, dv]
    acc = torch.zeros_like(v).scatter_add_(2, target.unsqueeze(-1).expand(-1, -1, -1, dv),
                                           weights.unsqueeze(-1) * src)
    total = torch.zeros_like(norms).scatter_add_(2, target, weights)  # [b, h, n]
    merged = ((v + acc) / (1.0 + total).unsqueeze(-1)).to(values.dtype)
    into = total > 0
    values.copy_(torch.where(into.unsqueeze(-1), merged, values))
    return into


def check_gates(threshold: Any, fraction: Any) -> None:
    for name, value in (("similarity_threshold", threshold), ("merge_fraction", fraction)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: expected a number, got {value!r}")
    if not 0 <= threshold <= 1:
        raise ValueError(f"similarity_threshold: must be in [0, 1], got {threshold}")
    if not 0 < fraction <= 1:
        raise ValueError(f"merge_fraction: must be in (0, 1], got {fraction}")


@register
@dataclass
class Merging(PassesOn, Policy):
    name = "merging"
    rule = ("an inner policy's evicted tokens folded into their most key-similar kept token's value, weighted by "
            "similarity and relative value norm; keys untouched (kvpress' MergingPress)")

    #: the policy that chooses what is evicted: a registered name (at its defaults) or a policy object
    inner: Any = "knorm"
    similarity_threshold: float = 0.0
    merge_fraction: float = 1.0

    def validate(self) -> None:
        check_gates(self.similarity_threshold, self.merge_fraction)
        self._inner: Policy = built_inner(self.inner, named_reason)

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs, and the merge step at every eviction."""
        return replace(self._inner.needs(), merges=True)

    def apply(self, eviction: LayerEviction) -> None:
        """Merge the freed tokens into the kept values, then the inner policy commits."""
        eviction.rewrote_values(merge_values(eviction.keys, eviction.freed(), eviction.ctx, self.similarity_threshold,
                                             self.merge_fraction))
        self._inner.apply(eviction)
