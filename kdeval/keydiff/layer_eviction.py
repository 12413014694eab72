"""One layer's eviction between its selection and its commit: what :meth:`~kdeval.keydiff.policy.Policy.apply`
receives, the one hook through which a policy acts on its kept entries.

The evictor (kdeval/keydiff/eviction.py) selects the tokens to free, builds a :class:`LayerEviction` and hands it
to the policy's ``apply``, which must :meth:`~LayerEviction.commit` it once; before the commit a policy may rewrite
the kept values from the freed tokens (:meth:`~LayerEviction.freed`, then :meth:`~LayerEviction.rewrote_values`:
merging, CaM), after it rewrite the kept keys (:meth:`~LayerEviction.kept`: ThinK zeroes key channels). The
default ``apply`` only commits. Under the contiguous-positions scheme (``PolicyNeeds.rerotates``) the commit
re-rotates the kept keys itself (kdeval/keydiff/rerotation.py), because the engine feeds the next step's RoPE
positions from the kept count: the two cannot be declared apart.

Under ``kv_quant`` the layer's store (kdeval/keydiff/kvstore.py) quantizes again the rewritten values it held
quantized, and after re-rotation or a key edit every held key (:attr:`LayerEviction.keys_rewritten`).

Shapes as in :mod:`kdeval.keydiff.policy`: ``keys [batch, kv_heads, tokens, head_dim]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.policy import Freed, ScoreContext
from kdeval.keydiff.rerotation import rerotate

if TYPE_CHECKING:
    from kdeval.keydiff.kvstore import QuantizedStore
    from kdeval.keydiff.layouts import Layout


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
