"""The engine's KV cache, plugged into transformers as a ``Cache``: one type for a request alone and for a batch.

A :class:`BudgetCache` keeps, per layer, the cached ``keys``/``values`` ``[rows, kv_heads, tokens, head_dim]``, the
absolute ``positions`` ``[rows, kv_heads, tokens]`` of those tokens and any per-token policy state, in one slot
buffer (:class:`~kdeval.keydiff.cache.slot_buffers.SlotBuffers`). Its layers are one of three arrangements:

- :class:`RowLayer`, the eager cache of every request: row ``r``'s kept tokens fill slots ``[0, lengths[r])``
  and a step's columns land after the fullest row, in ``[base, base + T)``. A request alone is a batch of one row,
  rows that share positions (``Engine.generate``) a batch without padding, independent requests a ragged batch
  (kdeval/keydiff/cache/ragged.py): each row keeps its own count, its kept slots moved into the holes below it (an O(k)
  move, no gather of the whole cache), so slot order is not position order; where the rows share positions the
  causal mask transformers builds from the cache length (all of the cache, causal within the chunk) is right. A
  state moves between batches as a selection of rows (kdeval/keydiff/cache/row_moves.py ``rows_of``): into a batch's row, out of it as a state
  of its own. The buffers are sized for a call's steps when it starts (kdeval/keydiff/plan/capacity.py); a later call
  that continues a state grows them, at once when the engine knows how much (:meth:`BudgetCache.reserve_more`).
- :class:`StaticLayer`, the graph path's (kdeval/keydiff/cache/static.py): every chunk of ``t`` tokens is written to the
  tail slots ``[N, N + t)`` and attention, scoring and eviction always see all ``N + t`` slots; empty head slots
  are masked and evicted first. It cannot grow: a step without eviction first thaws it into an eager cache
  (``row_moves.thawed``).
- the head-shared pool's (kdeval/keydiff/cache/headpool.py).

A recurrent layer of a hybrid model (linear attention, Mamba, short conv) is a
:class:`~kdeval.keydiff.cache.state_layer.StateLayer` in the same list: its states kept whole, no tokens, its rows
moving with the others'.

Under per-layer budgets (PyramidKV) the layers hold different counts and the engine runs attention without a
mask, lower-right causal over each layer's own keys (kdeval/keydiff/plan/plan.py chooses it). The tests check this
store against a reference written there (a growing layer whose eviction gathers the kept tokens in position
order), plugged in through ``Engine(cache_layer=...)``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from kdeval.keydiff.cache.slot_buffers import (EMPTY_POSITION, BufferedLayer, SlotBuffers, clear_past, kept_but,
                                               state_buffers)
from kdeval.keydiff.cache.state_layer import RecurrentStates, StateLayer

if TYPE_CHECKING:
    from kdeval.keydiff.cache.ragged import RaggedStep


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


class RowLayer(BufferedLayer):
    """The engine's eager cache layer, for a request alone as for a batch: slot buffers ``[rows, kv_heads,
    capacity, ...]`` where row ``r``'s kept tokens fill ``[0, lengths[r])`` and a step's ``T`` columns land in the
    tail ``[base, base + T)`` of every row (``base``: the fullest row's count). A step commits by each row's kept
    slots (:meth:`keep_slots`, one compaction whatever the rows); slots past a row's length are then empty (zero
    keys, :data:`EMPTY_POSITION`).

    ``limit``: the most slots an evicting layer ever needs (its budget plus a chunk): the buffers double up to it,
    not past it, when a later call continues the state; ``rows``: rows known before allocation (a batch's).
    """

    def __init__(self, capacity: int, state_names: tuple[str, ...] = (), limit: int | None = None, rows: int = 0):
        super().__init__(SlotBuffers(capacity, EMPTY_POSITION, state_buffers(state_names)), state_names)
        self.limit = limit
        self.lengths: list[int] = [0] * rows
        self.base = 0
        self.pending = 0
        self.next_positions: torch.Tensor | None = None  # [rows or 1, 1, T] (a ragged step's padding: empty)

    @property
    def length(self) -> int:
        """Tokens held by the fullest row (every row's count when the rows share positions)."""
        return max(self.lengths, default=0)

    @property
    def capacity(self) -> int:
        return self.slot_buffers.capacity

    @capacity.setter
    def capacity(self, slots: int) -> None:
        """Slots to allocate (before the buffers are; grown after)."""
        if self.is_initialized:
            raise ValueError("capacity: the buffers are allocated; grow them instead")
        self.slot_buffers.capacity = slots

    def allocate(self, rows: int, heads: int, key_dim: int, value_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().allocate(rows, heads, key_dim, value_dim, dtype, device)
        if len(self.lengths) != rows:
            self.lengths = [0] * rows

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens at once (no-op when there is)."""
        self.slot_buffers.grow(capacity, self.capacity, exact=True)

    def get_seq_length(self) -> int:
        return self.base

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.base + query_length, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the step's ``[rows, kv_heads, T, d]`` to ``[base, base + T)``; return slots ``[0, base + T)``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        self.slot_buffers.grow(self.base + t, self.capacity, limit=self.limit)
        end = self.slot_buffers.write(self.base, key_states, value_states, self.next_positions)
        self.pending = t
        return self.keys[:, :, :end], self.values[:, :, :end]

    def view(self, m: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Slots ``[0, m)`` (default: the held ones and the pending step's): keys, positions, state (views,
        writable)."""
        if m is None:
            m = self.base + self.pending if self.pending else self.length
        return self.keys[:, :, :m], self.positions[:, :, :m], {n: s[:, :, :m] for n, s in self.state.items()}

    def keep_slots(self, kept: torch.Tensor | None, step: "RaggedStep") -> None:
        """Commit the step of geometry ``step``: row ``r`` keeps the slots ``kept [rows, h, M]`` (``None``: all its
        real ones), ``step.keep[r]`` of them, moved into ``[0, keep[r])`` (:func:`~kdeval.keydiff.cache.slot_buffers.compact`,
        each hole below ``keep[r]`` filled by the lowest kept slot above it); the slots past a row's count are
        then clean."""
        if not step.in_place:  # in place: every row filled the whole step after a full-length head, kept all
            if kept is None:
                kept = step.valid.unsqueeze(1).expand(-1, self.keys.shape[1], -1)
            self.slot_buffers.compact(kept, step.keep, step.movers)
            clear_past(self.keys, self.positions, step.keep, min(step.host_keep), step.M)
        self.settle(step.host_keep)

    def settle(self, lengths: list[int]) -> None:
        """End the step: row ``r`` holds ``lengths[r]`` tokens in ``[0, lengths[r])``."""
        self.lengths = list(lengths)
        self.pending = 0
        self.base = self.length


class StateRowLayer(RowLayer, RecurrentStates):
    """A hybrid layer's cache (attention and a recurrent block side by side: Falcon-H1, Zamba2): an eager
    :class:`RowLayer` whose keys the policy evicts, and the recurrent block's states, kept whole."""

    def __init__(self, capacity: int, state_names: tuple[str, ...] = (), limit: int | None = None, rows: int = 0,
                 number_of_states: int = 1):
        RowLayer.__init__(self, capacity, state_names, limit, rows)
        RecurrentStates.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if args and not kwargs:  # the attention's first keys and values
            RowLayer.lazy_initialization(self, *args)
        else:  # the recurrent block's first states
            RecurrentStates.lazy_initialization(self, *args, **kwargs)


class StaticLayer(BudgetLayerMixin, BufferedLayer):
    """The graph path's layer (kdeval/keydiff/cache/static.py): ``N + B`` slots allocated once; every chunk lands in the
    tail ``[N, N + t)`` and the step sees all ``N + t`` slots, the empty head slots masked and freed first."""

    def __init__(self, capacity: int, state_names: tuple[str, ...], static_base: int):
        BufferedLayer.__init__(self, SlotBuffers(capacity, EMPTY_POSITION, state_buffers(state_names)), state_names)
        self.static_base = static_base
        self._init_budget()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.slot_buffers.write(self.static_base, key_states, value_states, self.next_positions)
        self.pending = key_states.shape[2]
        return self.keys[:, :, :end], self.values[:, :, :end]

    def view(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The held tokens ``[0, length)``, or with a chunk pending all ``N + t`` slots, empty ones included."""
        m = self.static_base + self.pending if self.pending else self.length
        return self.keys[:, :, :m], self.positions[:, :, :m], {n: s[:, :, :m] for n, s in self.state.items()}

    def commit_into(self, slots: torch.Tensor) -> None:
        """With room for the whole chunk: move it from the tail into the empty ``slots [t]``."""
        self.slot_buffers.move_tail(slots, self.static_base)
        self.length += self.pending
        self.pending = 0

    def evict(self, drop: torch.Tensor | None) -> None:
        """Commit the pending chunk, freeing exactly its ``t`` slots ``drop [b, h, t]`` (empty ones first) of the
        ``N + t``: the surviving tail slots move into the holes below ``N``."""
        t = self.pending
        self.pending = 0
        if drop is None or drop.shape[-1] != t:
            raise ValueError(f"drop: the static layout frees exactly the chunk's {t} slots per step")
        self.slot_buffers.compact(kept_but(drop, self.static_base + t), self.static_base, t)
        self.length = min(self.length + t, self.static_base)


class BudgetCache(Cache):
    """A transformers ``Cache`` of budgeted layers, one per decoder layer (module docstring)."""

    def __init__(self, layers: list, state_names: tuple[str, ...] = (), static_base: int | None = None):
        """``layers``: one per decoder layer (:class:`RowLayer`, :class:`StaticLayer`, a pool's, or a test's
        reference layer), each with its ``capacity``; ``static_base``: the static layout's N (every layer the same
        slots)."""
        capacities = [layer.capacity for layer in layers if not isinstance(layer, StateLayer)]
        if static_base is not None and len(set(capacities)) > 1:
            raise ValueError("capacity: the static layout gives every layer the same slots")
        self.static_base = static_base
        #: every layer has the same slots, so every layer holds the same count (``length`` reads the first that holds keys)
        self.uniform = len(set(capacities)) == 1
        self.state_names = tuple(state_names)
        super().__init__(layers=layers)
        #: the first layer that holds keys (a recurrent hybrid may start with a state layer): read per step
        self.first_kv_layer = next(layer for layer in layers if not isinstance(layer, StateLayer))
        self.graphs: dict = {}  # (batch, t, phase) -> CapturedStep bound to these buffers (static.phase)
        self.owner = None  # a weak reference to the CacheMaker that made it (its pool takes only its own)
        self.thawed_from: int | None = None  # the static base of the cache this one was thawed from
        self.query_window = None  # the recent queries of a policy with a QueryNeed (kdeval/keydiff/attention/queries.py)
        self.rerotated = False  # its keys sit at contiguous RoPE positions (kdeval/keydiff/attention/rerotation.py)
        self.kv_store = None  # a quantized store's record and bytes per layer (kdeval/keydiff/quant/store.py)

    @property
    def kv_layers(self) -> list:
        """The layers that hold keys and values (every layer but a recurrent one's states)."""
        return [layer for layer in self.layers if not isinstance(layer, StateLayer)]

    @property
    def state_layers(self) -> list[RecurrentStates]:
        """The layers that hold recurrent states (none on a model of attention layers only)."""
        return [layer for layer in self.layers if isinstance(layer, RecurrentStates)]

    @property
    def length(self) -> int:
        """Tokens held per KV head by the fullest layer (every layer's count under a uniform budget)."""
        if self.uniform:
            return self.first_kv_layer.length
        return max(layer.length for layer in self.layers)

    @property
    def lengths(self) -> list[list[int]]:
        """``lengths[l][r]``: tokens row ``r`` holds in layer ``l`` (eager layers)."""
        return [list(layer.lengths) for layer in self.layers]

    def begin_chunk(self, positions: torch.Tensor) -> None:
        """Set the absolute positions ``[t]`` of the chunk the next forward writes (every row the same)."""
        pos = positions.view(1, 1, -1)
        for layer in self.layers:
            layer.next_positions = pos

    def begin_step(self, bases: list[int], positions: torch.Tensor) -> None:
        """A ragged step: the next forward writes the cache positions ``[rows, 1, T]`` at ``bases[l]`` in layer
        ``l`` (kdeval/keydiff/cache/ragged.py)."""
        for layer, base in zip(self.layers, bases):
            layer.base, layer.next_positions = base, positions

    def keep_rows(self, rows: list[int]) -> None:
        """Drop every other row (finished requests), keeping the order of ``rows``: a row selection in place."""
        index = torch.tensor(rows, dtype=torch.long, device=self.first_kv_layer.keys.device)
        for layer in self.layers:
            if isinstance(layer, StateLayer):
                layer.keep_rows(index)
                continue
            if isinstance(layer, StateRowLayer):
                layer.keep_state_rows(index)
            layer.slot_buffers.select_rows(index)
            layer.lengths = [layer.lengths[r] for r in rows]
        if self.kv_store is not None:  # its record is keyed by row
            self.kv_store.keep_rows(rows)
        if self.query_window is not None:
            self.query_window = self.query_window.rows(index)

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
        layer = self.first_kv_layer
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

    def state_nbytes(self) -> int:
        """Bytes of the recurrent layers' states (constant in length; 0 on a model of attention layers only)."""
        return sum(layer.state_nbytes() for layer in self.state_layers)

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
