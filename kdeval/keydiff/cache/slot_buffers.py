"""The slot buffer every cache layout is built from: one layer's named buffers ``[rows, heads, slots, ...]``, and the
moves of slots within them (index tensors ``[rows, heads, k]``).

The uniform and per-layer caches (kdeval/keydiff/cache/budget_cache.py), the ragged batch's (kdeval/keydiff/cache/ragged.py) and the
head-shared pool (kdeval/keydiff/cache/headpool.py) differ in where a step writes and which slots eviction frees; they
allocate, grow, compact, select rows and count bytes here, one way. Each buffer has the value of an empty slot:
keys and values 0, positions ``position_fill`` (:data:`EMPTY_POSITION`, or 0 for a dynamic
slot layer), and each extra per-slot buffer its own (a policy's per-token state: 0; a pool's head tags: -1).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer



def expand_index(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``index [b, h, k]`` → ``[b, h, k, *like.shape[3:]]`` for gather/scatter along dim 2."""
    return index.view(*index.shape, *([1] * (like.dim() - 3))).expand(*index.shape, *like.shape[3:])


#: The position recorded for an empty slot of the static layout: sorts after every real position.
EMPTY_POSITION = 2**62


def resized(buf: torch.Tensor, capacity: int, keep: int, fill: int | float = 0) -> torch.Tensor:
    """A new buffer ``[rows, heads, capacity, ...]`` holding ``buf``'s first ``keep`` slots, the others ``fill``:
    how every slot buffer (uniform, per-layer, ragged, head pool) grows or is copied."""
    out = buf.new_full((*buf.shape[:2], capacity, *buf.shape[3:]), fill)
    out[:, :, :keep] = buf[:, :, :keep]
    return out


def kept_but(drop: torch.Tensor, m: int) -> torch.Tensor:
    """``[rows, h, m]`` bool: every slot kept but the freed ones, ``drop [rows, h, k]``."""
    return torch.ones(*drop.shape[:2], m, dtype=torch.bool, device=drop.device).scatter_(-1, drop, False)


def move_tail(buffers, slots: torch.Tensor, base: int) -> None:
    """Move the ``t`` tail slots ``[base, base + t)`` of every buffer ``[rows, h, slots, ...]`` into ``slots [t]``
    (empty head slots, below ``base``): what :func:`compact` does when the free slots are exactly those."""
    t = slots.shape[0]
    for buf in buffers:
        buf.index_copy_(2, slots, buf[:, :, base : base + t].clone())  # the clone: source and target share a buffer


def compact(buffers, kept: torch.Tensor, keep: torch.Tensor | int, width: int) -> None:
    """Move each row's kept slots (``kept [rows, h, m]``, True: kept; ``keep[r]`` of them, or ``keep`` in every
    row) into ``[0, keep[r])`` of every buffer ``[rows, h, slots, ...]``: each free slot below ``keep[r]`` (a hole)
    receives the lowest kept slot of ``[keep[r], m)`` not yet moved, at most ``width`` per row and head; an
    O(width) move, no gather of the whole cache. The one compaction of every arrangement: the eager rows
    (``width``: ``RaggedStep.movers``), the static layout (the chunk's ``t``) and the head pool."""
    m = kept.shape[-1]
    slot = torch.arange(m, device=kept.device)
    below = slot < (keep.view(-1, 1, 1) if isinstance(keep, torch.Tensor) else keep)
    holes = torch.where(below & ~kept, slot, m).topk(width, dim=-1, largest=False, sorted=True).values
    movers = torch.where(~below & kept, slot, m).topk(width, dim=-1, largest=False, sorted=True).values
    unused = holes == m  # as many holes as movers per row and head: unused entries copy slot m - 1 onto itself
    dst, src = holes.masked_fill(unused, m - 1), movers.masked_fill(unused, m - 1)
    for buf in buffers:
        moved = buf.gather(2, expand_index(src, buf))
        buf.scatter_(2, expand_index(dst, buf), moved)


def clear_past(keys: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, lo: int, m: int) -> None:
    """Make slots ``[keep[r], m)`` of every row clean (zero keys, empty positions): ``keys [rows, h, slots, d]``,
    ``positions [rows, h, slots]``; ``lo``: the smallest ``keep[r]`` (known on the host)."""
    if lo >= m:
        return
    past = (torch.arange(lo, m, device=keys.device).view(1, 1, -1) >= keep.view(-1, 1, 1))  # [rows, 1, m - lo]
    keys[:, :, lo:m].masked_fill_(past.unsqueeze(-1), 0)
    positions[:, :, lo:m].masked_fill_(past, EMPTY_POSITION)


def state_buffers(state_names: tuple[str, ...]) -> dict[str, tuple[torch.dtype, float]]:
    """The extra slot buffers of a policy's per-token state: float32, empty slots 0."""
    return {name: (torch.float32, 0.0) for name in state_names}


class SlotBuffers:
    """``keys [rows, heads, capacity, key_dim]``, ``values [rows, heads, capacity, value_dim]``, ``positions
    [rows, heads, capacity]`` (long) and the ``extra`` buffers ``[rows, heads, capacity]`` (name → (dtype, fill)).
    Before :meth:`allocate` only ``capacity`` is kept (and may be raised)."""

    def __init__(self, capacity: int, position_fill: int,
                 extra: dict[str, tuple[torch.dtype, int | float]] | None = None):
        self.capacity = capacity
        self.extra = dict(extra or {})
        self.fills: dict[str, int | float] = {"keys": 0, "values": 0, "positions": position_fill,
                                              **{name: fill for name, (_, fill) in self.extra.items()}}
        #: the buffers by name, in the order of ``fills`` (empty before allocation)
        self.tensors: dict[str, torch.Tensor] = {}

    @property
    def allocated(self) -> bool:
        return bool(self.tensors)

    def all(self) -> list[torch.Tensor]:
        return list(self.tensors.values())

    def allocate(self, rows: int, heads: int, key_dim: int, value_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """Empty buffers of ``capacity`` slots (keys and values in ``dtype``)."""
        cap, pos = self.capacity, self.fills["positions"]
        tensors = {"keys": torch.zeros(rows, heads, cap, key_dim, dtype=dtype, device=device),
                   "values": torch.zeros(rows, heads, cap, value_dim, dtype=dtype, device=device),
                   "positions": torch.full((rows, heads, cap), pos, dtype=torch.long, device=device)}
        for name, (dt, fill) in self.extra.items():
            tensors[name] = torch.full((rows, heads, cap), fill, dtype=dt, device=device)
        self.tensors = tensors

    def take(self, tensors: dict[str, torch.Tensor]) -> None:
        """Hold ``tensors`` (every name, ``[rows, heads, n, ...]``) as the buffers: ``n`` slots, all filled."""
        if set(tensors) != set(self.fills):
            raise ValueError(f"tensors: expected the buffers {list(self.fills)}, got {list(tensors)}")
        self.tensors = {name: tensors[name] for name in self.fills}
        self.capacity = tensors["keys"].shape[2]

    def grow(self, need: int, keep: int, exact: bool = False, limit: int | None = None) -> None:
        """At least ``need`` slots (``exact``: exactly ``need``; otherwise at least double, but not past ``limit``
        when given), keeping the first ``keep`` slots, the new ones empty; a no-op when there are ``need`` slots
        already."""
        if need <= self.capacity:
            return
        double = 2 * self.capacity if limit is None else min(2 * self.capacity, limit)
        cap = need if exact else max(need, double)
        if self.allocated:
            self.tensors = {name: resized(buf, cap, keep, self.fills[name]) for name, buf in self.tensors.items()}
        self.capacity = cap

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
              **extra: torch.Tensor) -> int:
        """Write ``t`` slots from ``start``: ``keys [rows, heads, t, key_dim]``, ``values``, ``positions`` (and the
        named ``extra`` buffers; the others are set empty), broadcast to ``[rows, heads, t]``; returns the end."""
        end = start + keys.shape[2]
        given = {"keys": keys, "values": values, "positions": positions, **extra}
        for name, buf in self.tensors.items():
            buf[:, :, start:end] = given.get(name, self.fills[name])
        return end

    def compact(self, kept: torch.Tensor, keep: torch.Tensor | int, width: int) -> None:
        """Move the kept slots ``kept [rows, heads, m]`` into ``[0, keep)`` (per row when ``keep`` is a tensor
        ``[rows]``), at most ``width`` moves per row and head (:func:`compact`)."""
        compact(self.all(), kept, keep, width)

    def move_tail(self, slots: torch.Tensor, base: int) -> None:
        """Move the tail slots ``[base, base + t)`` into ``slots [t]`` (:func:`move_tail`)."""
        move_tail(self.all(), slots, base)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep the rows ``index [k]``, in that order."""
        self.tensors = {name: buf.index_select(0, index) for name, buf in self.tensors.items()}

    def reset(self) -> None:
        """Every slot empty again, in place (the same buffers: graphs captured on them stay valid)."""
        for name, buf in self.tensors.items():
            buf.fill_(self.fills[name])

    def same_shapes(self, other: "SlotBuffers") -> bool:
        """Whether :meth:`copy_from` applies: the same buffers, shapes and dtypes."""
        return list(self.tensors) == list(other.tensors) and all(
            a.shape == b.shape and a.dtype == b.dtype for a, b in zip(self.all(), other.all()))

    def copy_from(self, other: "SlotBuffers") -> None:
        """Overwrite these buffers with ``other``'s, in place (same shapes)."""
        for mine, theirs in zip(self.all(), other.all()):
            mine.copy_(theirs)

    def nbytes(self) -> int:
        """Bytes of the key and value buffers, allocated (not just filled) slots; 0 before allocation."""
        return sum(self.tensors[n].numel() * self.tensors[n].element_size() for n in ("keys", "values")
                   if n in self.tensors)


class BufferedLayer(DynamicLayer):
    """A transformers cache layer whose tensors live in one :class:`SlotBuffers` (``slot_buffers``): ``keys``,
    ``values``, ``positions`` and the per-token ``state`` (the extra buffers named in ``state_names``) read it."""

    is_croppable = False

    def __init__(self, buffers: SlotBuffers, state_names: tuple[str, ...] = ()):
        self.slot_buffers = buffers
        self.state_names = tuple(state_names)
        DynamicLayer.__init__(self)

    @property
    def keys(self) -> torch.Tensor | None:
        return self.slot_buffers.tensors.get("keys")

    @keys.setter
    def keys(self, value: None) -> None:
        if value is not None:  # transformers' own layer init sets None; the buffers are written through slot_buffers
            raise AttributeError("keys: held by the layer's slot_buffers")

    @property
    def values(self) -> torch.Tensor | None:
        return self.slot_buffers.tensors.get("values")

    @values.setter
    def values(self, value: None) -> None:
        if value is not None:
            raise AttributeError("values: held by the layer's slot_buffers")

    @property
    def positions(self) -> torch.Tensor | None:
        return self.slot_buffers.tensors.get("positions")

    @property
    def state(self) -> dict[str, torch.Tensor]:
        tensors = self.slot_buffers.tensors
        return {name: tensors[name] for name in self.state_names if name in tensors}

    @property
    def capacity(self) -> int:
        return self.slot_buffers.capacity

    def allocate(self, rows: int, heads: int, key_dim: int, value_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """Empty buffers for ``rows`` rows and ``heads`` heads."""
        self.dtype, self.device, self.is_initialized = dtype, device, True
        self.slot_buffers.allocate(rows, heads, key_dim, value_dim, dtype, device)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.allocate(b, h, d, value_states.shape[-1], key_states.dtype, key_states.device)

    def buffers(self) -> list[torch.Tensor]:
        """Every buffer (keys, values, positions, extra ones)."""
        return self.slot_buffers.all()

    def nbytes(self) -> int:
        """Bytes of the key/value buffers (:meth:`SlotBuffers.nbytes`)."""
        return self.slot_buffers.nbytes()

    def held_nbytes(self) -> int:
        """Bytes of the key/value tensors the last forward held: the buffers, which a step never reallocates."""
        return self.nbytes()

    def get_max_length(self) -> int:
        return -1
