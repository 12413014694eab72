"""Eviction after a step: one per-layer loop for every cache layout.

Per layer, five moves: the layer's context (the keys to score and what the policy reads), the policy observes
it, how many tokens to free, which (the one selector), commit (compact the layer); a re-rotating policy's kept
keys are then re-rotated. What each move is in a layout is the layout adapter's (kdeval/keydiff/layouts.py);
the policy and the plan (budgets, needs) are read here only. Shapes as in :mod:`kdeval.keydiff.policy`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.policy import Policy
from kdeval.keydiff.reads import StepReads
from kdeval.keydiff.rerotation import rerotate
from kdeval.keydiff.selection import Selector

if TYPE_CHECKING:
    from kdeval.keydiff.layouts import RaggedLayout, SlotLayout
    from kdeval.keydiff.plan import Plan


class Evictor:
    """Evicts the caches of one policy under one plan (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: "Plan"):
        """``model``: for re-rotation (its rotary embedding)."""
        self.model, self.policy, self.plan = model, policy, plan
        self.selector = Selector(policy, plan.needs.exact_ties)

    def evict(self, layout: "SlotLayout | RaggedLayout", reads: StepReads) -> None:
        """Score and free slots per layer of ``layout``'s cache after its step; ``reads``: what the step gathered
        for the policy. Without eviction (the full cache) every layer keeps its tokens and the policy sees
        nothing."""
        evicting, rerotates = self.plan.evicting, self.plan.rerotate
        for idx in range(layout.num_layers):
            k = 0
            if evicting:
                keys, ctx = layout.context(idx, reads)
                self.policy.observe(ctx)
                k = layout.excess(idx)
            if not k:
                layout.commit(idx, None)
                continue
            before = ctx.positions.sort(dim=-1).values if rerotates else None
            layout.commit(idx, layout.select(idx, keys, ctx, k, self.selector))
            if before is not None:
                kept_keys, kept_positions = layout.kept(idx)
                rerotate(self.model, kept_keys, kept_positions, before)
        reads.done()
