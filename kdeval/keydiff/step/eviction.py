"""Eviction after a step: one per-layer loop for every cache layout, and the one hook a policy acts through.

Per layer, five moves: the layer's context (the keys to score and what the policy reads), the policy observes
it, how many tokens to free, which (the one selector), and the commit (compact the layer). The evictor builds a
:class:`LayerEviction` and hands it to the policy's one hook, :meth:`~kdeval.keydiff.policy.interface.Policy.apply`, which
must commit it once; before the commit a policy may rewrite the kept values from the freed tokens (merging, CaM),
after it rewrite the kept keys (ThinK zeroes key channels). The default ``apply`` only commits. Under the
contiguous-positions scheme (``PolicyNeeds.rerotates``) the commit re-rotates the kept keys itself
(kdeval/keydiff/attention/rerotation.py), because the engine feeds the next step's RoPE positions from the kept count.

Under ``kv_quant`` the layer's store (kdeval/keydiff/quant/store.py) counts its bytes before the commit and quantizes
the kept tokens that left the window after it, into its record of packed codes (the rewritten values again, and
every held key after re-rotation or a key edit), so the policy scores the step's incoming keys in full precision
and the older ones as stored. What each move is in a layout is the layout adapter's (kdeval/keydiff/cache/layouts.py);
the policy and the plan (budgets, needs) are read here only. Shapes as in :mod:`kdeval.keydiff.policy.interface`: ``keys
[batch, kv_heads, tokens, head_dim]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.quant.store import QuantizedStore
from kdeval.keydiff.policy.interface import Freed, Policy, ScoreContext
from kdeval.keydiff.attention.reads import StepReads
from kdeval.keydiff.attention.rerotation import rerotate
from kdeval.keydiff.policy.selection import Selector

if TYPE_CHECKING:
    from kdeval.keydiff.cache.layouts import Layout
    from kdeval.keydiff.plan.plan import Plan


class LayerEviction:
    """Layer ``idx``'s eviction of ``k`` tokens per row and head (``selection``: the layout's form of it) in
    ``layout``, with the ``keys`` as scored and the policy's ``ctx``; ``rerotating``: the model whose rotary
    embedding re-rotates the kept keys at the commit (``None``: positions stay absolute)."""

    def __init__(self, layout: "Layout", idx: int, keys: torch.Tensor, ctx: ScoreContext,
                 selection: torch.Tensor, k: int, store: "QuantizedStore | None" = None,
                 rerotating: torch.nn.Module | None = None):
        self.layout, self.idx, self.keys, self.ctx = layout, idx, keys, ctx
        self.selection, self.k, self.store, self.rerotating = selection, k, store, rerotating
        self.committed = False
        #: the kept keys were rewritten after the commit (re-rotated, or handed out by :meth:`kept` to edit)
        self.keys_rewritten = False

    def freed(self) -> Freed:
        """Before the commit: the layer's values (views of its buffers), the freed slots and the kept ones."""
        self._before_commit("freed()")
        return self.layout.freed(self.idx, self.selection, self.k)

    def rewrote_values(self, slots: torch.Tensor | None) -> None:
        """Before the commit: the policy rewrote the values at ``slots [batch, kv_heads, tokens]`` bool (``None``:
        none) of :meth:`freed`'s ``values``; a quantized store quantizes again those it held."""
        self._before_commit("rewrote_values()")
        if self.store is not None and slots is not None:
            self.store.requantize_values(self.layout, self.idx, slots)

    def commit(self) -> None:
        """Free the selected tokens (compact the layer) and, under re-rotation, move the kept keys to contiguous
        RoPE positions."""
        self._before_commit("commit()")
        before = self.ctx.positions.sort(dim=-1).values if self.rerotating is not None else None
        self.layout.commit(self.idx, self.selection)
        self.committed = True
        if before is not None:
            keys, positions = self.layout.kept(self.idx)
            rerotate(self.rerotating, keys, positions, before)
            self.keys_rewritten = True

    def kept(self) -> tuple[torch.Tensor, torch.Tensor]:
        """After the commit: the kept keys ``[batch, kv_heads, n, head_dim]`` (views of the cache's buffers, for
        the policy to rewrite in place; slots that hold no token: positions ``>= ctx.seen``, zero keys) and their
        positions ``[batch, kv_heads, n]``."""
        if not self.committed:
            raise RuntimeError(f"layer {self.idx}: kept() before commit()")
        self.keys_rewritten = True
        return self.layout.kept(self.idx)

    def rows(self) -> torch.Tensor | None:
        """After the commit: ``[batch]`` bool, the rows that freed tokens in this step (``None``: every row)."""
        return self.layout.evicted_rows(self.idx)

    def _before_commit(self, what: str) -> None:
        if self.committed:
            raise RuntimeError(f"layer {self.idx}: {what} after commit()")


class Evictor:
    """Evicts the caches of one policy under one plan (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: "Plan"):
        """``model``: for re-rotation (its rotary embedding)."""
        self.model, self.policy, self.plan = model, policy, plan
        self.selector = Selector(policy, plan.needs.exact_ties)
        self.store = QuantizedStore(plan.kv_quant, plan.num_layers) if plan.kv_quant is not None else None
        self.kv_layers = plan.kv_layers  # the layers that hold keys: a recurrent layer's states are kept whole

    def evict(self, layout: "Layout", reads: StepReads) -> None:
        """Score and free slots per layer of ``layout``'s cache after its step; ``reads``: what the step gathered
        for the policy. Without eviction (the full cache) every layer keeps its tokens and the policy sees
        nothing."""
        store = self.store
        for idx in self.kv_layers:
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
