"""Eviction after a step: one per-layer loop for every cache layout.

Per layer, five moves: the layer's context (the keys to score and what the policy reads), the policy observes
it, how many tokens to free, which (the one selector), and the commit (compact the layer), which the policy's
one hook, :meth:`~kdeval.keydiff.policy.Policy.apply`, performs on a :class:`~kdeval.keydiff.layer_eviction.
LayerEviction`: a merging policy rewrites the kept values from the freed tokens before it, ThinK zeroes key
channels after it, and under the contiguous-positions scheme the commit re-rotates the kept keys.

Under ``kv_quant`` the layer's store (kdeval/keydiff/kvstore.py) counts its bytes before the commit and quantizes
the kept tokens that left the window after it, into its record of packed codes (all of them again after
re-rotation or an edit), so the policy scores the step's incoming keys in full precision and the older ones as
stored. What each move is in a layout is the layout adapter's (kdeval/keydiff/layouts.py); the policy and the
plan (budgets, needs) are read here only. Shapes as in :mod:`kdeval.keydiff.policy`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.kvstore import QuantizedStore
from kdeval.keydiff.layer_eviction import LayerEviction
from kdeval.keydiff.policy import Policy
from kdeval.keydiff.reads import StepReads
from kdeval.keydiff.selection import Selector

if TYPE_CHECKING:
    from kdeval.keydiff.layouts import Layout
    from kdeval.keydiff.plan import Plan


class Evictor:
    """Evicts the caches of one policy under one plan (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: "Plan"):
        """``model``: for re-rotation (its rotary embedding)."""
        self.model, self.policy, self.plan = model, policy, plan
        self.selector = Selector(policy, plan.needs.exact_ties)
        self.store = QuantizedStore(plan.kv_quant, plan.num_layers) if plan.kv_quant is not None else None

    def evict(self, layout: "Layout", reads: StepReads) -> None:
        """Score and free slots per layer of ``layout``'s cache after its step; ``reads``: what the step gathered
        for the policy. Without eviction (the full cache) every layer keeps its tokens and the policy sees
        nothing."""
        store = self.store
        for idx in range(layout.num_layers):
            if store is not None:
                store.before_commit(layout, idx)
            rewritten = self._evict_layer(layout, idx, reads)
            if store is not None:
                store.settle(layout, idx, requantize=rewritten)
        reads.done()

    def _evict_layer(self, layout: "Layout", idx: int, reads: StepReads) -> bool:
        """Layer ``idx``'s moves (the policy's ``apply`` commits); whether its kept keys were rewritten (re-rotated
        or edited)."""
        k = 0
        if self.plan.trims(idx):  # a windowed layer keeps what the model sees next, whatever the policy
            k = layout.excess(idx)
            layout.commit(idx, layout.window_selection(idx, k) if k else None)
            return False
        if self.plan.evicting:
            keys, ctx = layout.context(idx, reads)
            self.policy.observe(ctx)
            k = layout.excess(idx)
        if not k:
            layout.commit(idx, None)
            return False
        selection = layout.select(idx, keys, ctx, k, self.selector)
        eviction = LayerEviction(layout, idx, keys, ctx, selection, k, self.store,
                                 self.model if self.plan.rerotate else None)
        self.policy.apply(eviction)
        if not eviction.committed:
            raise RuntimeError(f"policy '{self.policy.name}': apply() left layer {idx}'s eviction uncommitted")
        return eviction.keys_rewritten
