"""The quantized store of a plan with ``kv_quant``: kept tokens quantized once they leave the window, and their bytes.

Where it acts: after each layer's commit (kdeval/keydiff/step/eviction.py), in every layout (slot, head pool, ragged
batch), through the layout's :meth:`stored` view of the layer's kept slots. The tokens that crossed the
quantization frontier (:meth:`KVQuant.frontier <kdeval.keydiff.quant.rule.KVQuant.frontier>`) in this step are
quantized once: their codes, scales and zeros go into the layer's record (below) and what they dequantize to
replaces them in the layer's buffers, from the same quantize call; those dequantized values are what every later
step's attention and scores read.

What a policy scores: the step's incoming tokens in full precision (attention reads them so in the forward that
writes them, and they are quantized only after eviction, so a token is never quantized just to be dropped) and
the older kept tokens as they are stored, dequantized (the keys the model's attention reads). A re-rotating
policy rotates the stored tokens and they are quantized again, as a real store would after rotating them; so are
the keys a policy edits (ThinK's zeroed channels then hold what the store gives for zero, within half a step); a
merging policy's rewritten values are quantized again where they were stored quantized (before the commit).

The record (:class:`~kdeval.keydiff.quant.packed.LayerRecord`, one per layer in ``cache.kv_store.records``): the
quantized tokens' packed key and value codes and their scales and zeros at the cache's dtype (per token, but
under ``kivi`` the keys': one pair per channel per live (row, KV head, group of positions)), keyed by (row, KV head,
position), so it does not depend on where a layout moves the slots. At each settle the evicted tokens leave it
(a ``kivi`` key group's scales with its last held token), the tokens crossing the frontier enter it, and every
entry is rewritten when the kept keys were (re-rotation, an edit: the values are quantized again too); a merge
rewrites the value entries of the merged tokens. The full-precision tokens are the held slots not in it. A fork
of a state copies its record; a ragged batch loads a start state's record into the state's row, drops finished
rows and gives each result's state its row's record.

Bytes (:class:`StoredBytes`): per layer, the ``nbytes`` of the record's codes, scales and zeros (the int64 keys
indexing them are bookkeeping and are not counted) plus the held slots that are not in the record at the cache's
width; the peak of a step counts the incoming chunk in full precision, before eviction. Packing pads a token's
codes to whole bytes, so these equal the analytical count (``bits`` per number, per group scales and zeros)
whenever ``head_dim * bits`` is a multiple of 8 (every head_dim that is a multiple of 4). The working buffers
stay allocated at the cache's width beside the record and hold the dequantized values attention reads: the
figures are the bytes of the record and the full-precision tokens, not the process's memory (nothing here
attends over the codes directly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kdeval.keydiff.quant.packed import LayerRecord, token_keys
from kdeval.keydiff.quant.rule import KVQuant, dequantize, grouped_quantize, per_token_dequantize, per_token_quantize


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

    def rowheads(self, at: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``row * num_heads + KV head`` of the slots at ``at`` (a ``nonzero(as_tuple=True)``)."""
        head = self.heads[at] if self.heads is not None else at[1]
        return at[0] * self.num_heads + head

    def tokens(self, at: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The record's keys (kdeval/keydiff/quant/packed.py) of the slots at ``at``."""
        return token_keys(self.rowheads(at), self.positions[at])


class HoldsSlots(Protocol):
    cache: object

    def stored(self, idx: int) -> HeldSlots: ...

    def seen_range(self, idx: int) -> tuple[int | torch.Tensor, int | torch.Tensor]: ...


class StoredBytes:
    """Per layer: ``held`` (bytes stored after the last step), ``peak`` (during its forward) and ``records`` (the
    quantized tokens, :class:`~kdeval.keydiff.quant.packed.LayerRecord`; ``None`` before the layer's first step)."""

    def __init__(self, num_layers: int):
        self.held = [0] * num_layers
        self.peak = [0] * num_layers
        self.records: list[LayerRecord | None] = [None] * num_layers

    def keep_rows(self, rows: list[int]) -> None:
        """A ragged batch's rows ``rows`` stay, in that order (the others' requests finished)."""
        for record in self.records:
            if record is not None:
                record.keep_rows(rows)

    def row(self, r: int, held: list[int]) -> "StoredBytes":
        """Batch row ``r`` as a batch-1 store of its own; ``held[l]``: the row's held tokens (all KV heads) in
        layer ``l`` (its held bytes: the record's plus the rest at full width)."""
        out = StoredBytes(len(self.records))
        for i, record in enumerate(self.records):
            if record is not None:
                mine = out.records[i] = record.row(r)
                out.held[i] = out.peak[i] = mine.nbytes() + (held[i] - mine.count) * mine.full_token_bytes
        return out

    def load_row(self, r: int, other: "StoredBytes") -> None:
        """Take ``other``'s (a batch-1 store's) records as batch row ``r``'s."""
        for i, record in enumerate(other.records):
            if record is None:
                continue
            if self.records[i] is None:
                self.records[i] = LayerRecord(record.quant, record.heads, record.d, record.dv, record.dtype,
                                              record.tokens.device)
            self.records[i].load_row(r, record)


class QuantizedStore:
    """Quantizes and counts the kept tokens of one plan's caches (module docstring)."""

    def __init__(self, quant: KVQuant, num_layers: int):
        self.quant, self.num_layers = quant, num_layers

    def _record(self, cache, idx: int, h: HeldSlots) -> LayerRecord:
        """Layer ``idx``'s record in ``cache``'s store (made at its first step)."""
        store = getattr(cache, "kv_store", None)
        if store is None:
            store = cache.kv_store = StoredBytes(self.num_layers)
        if store.records[idx] is None:
            store.records[idx] = LayerRecord(self.quant, h.num_heads, h.keys.shape[-1], h.values.shape[-1],
                                             h.keys.dtype, h.keys.device)
        return store.records[idx]

    @staticmethod
    def _bytes(h: HeldSlots, record: LayerRecord) -> int:
        """Bytes of the held slots: the record's tensors, and every held slot not in it at the cache's width."""
        n_held = h.positions.numel() if h.valid.dim() == 0 else int(h.valid.expand_as(h.positions).sum())
        return record.nbytes() + (n_held - record.count) * record.full_token_bytes

    def before_commit(self, layout: HoldsSlots, idx: int) -> None:
        """The layer's bytes during the step's forward: the held tokens, the incoming ones in full precision."""
        h = layout.stored(idx)
        record = self._record(layout.cache, idx, h)
        layout.cache.kv_store.peak[idx] = self._bytes(h, record)

    def requantize_values(self, layout: HoldsSlots, idx: int, rewritten: torch.Tensor) -> None:
        """Before the layer's commit: quantize again the values of the ``rewritten [rows, H', m]`` slots (a merging
        policy's, :meth:`~kdeval.keydiff.policy.interface.Policy.merge`) that the record holds (stored quantized), and
        rewrite their entries; the others are quantized, if at all, when they cross the frontier (:meth:`settle`)."""
        h = layout.stored(idx)
        record = self._record(layout.cache, idx, h)
        at = (rewritten & h.valid.expand_as(h.positions)).nonzero(as_tuple=True)
        if not at[0].numel() or not record.count:
            return
        tokens = h.tokens(at)
        inside = record.contains(tokens)
        at, tokens = tuple(a[inside] for a in at), tokens[inside]
        if tokens.numel():
            q = self.quant
            codes, scale, zero = per_token_quantize(h.values[at], q.group_size, q.bits)
            h.values[at] = per_token_dequantize(codes, scale, zero)
            record.set_values(tokens, codes, scale, zero)

    def settle(self, layout: HoldsSlots, idx: int, requantize: bool = False) -> None:
        """After the layer's commit: drop the evicted tokens from the record, quantize the kept tokens that crossed
        the frontier in this step (all those below it when ``requantize``: re-rotated or edited keys, their
        entries rewritten) in place in the buffers and into the record, and count the layer's stored bytes."""
        q = self.quant
        before, after = layout.seen_range(idx)
        h = layout.stored(idx)
        record = self._record(layout.cache, idx, h)
        hi = q.frontier(after)
        lo = 0 if requantize else q.frontier(before)
        valid = h.valid.expand_as(h.positions)
        if requantize:
            record.clear()
        elif record.count:
            record.keep(h.tokens((valid & (h.positions < lo)).nonzero(as_tuple=True)))
        chosen = valid & (h.positions >= lo) & (h.positions < hi)
        at = chosen.nonzero(as_tuple=True)  # the k crossing slots
        if at[0].numel():
            tokens = h.tokens(at)
            v_codes, v_scale, v_zero = per_token_quantize(h.values[at], q.group_size, q.bits)
            h.values[at] = per_token_dequantize(v_codes, v_scale, v_zero)
            if q.scheme == "kivi":  # per (row, KV head, group of positions), each channel
                k_codes, k_scale, k_zero, groups, inv = grouped_quantize(h.keys[at], record.group_keys(tokens),
                                                                         q.bits)
                h.keys[at] = dequantize(k_codes, k_scale[inv], k_zero[inv])
            else:
                k_codes, k_scale, k_zero = per_token_quantize(h.keys[at], q.group_size, q.bits)
                h.keys[at] = per_token_dequantize(k_codes, k_scale, k_zero)
                groups = None
            record.add(tokens, k_codes, v_codes, v_scale, v_zero, k_scale, k_zero, groups)
        layout.cache.kv_store.held[idx] = self._bytes(h, record)
