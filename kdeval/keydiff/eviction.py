"""Eviction after a step: one per-layer loop for every cache layout.

Per layer, five moves: the layer's context (the keys to score and what the policy reads), the policy observes
it, how many tokens to free, which (the one selector), commit (compact the layer); a merging policy
(``PolicyNeeds.merges``) rewrites the kept values from the freed tokens just before the commit (a quantized store
quantizes again the rewritten values it held quantized); a re-rotating policy's kept keys are then re-rotated, and
a policy that edits its kept keys (``PolicyNeeds.edits_kept_keys``, ThinK) edits them last, in the rows that freed
tokens. Under ``kv_quant`` the layer's store (kdeval/keydiff/kvstore.py) counts its bytes before the commit and
quantizes the kept tokens that left the window after it, into its record of packed codes (all of them again
after re-rotation or an edit), so the policy scores the step's incoming keys in full precision and the older ones
as stored. What each move is in a layout is the layout adapter's (kdeval/keydiff/layouts.py); the policy and the
plan (budgets, needs) are read here only. Shapes as in :mod:`kdeval.keydiff.policy`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.kvstore import QuantizedStore
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
        self.store = QuantizedStore(plan.kv_quant, plan.num_layers) if plan.kv_quant is not None else None

    def evict(self, layout: "SlotLayout | RaggedLayout", reads: StepReads) -> None:
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

    def _evict_layer(self, layout: "SlotLayout | RaggedLayout", idx: int, reads: StepReads) -> bool:
        """Layer ``idx``'s five moves (and re-rotation, and the policy's edit); whether its kept keys were rewritten
        (re-rotated or edited)."""
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
        before = ctx.positions.sort(dim=-1).values if self.plan.rerotate else None
        selection = layout.select(idx, keys, ctx, k, self.selector)
        if self.plan.needs.merges:  # the policy folds the freed tokens into the kept ones' values
            merged = self.policy.merge(keys, layout.freed(idx, selection, k), ctx)
            if self.store is not None and merged is not None:
                self.store.requantize_values(layout, idx, merged)
        layout.commit(idx, selection)
        if before is not None:
            kept_keys, kept_positions = layout.kept(idx)
            rerotate(self.model, kept_keys, kept_positions, before)
        edits = self.plan.needs.edits_kept_keys
        if edits:  # after re-rotation: what the policy edits is what the model reads from now on
            kept_keys, kept_positions = layout.kept(idx)
            self.policy.edit_kept_keys(kept_keys, kept_positions, ctx, layout.evicted_rows(idx))
        return before is not None or edits
