"""Budgeted KV caches the engine evicts from, plugged into transformers as a ``Cache``.

A :class:`BudgetCache` keeps, per layer, the cached ``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]``, the
absolute ``positions`` ``[batch, kv_heads, tokens]`` of those tokens and any per-token policy state. During a
chunk's forward the chunk's ``t`` tokens are appended after the ``n`` cached ones, so the valid tokens are always
slots ``[0, n + t)`` with the chunk last: the causal mask transformers builds from the cache length (all of the
cache, causal within the chunk) is therefore right, whatever order the older tokens sit in, as long as every layer
holds the same count (transformers builds one mask, from layer 0). Under per-layer budgets (PyramidKV) the layers
hold different counts and the engine runs attention without a mask, lower-right causal over each layer's own keys
(kdeval/keydiff/plan.py chooses it).

- :class:`SlotLayer`: one slot buffer (:class:`~kdeval.keydiff.buffers.SlotBuffers`) of ``budget + chunk``
  slots allocated once and written in place. Eviction of ``k`` tokens moves the chunk's surviving tokens into
  the ``k`` freed slots among the first ``budget`` (an O(k) copy, no gather of the whole cache), so slot order
  is not position order.
- Its *static* layout (``static_base=N``, used by the captured CUDA-graph step; kdeval/keydiff/static.py):
  every chunk of ``t`` tokens is written to the tail slots ``[N, N + t)`` and attention, scoring and eviction
  always see all ``N + t`` slots; empty head slots are masked and evicted first.

The tests check this store against a reference written there (a growing layer whose eviction gathers the kept
tokens in position order), plugged in through ``Engine(cache_layer=...)``.

Steps that do not evict (kvpress's question, decoding without eviction) make the cache grow past
``budget + chunk``: a slot layer then grows its buffers (once, by :meth:`BudgetCache.reserve_more`, when the
engine knows how much), and a static-layout cache, which cannot grow, is first copied into a dynamic one
(:meth:`BudgetCache.thawed`).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from kdeval.keydiff.buffers import BufferedLayer, SlotBuffers, state_buffers
from kdeval.keydiff.slots import EMPTY_POSITION


class BudgetLayerMixin:
    """Bookkeeping every budgeted layer shares: committed length, pending chunk, the next chunk's positions."""

    length: int
    pending: int

    def _init_budget(self) -> None:
        self.length = 0
        self.pending = 0
        self.next_positions: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


class SlotLayer(BudgetLayerMixin, BufferedLayer):
    """A buffer of ``capacity`` slots written in place, grown only for the full cache and steps without eviction.

    ``static_base`` N selects the static layout (module docstring): chunks land in ``[N, N + t)``. ``limit``: the
    most slots an evicting layer ever needs (its budget plus a chunk): a layer allocated smaller for a short call
    grows up to it, not past it, when a later call continues its state.
    """

    def __init__(self, capacity: int, state_names: tuple[str, ...] = (), static_base: int | None = None,
                 limit: int | None = None):
        fill = EMPTY_POSITION if static_base is not None else 0
        BufferedLayer.__init__(self, SlotBuffers(capacity, fill, state_buffers(state_names)), state_names)
        self.static_base, self.limit = static_base, limit
        self._init_budget()

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens at once (no-op when there is; not for the static layout)."""
        if capacity <= self.capacity:
            return
        if self.static_base is not None:
            raise ValueError("reserve: the static layout's buffers have a fixed size")
        self.slot_buffers.grow(capacity, self.length, exact=True)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        start = self.length if self.static_base is None else self.static_base
        self.slot_buffers.grow(start + t, self.length, limit=self.limit)
        end = self.slot_buffers.write(start, key_states, value_states, self.next_positions)
        self.pending = t
        return self.keys[:, :, :end], self.values[:, :, :end]

    def view(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The valid tokens (cached + pending chunk): keys, positions, state (views, writable).

        In the static layout with a chunk pending: all ``N + t`` slots, empty ones included.
        """
        m = self.length + self.pending
        if self.static_base is not None and self.pending:
            m = self.static_base + self.pending
        return self.keys[:, :, :m], self.positions[:, :, :m], {n: s[:, :, :m] for n, s in self.state.items()}

    def adopt(self, src: "SlotLayer") -> None:
        """Take copies of ``src``'s valid tokens ``[0, src.length)`` into this (empty, dynamic) layer's buffers."""
        self.dtype, self.device, self.is_initialized = src.dtype, src.device, True
        self.slot_buffers.copy_of(src.slot_buffers, src.length)
        self.length = src.length

    def load(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
             state: dict[str, torch.Tensor]) -> None:
        """Hold these tensors ``[rows, heads, n, ...]`` (not copied) as this empty dynamic layer's ``n`` tokens."""
        self.slot_buffers.take({"keys": keys, "values": values, "positions": positions, **state})
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.length, self.pending = keys.shape[2], 0

    def commit_into(self, slots: torch.Tensor) -> None:
        """Static layout, with room for the whole chunk: move it from the tail into the empty ``slots [t]``."""
        self.slot_buffers.move_tail(slots, self.static_base)
        self.length += self.pending
        self.pending = 0

    def evict(self, drop: torch.Tensor | None) -> None:
        """Commit the pending chunk and free the slots ``drop [b, h, k]`` (``None``: keep everything).

        With ``m`` valid slots and ``k`` to drop, the kept tokens must end in slots ``[0, m - k)``. Dropped slots
        below ``m - k`` are holes; the chunk-tail slots ``[m - k, m)`` that survive move into those holes.
        In the static layout ``m = N + t`` and exactly ``t`` slots are dropped (empty ones first).
        """
        t = self.pending
        m = self.length + t if self.static_base is None else self.static_base + t
        self.pending = 0
        if self.static_base is not None:
            if drop is None or drop.shape[-1] != t:
                raise ValueError(f"drop: the static layout frees exactly the chunk's {t} slots per step")
            self.length = min(self.length + t, self.static_base)
        elif drop is None or drop.shape[-1] == 0:
            self.length = m
            return
        keep_n = m - drop.shape[-1]
        self.slot_buffers.compact(drop, keep_n)
        if self.static_base is None:
            self.length = keep_n


class BudgetCache(Cache):
    """A transformers ``Cache`` of budgeted layers (:class:`SlotLayer`), one per decoder layer."""

    def __init__(self, layers: list, state_names: tuple[str, ...] = (), static_base: int | None = None):
        """``layers``: one per decoder layer (:class:`SlotLayer`, or a test's reference layer), each with its
        ``capacity``; ``static_base``: the static layout's N (every layer the same slots)."""
        capacities = [layer.capacity for layer in layers]
        if static_base is not None and len(set(capacities)) > 1:
            raise ValueError("capacity: the static layout gives every layer the same slots")
        self.static_base = static_base
        #: every layer has the same slots, so every layer holds the same count (``length`` reads layer 0)
        self.uniform = len(set(capacities)) == 1
        self.state_names = tuple(state_names)
        super().__init__(layers=layers)
        self.graphs: dict = {}  # (batch, t, phase) -> CapturedStep bound to these buffers (static.phase)
        self.owner = None  # a weak reference to the CacheMaker that made it (its pool takes only its own)
        self.thawed_from: int | None = None  # the static base of the cache this one was thawed from
        self.query_window = None  # the recent queries of a policy with a QueryNeed (kdeval/keydiff/queries.py)
        self.rerotated = False  # its keys sit at contiguous RoPE positions (kdeval/keydiff/rerotation.py)
        self.kv_store = None  # a quantized store's record and bytes per layer (kdeval/keydiff/kvstore.py)

    @property
    def length(self) -> int:
        """Tokens held per KV head by the fullest layer (every layer's count under a uniform budget)."""
        if self.uniform:
            return self.layers[0].length
        return max(layer.length for layer in self.layers)

    def begin_chunk(self, positions: torch.Tensor) -> None:
        """Set the absolute positions ``[t]`` of the chunk the next forward writes."""
        pos = positions.view(1, 1, -1)
        for layer in self.layers:
            layer.next_positions = pos

    def can_copy_from(self, other: "BudgetCache") -> bool:
        """Whether :meth:`copy_from` applies: both static-layout caches with buffers of the same shapes."""
        if self.static_base is None or other.static_base != self.static_base or other is self:
            return False
        if not all(l.is_initialized for l in (*self.layers, *other.layers)):
            return False
        return len(self.layers) == len(other.layers) and all(
            a.slot_buffers.same_shapes(b.slot_buffers) for a, b in zip(self.layers, other.layers))

    def copy_from(self, other: "BudgetCache") -> None:
        """Overwrite this static cache's buffers and bookkeeping with ``other``'s, in place (same addresses,
        so graphs captured on this cache stay valid)."""
        for mine, theirs in zip(self.layers, other.layers):
            mine.slot_buffers.copy_from(theirs.slot_buffers)
            mine.length, mine.pending = theirs.length, theirs.pending

    @property
    def batch_size(self) -> int | None:
        """Rows of the batch the buffers were allocated for (``None`` before the first forward)."""
        layer = self.layers[0]
        return layer.keys.shape[0] if layer.is_initialized else None

    def reset(self) -> None:
        """Empty a static-layout cache in place, as freshly allocated (zero keys, values and state, empty
        positions, length 0), keeping its buffers and so the graphs captured on them (the engine's pool)."""
        if self.static_base is None or not all(l.is_initialized for l in self.layers):
            raise ValueError("reset: only an allocated static-layout cache is reset in place")
        with torch.inference_mode():  # the buffers were allocated during an inference-mode forward
            for layer in self.layers:
                layer.slot_buffers.reset()
        for layer in self.layers:
            layer.length, layer.pending, layer.next_positions = 0, 0, None

    def advance_static(self, t: int) -> None:
        """Host-side bookkeeping of a static step of ``t`` tokens once its chunk is committed (what ``evict``
        does per layer): a replayed graph."""
        for layer in self.layers:
            layer.pending = 0
            layer.length = min(layer.length + t, self.static_base)

    def nbytes(self) -> int:
        """Bytes held by the key/value tensors (allocated buffers, not just valid slots), all layers; a quantized
        store's: its record's codes, scales and zeros and its full-precision tokens after the last step."""
        if self.kv_store is not None:
            return sum(self.kv_store.held)
        return sum(l.nbytes() for l in self.layers)

    def held_nbytes(self) -> int:
        """Bytes of the key/value tensors allocated during the last forward, all layers: a slot layer's buffers
        (a growing layer's: the cached tokens plus the chunk, before eviction); a quantized store's: its held
        tokens during the forward, the incoming chunk in full precision."""
        if self.kv_store is not None:
            return sum(self.kv_store.peak)
        return sum(l.held_nbytes() for l in self.layers)

    def reserve_more(self, tokens: int) -> None:
        """Room for ``tokens`` more than each layer holds, allocated at once (a no-op where there is room): a layer
        with a smaller budget grows less."""
        for layer in self.layers:
            layer.reserve(layer.length + tokens)

    def thawed(self, capacity: int) -> "BudgetCache":
        """A copy of this static-layout cache's valid tokens ``[0, length)`` in a dynamic slot cache with room for
        ``capacity`` tokens per layer: chunks land after the kept tokens and the buffers grow, so steps that
        do not evict can follow. This cache is left as it is."""
        if self.static_base is None:
            raise ValueError("thawed: only a static-layout cache is thawed")
        cap = max(capacity, self.length)
        out = BudgetCache([SlotLayer(cap, self.state_names) for _ in self.layers], self.state_names)
        out.owner, out.thawed_from = self.owner, self.static_base
        for src, dst in zip(self.layers, out.layers):
            if src.is_initialized:
                dst.adopt(src)
        return out
