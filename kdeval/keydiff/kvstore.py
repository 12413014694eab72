"""The quantized store of a plan with ``kv_quant``: kept tokens quantized once they leave the window, and their bytes.

Where it acts: after each layer's commit (kdeval/keydiff/eviction.py), in every layout (slot, head pool, ragged
batch), through the layout.s :meth:`stored` view of the layer's kept slots. The tokens that crossed the
quantization frontier (:meth:`KVQuant.frontier <kdeval.keydiff.quant.KVQuant.frontier>`) in this step are
replaced, in the layer's buffers, by what a store of their codes, scales and zeros dequantizes to; a token is
quantized once, and its dequantized values are what every later step's attention and scores read.

What a policy scores: the step's incoming tokens in full precision (attention reads them so in the forward that
writes them, and they are quantized only after eviction, so a token is never quantized just to be dropped) and
the older kept tokens as they are stored, dequantized (the keys the model's attention reads). A re-rotating
policy rotates the stored tokens and they are quantized again, as a real store would after rotating them; so are
the keys a policy edits (ThinK's zeroed channels then hold what the store gives for zero, within half a step); a
merging policy's rewritten values are quantized again where they were stored quantized (before the commit).

Bytes (:class:`StoredBytes`): per layer, the quantized tokens' payload (``bits`` per number), their groups' scales
and zeros (per token; under ``kivi`` the live key groups, one pair per channel), and the full-precision tokens at
the cache's width; the peak of a step counts the incoming chunk in full precision, before eviction. The working
buffers themselves stay at the cache's width: this store holds the dequantized values there (what attention
reads), so the figures are those of a store holding codes, not the process's memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kdeval.keydiff.quant import KVQuant, grouped_roundtrip, per_token_roundtrip


@dataclass
class HeldSlots:
    """A layer's held slots as a layout sees them: ``keys [rows, H', m, d]``, ``values [rows, H', m, dv]`` (views
    of the buffers, written in place), ``positions [rows, H', m]``, ``valid [rows, H', m]`` (bool, broadcastable)
    and ``heads [rows, H', m]``: the KV head of each slot in a head-shared pool (``None``: the dim-1 index)."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    heads: torch.Tensor | None = None
    #: KV heads of the layer (a pool's ``H``; else ``keys.shape[1]``)
    num_heads: int = 0


class HoldsSlots(Protocol):
    cache: object

    def stored(self, idx: int) -> HeldSlots: ...

    def seen_range(self, idx: int) -> tuple[int | torch.Tensor, int | torch.Tensor]: ...


class StoredBytes:
    """Per layer: ``held`` (bytes stored after the last step) and ``peak`` (during its forward)."""

    def __init__(self, num_layers: int):
        self.held = [0] * num_layers
        self.peak = [0] * num_layers


class QuantizedStore:
    """Quantizes and counts the kept tokens of one plan's caches (module docstring)."""

    def __init__(self, quant: KVQuant, num_layers: int):
        self.quant, self.num_layers = quant, num_layers

    def _bytes(self, h: HeldSlots, frontier: int | torch.Tensor) -> int:
        """Bytes of the held slots with the positions below ``frontier`` quantized, the rest full precision."""
        q = self.quant
        d, dv = h.keys.shape[-1], h.values.shape[-1]
        item = h.keys.element_size()
        valid = h.valid.expand_as(h.positions)
        coded = valid & (h.positions < frontier)
        n_coded = int(coded.sum())
        n_full = int(valid.sum()) - n_coded
        key_tok, _ = q.token_bytes(d, item)
        _, value_tok = q.token_bytes(dv, item)
        total = n_coded * (key_tok + value_tok) + n_full * (d + dv) * item
        if q.scheme == "kivi" and n_coded:
            total += self._live_key_groups(h, coded) * q.key_group_bytes(d, item)
        return int(round(total))

    def _live_key_groups(self, h: HeldSlots, coded: torch.Tensor) -> int:
        """Distinct (row, KV head, key group) among the quantized slots: the key groups whose scales are held."""
        group = h.positions.masked_fill(~coded, 0) // self.quant.group_size
        span = int(group.max()) + 1
        if h.heads is not None:
            head, n_heads = h.heads.clamp(min=0), h.num_heads
        else:
            head, n_heads = torch.arange(group.shape[1], device=group.device).view(1, -1, 1), group.shape[1]
        rows, trash = group.shape[0], n_heads * span
        key = torch.where(coded, head * span + group, trash).reshape(rows, -1)
        taken = torch.zeros(rows, trash + 1, dtype=torch.int8, device=group.device).scatter_(1, key, 1)
        return int(taken[:, :trash].sum())

    def _stored(self, cache) -> StoredBytes:
        store = getattr(cache, "kv_store", None)
        if store is None:
            store = cache.kv_store = StoredBytes(self.num_layers)
        return store

    def before_commit(self, layout: HoldsSlots, idx: int) -> None:
        """The layer's bytes during the step's forward: the held tokens, the incoming ones in full precision."""
        before, _ = layout.seen_range(idx)
        self._stored(layout.cache).peak[idx] = self._bytes(layout.stored(idx), self.quant.frontier(before))

    def requantize_values(self, layout: HoldsSlots, idx: int, rewritten: torch.Tensor) -> None:
        """Before the layer's commit: quantize again the values of the ``rewritten [rows, H', m]`` slots (a merging
        policy's, :meth:`~kdeval.keydiff.policy.Policy.merge`) that were stored quantized (below the frontier
        before the step); the others are quantized, if at all, when they cross it (:meth:`settle`)."""
        q = self.quant
        before, _ = layout.seen_range(idx)
        h = layout.stored(idx)
        chosen = rewritten & h.valid.expand_as(h.positions) & (h.positions < q.frontier(before))
        at = chosen.nonzero(as_tuple=True)
        if at[0].numel():
            h.values[at] = per_token_roundtrip(h.values[at], q.group_size, q.bits)

    def settle(self, layout: HoldsSlots, idx: int, requantize: bool = False) -> None:
        """After the layer's commit: quantize the kept tokens that crossed the frontier in this step (all
        quantized ones when ``requantize``: re-rotated or edited keys), in place, and count the layer's stored bytes."""
        q = self.quant
        before, after = layout.seen_range(idx)
        h = layout.stored(idx)
        hi = q.frontier(after)
        lo = 0 if requantize else q.frontier(before)
        chosen = h.valid.expand_as(h.positions) & (h.positions >= lo) & (h.positions < hi)
        at = chosen.nonzero(as_tuple=True)  # the k crossing slots: an O(k) step, not one over the cache
        if at[0].numel():
            h.values[at] = per_token_roundtrip(h.values[at], q.group_size, q.bits)
            keys = h.keys[at]
            if q.scheme == "kivi":  # per (row, KV head, group of positions), each channel
                head = h.heads[at] if h.heads is not None else at[1]
                pos = h.positions[at]
                span = int(pos.max()) // q.group_size + 1
                groups = (at[0] * max(h.num_heads, 1) + head) * span + pos // q.group_size
                h.keys[at] = grouped_roundtrip(keys, groups, q.bits)
            else:
                h.keys[at] = per_token_roundtrip(keys, q.group_size, q.bits)
        self._stored(layout.cache).held[idx] = self._bytes(h, hi)
