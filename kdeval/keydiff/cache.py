"""Budgeted KV caches the engine evicts from, plugged into transformers as a ``Cache``.

Both stores keep, per layer, the cached ``keys``/``values`` ``[batch, kv_heads, tokens, head_dim]``, the
absolute ``positions`` ``[batch, kv_heads, tokens]`` of those tokens and any per-token policy state. During a
chunk's forward the chunk's ``t`` tokens are appended after the ``n`` cached ones, so the valid tokens are always
slots ``[0, n + t)`` with the chunk last: the causal mask transformers builds from the cache length (all of the
cache, causal within the chunk) is therefore right, whatever order the older tokens sit in.

- :class:`SlotLayer` (``store="slot"``, default): one buffer of ``budget + chunk`` slots allocated once and
  written in place. Eviction of ``k`` tokens moves the chunk's surviving tokens into the ``k`` freed slots among
  the first ``budget`` (an O(k) copy, no gather of the whole cache), so slot order is not position order.
- The slot store's *static* layout (``static_base=N``, used by the captured CUDA-graph step): every chunk of
  ``t`` tokens is written to the tail slots ``[N, N + t)`` and attention, scoring and eviction always see all
  ``N + t`` slots, so every full chunk has the same shapes from the first chunk on. While fewer than ``N``
  tokens are cached, slots ``[length, N)`` are empty (zero keys, a sentinel position); the engine masks them out
  of attention and evicts them first, lowest slot first, so the valid tokens stay in ``[0, length)`` with
  ``length = min(tokens seen, N)``.
- :class:`GatherLayer` (``store="gather"``): transformers' growing ``DynamicLayer``; eviction gathers the kept
  tokens into new tensors in position order. Simple, and the reference the slot store is checked against.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


def _expand(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``index [b, h, k]`` → ``[b, h, k, *like.shape[3:]]`` for gather/scatter along dim 2."""
    return index.view(*index.shape, *([1] * (like.dim() - 3))).expand(*index.shape, *like.shape[3:])


class _BudgetLayerMixin:
    """Bookkeeping shared by both stores: committed length, pending chunk, positions and policy state."""

    length: int
    pending: int

    def _init_budget(self, state_names: tuple[str, ...]) -> None:
        self.length = 0
        self.pending = 0
        self.state_names = state_names
        self.next_positions: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


#: The position recorded for an empty slot of the static layout: sorts after every real position.
EMPTY_POSITION = 2**62


def static_visible(row, slot, cached, budget: int):
    """The static layout's attention rule: query ``row`` of the chunk sees ``slot`` when it is one of the
    ``cached`` valid head slots ``[0, cached)``, or a tail slot ``[budget, budget + t)`` at or before its own.
    Broadcasts over tensors (the dense mask) and works on FlexAttention's scalar indices (its ``mask_mod``)."""
    return (slot < cached) | ((slot >= budget) & (slot - budget <= row))


class EmptySlots:
    """Static layout: the empty head slots ``[cached, budget)`` of the ``budget + t`` slots a step scores get
    distinct scores below every real score, lowest slot lowest, so eviction frees them first and in slot order
    (the chunk then moves into ``[cached, cached + t)`` in every layer and head: the valid slots stay a prefix).

    Which slots are empty is the same for every layer: computed once per step. The ranks depend only on the
    shape: ``ranks`` (a dict the engine keeps) caches them per (slots, dtype, device).

    ``room``: the host knows that the empty slots hold the whole chunk (``cached + t <= budget``). Eviction
    would then free exactly ``[cached, cached + t)``, so the engine skips scoring and moves the chunk there
    (:func:`move_tail`); ``room_slots`` ``[t]`` are those slots.
    """

    def __init__(self, budget: int, t: int, cached: int | torch.Tensor, device: torch.device,
                 ranks: dict | None = None, room: bool = False):
        self.budget = budget
        self.slots = torch.arange(budget + t, device=device)
        self.ranks = {} if ranks is None else ranks
        self.room_slots = self.slots[:t] + cached if room else None
        self.mask = None if room else (self.slots >= cached) & (self.slots < budget)  # [budget + t]

    def ranked(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores [rows, h, budget + t]`` with the empty slots' ranks in."""
        if scores.dtype not in (torch.float32, torch.float64):
            scores = scores.float()  # the ranks need float32's range and precision
        key = (scores.shape[-1], scores.dtype, scores.device)
        if key not in self.ranks:  # -2e30 at slot 0 rising to -1e30 at slot budget
            self.ranks[key] = -1e30 * (2.0 - self.slots.to(scores.dtype) / self.budget)
        return torch.where(self.mask, self.ranks[key], scores)


def move_tail(buffers, slots: torch.Tensor, base: int) -> None:
    """Move the ``t`` tail slots ``[base, base + t)`` of every buffer ``[rows, h, slots, ...]`` into ``slots [t]``
    (empty head slots, below ``base``): what :func:`compact` does when the dropped slots are exactly those."""
    t = slots.shape[0]
    for buf in buffers:
        buf.index_copy_(2, slots, buf[:, :, base : base + t].clone())  # the clone: source and target share a buffer


def compact(buffers, drop: torch.Tensor, keep_n: int) -> None:
    """Free the slots ``drop [rows, h, k]`` of every buffer ``[rows, h, slots, ...]`` so that the kept tokens
    fill ``[0, keep_n)``: each dropped slot below ``keep_n`` (a hole) receives one surviving token from the
    tail ``[keep_n, keep_n + k)``; an O(k) move, no gather of the whole cache."""
    k = drop.shape[-1]
    dst = drop.sort(dim=-1).values  # holes first (< keep_n), then dropped tail slots
    in_tail = dst >= keep_n
    n_holes = (~in_tail).sum(dim=-1, keepdim=True)
    tail_dropped = torch.zeros_like(dst).scatter_add_(-1, (dst - keep_n).clamp(min=0), in_tail.long())
    movers = keep_n + torch.argsort(tail_dropped.clamp(max=1), dim=-1, stable=True)  # survivors first
    slot = torch.arange(k, device=dst.device)
    src = torch.where(slot < n_holes, movers, dst)  # past the holes: copy a dropped tail slot onto itself
    for buf in buffers:
        moved = buf.gather(2, _expand(src, buf))
        buf.scatter_(2, _expand(dst, buf), moved)


class SlotLayer(_BudgetLayerMixin, DynamicLayer):
    """A fixed buffer of ``capacity`` slots (grown only for the full cache), written in place.

    ``static_base`` N selects the static layout (module docstring): chunks land in ``[N, N + t)``.
    """

    is_croppable = False

    def __init__(self, capacity: int, state_names: tuple[str, ...] = (), static_base: int | None = None,
                 allocate=None):
        """``allocate(key_states, value_states)``: where the buffers come from (the cache's layer-fused
        buffers); by default this layer allocates its own."""
        DynamicLayer.__init__(self)
        self.capacity = capacity
        self.static_base = static_base
        self.allocate = allocate
        self._init_budget(state_names)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        dev = key_states.device
        self.dtype, self.device = key_states.dtype, dev
        self.is_initialized = True
        if self.allocate is not None:
            self.keys, self.values, self.positions, self.state = self.allocate(key_states, value_states)
            return
        self.keys = torch.zeros(b, h, self.capacity, d, dtype=key_states.dtype, device=dev)
        self.values = torch.zeros(b, h, self.capacity, value_states.shape[-1], dtype=value_states.dtype, device=dev)
        fill = EMPTY_POSITION if self.static_base is not None else 0
        self.positions = torch.full((b, h, self.capacity), fill, dtype=torch.long, device=dev)
        self.state = {n: torch.zeros(b, h, self.capacity, dtype=torch.float32, device=dev) for n in self.state_names}

    def _grow(self, need: int) -> None:
        new_cap = max(need, 2 * self.capacity)

        def grown(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(*t.shape[:2], new_cap, *t.shape[3:])
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.keys, self.values, self.positions = grown(self.keys), grown(self.values), grown(self.positions)
        self.state = {n: grown(s) for n, s in self.state.items()}
        self.capacity = new_cap

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[2]
        start = self.length if self.static_base is None else self.static_base
        end = start + t
        if end > self.capacity:
            self._grow(end)
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.positions[:, :, start:end] = self.next_positions
        for s in self.state.values():
            s[:, :, start:end] = 0.0
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

    def commit_into(self, slots: torch.Tensor) -> None:
        """Static layout, with room for the whole chunk: move it from the tail into the empty ``slots [t]``."""
        move_tail((self.keys, self.values, self.positions, *self.state.values()), slots, self.static_base)
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
        compact((self.keys, self.values, self.positions, *self.state.values()), drop, keep_n)
        if self.static_base is None:
            self.length = keep_n


class GatherLayer(_BudgetLayerMixin, DynamicLayer):
    """transformers' growing layer; eviction gathers the kept tokens (position order) into new tensors."""

    def __init__(self, state_names: tuple[str, ...] = ()):
        DynamicLayer.__init__(self)
        self._init_budget(state_names)
        self.positions: torch.Tensor | None = None
        self.state: dict[str, torch.Tensor] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = DynamicLayer.update(self, key_states, value_states)
        b, h, t = key_states.shape[:3]
        new_pos = self.next_positions.expand(b, h, t)
        self.positions = new_pos.clone() if self.positions is None else torch.cat([self.positions, new_pos], dim=2)
        zeros = torch.zeros(b, h, t, dtype=torch.float32, device=key_states.device)
        self.state = {n: torch.cat([self.state[n], zeros], 2) if n in self.state else zeros.clone() for n in self.state_names}
        self.pending = t
        return keys, values

    def view(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        return self.keys, self.positions, self.state

    def evict(self, drop: torch.Tensor | None) -> None:
        m = self.length + self.pending
        self.pending = 0
        if drop is None or drop.shape[-1] == 0:
            self.length = m
            return
        b, h = drop.shape[:2]
        keep_mask = torch.ones(b, h, m, dtype=torch.bool, device=drop.device).scatter_(-1, drop, False)
        keep = keep_mask.nonzero()[:, -1].view(b, h, m - drop.shape[-1])  # row-major: ascending slots
        self.keys = self.keys.gather(2, _expand(keep, self.keys))
        self.values = self.values.gather(2, _expand(keep, self.values))
        self.positions = self.positions.gather(2, keep)
        self.state = {n: s.gather(2, keep) for n, s in self.state.items()}
        self.length = keep.shape[-1]


class BudgetCache(Cache):
    """A transformers ``Cache`` of :class:`SlotLayer` or :class:`GatherLayer`, one per decoder layer."""

    def __init__(self, num_layers: int, store: str, capacity: int, state_names: tuple[str, ...] = (),
                 static_base: int | None = None, fused: bool = False):
        """``fused``: the static layout's layers share buffers ``[layers * batch, kv_heads, slots, ...]`` (layer
        ``i`` owns rows ``[i * batch, (i + 1) * batch)``), so eviction can treat all layers as one batch."""
        if static_base is not None and store != "slot":
            raise ValueError("static_base: only the slot store has a static layout")
        if fused and static_base is None:
            raise ValueError("fused: layer-fused buffers need the static layout")
        self.static_base = static_base
        self.state_names = tuple(state_names)
        self.fused: dict[str, torch.Tensor] | None = None  # the shared buffers, once allocated
        self._fused_specs = (num_layers, capacity, state_names) if fused else None
        if store == "slot":
            layers = [SlotLayer(capacity, state_names, static_base, self._fused_view(i) if fused else None)
                      for i in range(num_layers)]
        elif store == "gather":
            layers = [GatherLayer(state_names) for _ in range(num_layers)]
        else:
            raise ValueError(f"store: expected 'slot' or 'gather', got {store!r}")
        super().__init__(layers=layers)
        self.store = store
        self.graphs: dict = {}  # (batch, t, phase) -> CapturedStep bound to these buffers (Engine.phase)
        self.owner = None  # a weak reference to the engine that made this cache (its pool takes only its own)

    @property
    def length(self) -> int:
        return self.layers[0].length

    def _fused_view(self, idx: int):
        def allocate(key_states: torch.Tensor, value_states: torch.Tensor):
            num_layers, cap, state_names = self._fused_specs
            b, h, _, d = key_states.shape
            dev = key_states.device
            if self.fused is None:
                rows = num_layers * b
                self.fused = {
                    "keys": torch.zeros(rows, h, cap, d, dtype=key_states.dtype, device=dev),
                    "values": torch.zeros(rows, h, cap, value_states.shape[-1], dtype=value_states.dtype, device=dev),
                    "positions": torch.full((rows, h, cap), EMPTY_POSITION, dtype=torch.long, device=dev),
                    **{f"state.{n}": torch.zeros(rows, h, cap, dtype=torch.float32, device=dev) for n in state_names},
                }
            keys = self.fused["keys"]
            if keys.shape[0] != num_layers * b or keys.shape[1] != h or keys.shape[3] != d:
                raise ValueError("fused: every layer must have the same batch, KV heads and head size")
            mine = {name: buf[idx * b : (idx + 1) * b] for name, buf in self.fused.items()}
            state = {n: mine[f"state.{n}"] for n in state_names}
            return mine["keys"], mine["values"], mine["positions"], state

        return allocate

    def begin_chunk(self, positions: torch.Tensor) -> None:
        """Set the absolute positions ``[t]`` of the chunk the next forward writes."""
        pos = positions.view(1, 1, -1)
        for layer in self.layers:
            layer.next_positions = pos

    def _buffers(self) -> list[torch.Tensor]:
        if self.fused is not None:
            return list(self.fused.values())
        return [b for l in self.layers for b in (l.keys, l.values, l.positions, *l.state.values())]

    def can_copy_from(self, other: "BudgetCache") -> bool:
        """Whether :meth:`copy_from` applies: both static-layout caches with buffers of the same shapes."""
        if self.static_base is None or other.static_base != self.static_base or other is self:
            return False
        if (self.fused is None) != (other.fused is None):
            return False
        if not all(l.is_initialized for l in (*self.layers, *other.layers)):
            return False
        mine, theirs = self._buffers(), other._buffers()
        return len(mine) == len(theirs) and all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(mine, theirs))

    def copy_from(self, other: "BudgetCache") -> None:
        """Overwrite this static cache's buffers and bookkeeping with ``other``'s, in place (same addresses,
        so graphs captured on this cache stay valid)."""
        for mine, theirs in zip(self._buffers(), other._buffers()):
            mine.copy_(theirs)
        for mine, theirs in zip(self.layers, other.layers):
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
            for buf in self._buffers():
                buf.zero_()
            for buf in [self.fused["positions"]] if self.fused is not None else [l.positions for l in self.layers]:
                buf.fill_(EMPTY_POSITION)
        for layer in self.layers:
            layer.length, layer.pending, layer.next_positions = 0, 0, None

    def advance_static(self, t: int) -> None:
        """Host-side bookkeeping of a static step of ``t`` tokens once its chunk is committed (what ``evict``
        does per layer): a replayed graph, or the layer-fused eviction."""
        for layer in self.layers:
            layer.pending = 0
            layer.length = min(layer.length + t, self.static_base)

    def nbytes(self) -> int:
        """Bytes held by the key/value tensors (allocated buffers, not just valid slots)."""
        return sum(l.keys.numel() * l.keys.element_size() * 2 for l in self.layers if l.is_initialized)
