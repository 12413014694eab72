"""CaM, cache merging (Zhang et al., ICML 2024; kvpress' ``CAMPress``): an inner policy's scores, averaged over a
layer's KV heads, choose the evicted tokens, and each evicted token's value is added, with a probability, into the
values of the kept tokens that follow it.

The rule, per layer, at an eviction that frees ``k`` of the ``n`` cached tokens:

1. selection: the inner policy's scores averaged over the layer's KV heads, so every head keeps the same tokens
   (the kept set is the inner policy's rule applied to the head-mean score);
2. attention: every cached token carries ``A``, the attention it has received, summed over every query since it was
   cached (each chunk's queries and every decode step) and averaged over the query heads of its KV head;
3. windows: a freed token's window is the ``merge_budget`` kept tokens that follow it in position order (fewer
   near the end, none after the newest kept token);
4. probability: ``p = clamp(A_freed / mean(A over the window), 0, 1)`` (``0/0`` counts 0, ``x/0`` counts 1);
5. draw: the freed token merges when a uniform draw is below ``p``; each draw is a hash of (``seed``, layer, KV head,
   the token's position, the tokens seen so far), so a run is reproducible and a token's draw does not depend on
   the slot that holds it, the batch it runs in or the cells it shares steps with;
6. merge: a merging token's value divided by its window's size is added to the value of every token of its window
   (float32 accumulation, then the cache's dtype); keys are untouched.

Chunk by chunk (the paper's protocol) the rule runs at every eviction over the ``N + B`` cached tokens, so merged
values are what later steps read and merge on. kvpress' CAMPress never evicts during the prefill: it keeps the whole
prompt and compresses to ``target_size`` every ``compression_interval`` decode steps, summing ``A`` over decode
queries only, and merges at most as many freed tokens as steps ran since its last compression (the best scored
first). kdeval holds its budget from the first chunk, so a step never frees more tokens than arrived since the
layer's last eviction and every freed token is a candidate, and ``A`` counts the prompt's queries too.
kvpress draws the merges with ``torch.bernoulli`` (the global generator); kdeval with the hash above.

The cache holds exactly the inner policy's kept tokens (of the head-mean score), ``N + B`` at most during a step:
the KV bytes are those of a policy keeping that many. Under ``kv_quant`` a merged value the store held quantized is
quantized again. Refused inners: one that scores no tokens, one that already merges, a head pool (``ada*``), and
one that reads the attention of fewer than every query (SnapKV, TOVA, ...: CaM captures every query's attention,
which would change what such a policy reads).

Shapes: ``keys``/``values [batch, kv_heads, tokens, head_dim]``, freed slots ``[batch, kv_heads, k]``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from kdeval.baselines.random_policy import position_hash, step_salt
from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.attention.capture import AttentionNeed
from kdeval.keydiff.policy.interface import Freed, Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register

if TYPE_CHECKING:
    from kdeval.keydiff.step.eviction import LayerEviction

#: the per-token state: attention received since the token was cached, averaged over the KV head's query heads
ATTENTION = "cam_attention"
_LAST = torch.iinfo(torch.long).max


def wrap_reason(policy: Policy) -> str | None:
    """Why CaM cannot wrap ``policy`` (named), or ``None`` when it can."""
    needs = policy.needs() if policy.evicts else None
    if needs is None:
        why = "does not score tokens"
    elif needs.merges:
        why = "already merges"
    elif needs.shares_heads:
        why = "shares a layer's slots among its KV heads (a head pool does not merge)"
    elif needs.attention is not None and needs.attention.kind != "all":
        why = f"reads the attention of {needs.attention.rows_label()} (CaM captures every query's)"
    else:
        return None
    return f"policy {policy.name!r} {why}"


def head_mean(scores: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
    """``scores [b, h, n]`` averaged over the KV heads token by token (matched by position, so a slot layout whose
    heads hold the same tokens in other slots is averaged right), back at each head's slots ``[b, h, n]``."""
    order = ctx.position_order()
    mean = scores.gather(-1, order).mean(dim=1, keepdim=True).expand_as(scores)
    return torch.empty_like(scores).scatter_(-1, order, mean)


def hashed_draws(seed: int, layer: int, positions: torch.Tensor, seen: int | torch.Tensor) -> torch.Tensor:
    """Uniform draws in [0, 1) for the tokens at ``positions [b, h, k]`` at the step that has seen ``seen`` tokens
    (an int, a 0-d tensor or ``[b, 1, 1]``), salted by ``seed``, the layer and the KV head."""
    heads = torch.arange(positions.shape[1], device=positions.device).view(1, -1, 1)
    return position_hash(positions + heads * (1 << 40), step_salt(seed, layer, seen))


def merge_into_windows(freed: Freed, ctx: ScoreContext, attention: torch.Tensor, merge_budget: int,
                       draws: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Steps 3-6 of the module docstring: ``freed.values`` rewritten in place at the kept slots that receive a
    merge, which are returned (``[b, h, n]`` bool). ``attention [b, h, n]``: ``A`` per slot; ``draws(positions)``:
    uniform draws ``[b, h, k]`` for the freed tokens at ``positions [b, h, k]`` (in position order, the empty
    entries at a sentinel position). No host synchronisation (the graph path captures it)."""
    values = freed.values
    b, h, n, dv = values.shape
    real = freed.real(ctx)
    kept = freed.kept & real
    gone = freed.dropped(ctx)
    kept_at, kept_slots = ctx.positions.masked_fill(~kept, _LAST).sort(dim=-1)  # [b, h, n] kept first
    n_kept = kept.sum(dim=-1, keepdim=True)  # [b, h, 1]
    # the freed tokens in position order, the entries that free none last (kvpress sums the merges so)
    at, order = ctx.positions.gather(-1, freed.slots).masked_fill(~gone, _LAST).sort(dim=-1, stable=True)
    slots, gone = freed.slots.gather(-1, order), gone.gather(-1, order)
    k = slots.shape[-1]
    start = torch.searchsorted(kept_at, at, right=True)  # [b, h, k]: the first kept token after each freed one
    window = start.unsqueeze(-1) + torch.arange(merge_budget, device=values.device)  # [b, h, k, m]
    valid = window < n_kept.unsqueeze(-1)
    targets = kept_slots.gather(-1, window.clamp(max=n - 1).view(b, h, -1)).view(b, h, k, merge_budget)
    size = valid.sum(dim=-1)  # [b, h, k]
    window_a = attention.gather(-1, targets.view(b, h, -1)).view(b, h, k, merge_budget) * valid
    mean_a = window_a.sum(dim=-1) / size.clamp(min=1)
    p = attention.gather(-1, slots) / mean_a
    p = torch.where(torch.isnan(p), torch.zeros_like(p), p)
    p = torch.where(torch.isinf(p), torch.ones_like(p), p).clamp(0, 1)
    merges = gone & (draws(at) < p) & (size > 0)  # [b, h, k]
    acc = values if values.dtype.itemsize >= 4 else values.float()
    scale = merges.to(acc.dtype) / size.clamp(min=1)
    src = acc.gather(2, slots.unsqueeze(-1).expand(-1, -1, -1, dv)) * scale.unsqueeze(-1)
    src = src.unsqueeze(3).expand(-1, -1, -1, merge_budget, -1) * valid.unsqueeze(-1)  # [b, h, k, m, dv]
    idx = targets.view(b, h, -1, 1).expand(-1, -1, -1, dv)
    acc.scatter_add_(2, idx, src.reshape(b, h, k * merge_budget, dv))
    if acc is not values:
        values.copy_(acc)  # one rounding to the cache's dtype; untouched values round back to themselves
    hit = (merges.unsqueeze(-1) & valid).reshape(b, h, -1).long()
    received = torch.zeros(b, h, n, dtype=torch.long, device=values.device)
    return received.scatter_add_(-1, targets.reshape(b, h, -1), hit) > 0


@register
@dataclass
class CaM(PassesOn, Policy):
    name = "cam"
    rule = ("an inner policy's head-averaged scores choose the evicted tokens; each is added, with probability "
            "clamp(its attention / its window's mean), into the values of the kept tokens that follow it "
            "(kvpress' CAMPress)")

    #: the policy whose scores, averaged over a layer's KV heads, choose what is evicted: a name or a policy object
    #: (H2O by default: the paper's heavy hitters, scored by the same accumulated attention)
    inner: Any = "h2o"
    #: how many of the kept tokens that follow a freed token share its value
    merge_budget: int = 32
    #: salts the hashed merge draws
    seed: int = 0

    def validate(self) -> None:
        if isinstance(self.merge_budget, bool) or not isinstance(self.merge_budget, int) or self.merge_budget < 1:
            raise ValueError(f"merge_budget: expected a positive integer, got {self.merge_budget!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")
        self._inner: Policy = built_inner(self.inner, wrap_reason)

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs, every query's attention, the running sum ``A``, the merge step; every head
        gets the same scores."""
        inner = self._inner.needs()
        return replace(inner, attention=AttentionNeed("all"), token_state=(*inner.token_state, ATTENTION),
                       merges=True, heads_alike=True)

    def observe(self, ctx: ScoreContext) -> None:
        """The inner policy's observation; ``A += `` this step's attention ``[b, h, group, n]`` (summed over its
        queries) averaged over the group."""
        self._inner.observe(ctx)
        ctx.state[ATTENTION] += ctx.attention.mean(dim=2)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        return head_mean(self._inner.score(keys, ctx), ctx)

    def apply(self, eviction: LayerEviction) -> None:
        """Merge the freed tokens into the kept values after them, then the inner policy commits."""
        ctx = eviction.ctx
        eviction.rewrote_values(merge_into_windows(eviction.freed(), ctx, ctx.state[ATTENTION], self.merge_budget,
                                                   lambda at: hashed_draws(self.seed, ctx.layer_idx, at, ctx.seen)))
        self._inner.apply(eviction)
