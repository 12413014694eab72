"""Eviction after a step: score the cached tokens, keep the protected ones, free the rest down to the budget.

The half of a step (kdeval/keydiff/step.py) that runs after the forward, layer by layer, reading the policy and
the plan (budgets, needs) only. Shapes as in :mod:`kdeval.keydiff.policy`.
"""
from __future__ import annotations

import torch

from typing import TYPE_CHECKING

from kdeval.keydiff.attention import AttentionCapture
from kdeval.keydiff.cache import BudgetCache, EmptySlots
from kdeval.keydiff.headpool import HeadPoolCache
from kdeval.keydiff.headpool_eviction import evict_pool
from kdeval.keydiff.policy import Policy, ScoreContext, held_tokens
from kdeval.keydiff.queries import StepQueries
from kdeval.keydiff.ragged import RaggedCache, RaggedStep, clear_past, compact_rows, kept_mask
from kdeval.keydiff.rerotation import rerotate
from kdeval.keydiff.selection import Selector

if TYPE_CHECKING:
    from kdeval.keydiff.plan import Plan


class Evictor:
    """Evicts the caches of one policy under one plan (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: "Plan"):
        """``model``: for re-rotation (its rotary embedding)."""
        self.model, self.policy, self.plan = model, policy, plan
        self.selector = Selector(policy, plan.needs.exact_ties)

    def evict(self, cache: BudgetCache, t: int, seen: int | torch.Tensor, steps: int,
               capture: AttentionCapture | None, empty: EmptySlots | None = None, evict: bool = True,
               protected: tuple[tuple[int, int], ...] = (), recent: StepQueries | None = None) -> None:
        """Score and free slots per layer. ``empty``: the static layout's empty slots (``None`` otherwise);
        ``recent``: the step's recent queries, for a policy with a ``QueryNeed``.

        Each layer keeps its budget (``budgets[idx]``) plus the protected tokens (``protected``: position
        ranges, all held); ``evict=False``: the policy observes the step and everything is kept."""
        if isinstance(cache, HeadPoolCache):
            evict_pool(self.policy, self.plan, cache, t, seen, steps, capture, evict, protected)
            return
        plan = self.plan
        if not plan.evicting:
            for layer in cache.layers:
                layer.evict(None)
            if capture is not None:
                capture.clear()
            return
        held, budgets, rerotates = held_tokens(protected), plan.budgets, plan.needs.rerotates
        for idx, layer in enumerate(cache.layers):
            budget = budgets[idx]
            keep = budget + held
            m = keep + t if empty is not None else layer.length + layer.pending
            keys, positions, pstate = layer.view()
            ctx = ScoreContext(idx, positions, seen, t, capture.by_layer.get(idx) if capture else None, pstate, steps)
            self._add_queries(ctx, recent, layer.values, keys.shape[2])
            self.policy.observe(ctx)
            if empty is not None and empty.room_slots is not None:
                layer.commit_into(empty.room_slots)
                continue
            if not evict or m <= keep:
                layer.evict(None)
                continue
            before = positions.sort(dim=-1).values if rerotates else None
            layer.evict(self.selector.free(keys, ctx, m - keep, budget, protected,
                                           empty=empty.mask if empty is not None else None))
            if before is not None:
                kept_keys, kept_positions, _ = layer.view()
                rerotate(self.model, kept_keys, kept_positions, before)
        if capture is not None:
            capture.clear()

    def _add_queries(self, ctx: ScoreContext, recent: StepQueries | None, values: torch.Tensor, m: int) -> None:
        """Give ``ctx`` the layer's recent queries and, when the policy asks, its values' first ``m`` slots."""
        if recent is not None:
            ctx.queries = recent.layer(ctx.layer_idx)
            if self.plan.needs.queries.values:
                ctx.values = values[:, :, :m]

    def evict_ragged(self, cache: RaggedCache, layer_steps: list[RaggedStep], steps: int | torch.Tensor,
                      capture: AttentionCapture | None, protected: list[list[tuple[int, int]]],
                      recent: StepQueries | None = None) -> None:
        """Eviction after a step of a ragged batch (kdeval/keydiff/ragged.py), per layer with its step
        ``layer_steps[idx]``: row ``r`` keeps ``step.keep[r]`` tokens in ``[0, keep[r])``, chosen as
        the selector chooses at batch 1 (the policy's scores, its sink/recent positions and the row's
        ``protected`` ranges raised), the empty and padding slots freed first; ``steps``: the rows' eviction
        steps before this one (an int when they agree); ``recent``: the step's recent queries, for a policy
        with a ``QueryNeed``."""
        for idx, layer in enumerate(cache.layers):
            step = layer_steps[idx]
            m = step.M
            drop = (m - step.keep).view(-1, 1, 1)
            k = max(m - kept for kept in step.host_keep)
            budget = self.plan.budgets[idx] if self.plan.evicting else None
            keys, positions, pstate = layer.view(m)
            if self.plan.evicting:
                attention = capture.by_layer.get(idx) if capture else None
                ctx = ScoreContext(idx, positions, step.seen_after, step.T, attention, pstate, steps)
                self._add_queries(ctx, recent, layer.values, m)
                self.policy.observe(ctx)
            if step.in_place:
                continue
            if step.drops:
                tail = keys[:, :, step.base : m]
                tail.masked_fill_(step.pad[:, step.base :].view(step.rows, 1, step.T, 1), 0)  # zero keys: no anchor
                # eager (a ragged batch's shapes change every step); the row's own protected ranges
                order = self.selector.free(keys, ctx, k, budget, protected, per_row=True,
                                           empty=~step.valid.unsqueeze(1), sorted=True)
                kept = kept_mask(order, drop, m)
            else:
                kept = step.valid.unsqueeze(1).expand(-1, keys.shape[1], -1)
            before = positions.sort(dim=-1).values if self.plan.rerotate and step.drops else None
            compact_rows(layer.buffers(), kept, step.keep, step.movers)
            clear_past(layer.keys, layer.positions, step.keep, min(step.host_keep), m)
            if before is not None:
                n = max(step.host_keep)
                rerotate(self.model, layer.keys[:, :, :n], layer.positions[:, :, :n], before)
        if capture is not None:
            capture.clear()

