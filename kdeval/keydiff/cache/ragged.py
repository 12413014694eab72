"""A step's geometry on the eager cache: each row with its own length, positions and kept set (a request alone is
one row; a batch of independent requests is ragged).

The cache is the engine's one eager cache (:class:`~kdeval.keydiff.cache.budget_cache.RowLayer`), ``[rows, kv_heads, slots,
...]``. Row ``r``'s kept tokens fill slots ``[0, n_r)`` (``n_r``: its own length, known on the host). A step feeds
``T`` columns per row, *left-padded*: row ``r``'s ``t_r`` real tokens are the step's last ``t_r`` columns and its
first ``T - t_r`` columns are padding. Every row writes the step's ``T`` columns to the same tail slots ``[base,
base + T)``, ``base = max_r n_r``, so the write is one slice, as in the slot store, and slots ``[n_r, base)`` of a
shorter row are empty.

Why the padding goes on the left of a step: the model then returns every row's next-token logits from the step's
last column (``logits_to_keep=1``), whatever the rows' lengths; right padding would need the logits of every column,
or of a different column per row.

Padding never takes budget and is never seen: the step's mask (:meth:`RaggedStep.mask`) lets a real query see its
row's ``n_r`` cached slots and its row's real tail slots up to its own (causal), and a padding query only its own
slot (so its softmax row is finite and its attention never lands on a real token); eviction ranks the empty and
padding slots below every real token and frees them first, so each row keeps ``keep_r`` real tokens, moved into
``[0, keep_r)`` (:func:`~kdeval.keydiff.cache.slot_buffers.compact`). Between steps every slot at or past a row's length
is *clean*: zero key, the empty position (:data:`EMPTY_POSITION`, which sorts after every real position). Zero keys
leave KeyDiff's anchor unchanged (the sum of unit keys, or of raw keys, gains nothing), and empty positions keep
position-ordered pooling (SnapKV) as at batch 1; other scores of those slots are overridden.
"""
from __future__ import annotations

from functools import cached_property

import torch

from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION


class RaggedStep:
    """The geometry of one step of a batch in the layers whose rows hold the same counts (every layer under a
    uniform budget; per-layer budgets and windowed layers make one geometry per distinct count).

    Row ``r`` holds ``n[r]`` tokens, feeds ``t[r]`` (``1 <= t[r] <= T``) and keeps ``keep[r]`` afterwards;
    ``seen[r]``: its tokens processed before the step. ``rerotate``: the model positions start after each row's
    ``n[r]`` cached tokens instead of ``seen[r]`` (a policy that re-rotates its kept keys,
    kdeval/keydiff/attention/rerotation.py); the cache positions stay absolute. The host's lists decide everything the
    step does; the tensors ``[rows, ...]`` on ``device`` are made when first read (a step whose rows share their
    positions, a request alone, reads few of them).
    """

    def __init__(self, n: list[int], t: list[int], keep: list[int], seen: list[int], device: torch.device,
                 rerotate: bool = False):
        self.rows = len(n)
        self.base, self.T = max(n), max(t)
        self.M = self.base + self.T
        self.host_n, self.host_t, self.host_keep, self.host_seen = n, t, keep, seen
        self.device, self.rerotate = device, rerotate
        #: real tokens dropped by some row: eviction must score
        self.drops = any(k < a + b for k, a, b in zip(keep, n, t))
        #: every row fills the whole step after a full-length head and keeps everything: nothing moves
        self.in_place = all(a == self.base for a in n) and min(t) == self.T and not self.drops
        #: the most kept slots at or past a row's ``keep[r]`` (they move down): its real tail tokens, plus any
        #: cached ones past ``keep[r]`` (a state holding more than this engine keeps)
        self.movers = min(self.M, max(max(a - k, 0) + b for a, b, k in zip(n, t, keep)))

    def _long(self, xs: list[int]) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.long, device=self.device)

    @cached_property
    def n(self) -> torch.Tensor:
        return self._long(self.host_n)

    @cached_property
    def t(self) -> torch.Tensor:
        return self._long(self.host_t)

    @cached_property
    def keep(self) -> torch.Tensor:
        return self._long(self.host_keep)

    @cached_property
    def seen(self) -> torch.Tensor:
        """``[rows, 1]``: each row's tokens processed before the step."""
        return self._long(self.host_seen).view(-1, 1)

    @cached_property
    def slots(self) -> torch.Tensor:
        return torch.arange(self.M, device=self.device)

    @cached_property
    def _first(self) -> torch.Tensor:
        """``[rows, 1]``: each row's first real tail slot."""
        return (self.base + self.T - self.t).view(-1, 1)

    @cached_property
    def pad(self) -> torch.Tensor:
        """``[rows, M]``: the step's padding slots."""
        return (self.slots >= self.base) & (self.slots < self._first)

    @cached_property
    def valid(self) -> torch.Tensor:
        """``[rows, M]``: the slots that hold a real token (cached or fed)."""
        return (self.slots < self.n.view(-1, 1)) | (self.slots >= self._first)

    @cached_property
    def _offset(self) -> torch.Tensor:
        """``[rows, T]``: each column's index among its row's real tokens (< 0 on padding)."""
        col = torch.arange(self.T, device=self.device)
        return col.view(1, -1) - (self.T - self.t).view(-1, 1)

    @cached_property
    def position_ids(self) -> torch.Tensor:
        """Model positions ``[rows, T]`` (padding: the row's next position, never cached)."""
        start = self.n.view(-1, 1) if self.rerotate else self.seen
        return start + self._offset.clamp(min=0)

    @cached_property
    def cache_positions(self) -> torch.Tensor:
        """Cache positions ``[rows, 1, T]`` (padding: EMPTY_POSITION)."""
        return torch.where(self._offset >= 0, self.seen + self._offset, EMPTY_POSITION).unsqueeze(1)

    @cached_property
    def seen_after(self) -> torch.Tensor:
        """Tokens seen after the step, ``[rows, 1, 1]`` (what ``ScoreContext.seen`` is in a ragged batch)."""
        return (self.seen + self.t.view(-1, 1)).view(-1, 1, 1)

    def mask(self) -> torch.Tensor:
        """``[rows, 1, T, M]`` (True: visible): a real query sees its row's cached slots ``[0, n_r)`` and its
        row's real tail slots up to its own; a padding query sees only its own slot."""
        tail = (self.slots - self.base).view(1, 1, -1)  # [1, 1, M]
        col = torch.arange(self.T, device=self.device).view(1, -1, 1)  # [1, T, 1]
        first = (self.T - self.t).view(-1, 1, 1)  # [rows, 1, 1]: first real column
        head = (self.slots.view(1, 1, -1) < self.n.view(-1, 1, 1))
        causal = (tail >= first) & (tail <= col)
        real = col >= first  # [rows, T, 1]
        return torch.where(real, head | causal, tail == col).unsqueeze(1)


def kept_mask(order: torch.Tensor, drop: torch.Tensor, m: int) -> torch.Tensor:
    """``order [rows, h, k]`` slots, lowest first; ``drop [rows, 1, 1]`` how many of them each row frees →
    ``[rows, h, m]`` True where a slot is kept."""
    k = order.shape[-1]
    freed = (torch.arange(k, device=order.device).view(1, 1, -1) < drop).expand_as(order)
    out = torch.ones(*order.shape[:2], m, dtype=torch.bool, device=order.device)
    return out.scatter_(-1, order, ~freed)
