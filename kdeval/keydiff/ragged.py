"""A ragged step: a batch of independent requests, each row with its own length, positions and kept set.

The cache is the engine's one eager cache (:class:`~kdeval.keydiff.cache.RowLayer`), ``[rows, kv_heads, slots,
...]``. Row ``r``'s kept tokens fill slots ``[0, n_r)`` (``n_r``: its own length, known on the host). A step feeds ``T`` columns per row, *left-padded*: row ``r``'s
``t_r`` real tokens are the step's last ``t_r`` columns and its first ``T - t_r`` columns are padding. Every
row writes the step's ``T`` columns to the same tail slots ``[base, base + T)``, ``base = max_r n_r``, so the
write is one slice, as in the slot store, and slots ``[n_r, base)`` of a shorter row are empty.

Why the padding goes on the left of a step: the model then returns every row's next-token logits from the
step's last column (``logits_to_keep=1``), whatever the rows' lengths; right padding would need the logits
of every column, or of a different column per row.

Padding never takes budget and is never seen: the step's mask (:meth:`RaggedStep.mask`) lets a real query
see its row's ``n_r`` cached slots and its row's real tail slots up to its own (causal), and a padding query
only its own slot (so its softmax row is finite and its attention never lands on a real token); eviction
(:func:`compact_rows`) ranks the empty and padding slots below every real token and frees them first, so each
row keeps ``keep_r`` real tokens in ``[0, keep_r)``. Between steps every slot at or past a row's length is
*clean*: zero key, the empty position (:data:`EMPTY_POSITION`, which sorts after every real position). Zero
keys leave KeyDiff's anchor unchanged (the sum of unit keys, or of raw keys, gains nothing), and empty
positions keep position-ordered pooling (SnapKV) as at batch 1; other scores of those slots are overridden.
"""
from __future__ import annotations

import torch

from kdeval.keydiff.slot_moves import EMPTY_POSITION, expand_index


class RaggedStep:
    """The geometry of one step of a ragged batch in the layers whose rows hold the same counts (every layer
    under a uniform budget; per-layer budgets make one geometry per distinct budget).

    Row ``r`` holds ``n[r]`` tokens, feeds ``t[r]`` (``1 <= t[r] <= T``) and keeps ``keep[r]`` afterwards;
    ``seen[r]``: its tokens processed before the step. Tensors ``[rows]`` are on ``device``. ``rerotate``: the
    model positions start after each row's ``n[r]`` cached tokens instead of ``seen[r]`` (a policy that
    re-rotates its kept keys, kdeval/keydiff/rerotation.py); the cache positions stay absolute.
    """

    def __init__(self, n: list[int], t: list[int], keep: list[int], seen: list[int], device: torch.device,
                 rerotate: bool = False):
        self.rows = len(n)
        self.base, self.T = max(n), max(t)
        self.M = self.base + self.T
        self.host_n, self.host_t, self.host_keep = n, t, keep
        as_t = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        self.n, self.t, self.keep = as_t(n), as_t(t), as_t(keep)
        self.slots = torch.arange(self.M, device=device)
        first = (self.base + self.T - self.t).view(-1, 1)  # [rows, 1]: a row's first real tail slot
        self.pad = (self.slots >= self.base) & (self.slots < first)  # [rows, M]
        self.valid = (self.slots < self.n.view(-1, 1)) | (self.slots >= first)  # [rows, M]
        #: real tokens dropped by some row: eviction must score
        self.drops = any(k < a + b for k, a, b in zip(keep, n, t))
        #: every row fills the whole step after a full-length head and keeps everything: nothing moves
        self.in_place = all(a == self.base for a in n) and min(t) == self.T and not self.drops
        #: the most kept slots at or past a row's ``keep[r]`` (they move down): its real tail tokens, plus any
        #: cached ones past ``keep[r]`` (a state holding more than this engine keeps)
        self.movers = min(self.M, max(max(a - k, 0) + b for a, b, k in zip(n, t, keep)))
        col = torch.arange(self.T, device=device)
        offset = col.view(1, -1) - (self.T - self.t).view(-1, 1)  # [rows, T]: < 0 on padding
        seen_t = as_t(seen).view(-1, 1)
        #: model positions ``[rows, T]`` (padding: the row's next position, never cached)
        self.position_ids = (self.n.view(-1, 1) if rerotate else seen_t) + offset.clamp(min=0)
        #: cache positions ``[rows, 1, T]`` (padding: EMPTY_POSITION)
        self.cache_positions = torch.where(offset >= 0, seen_t + offset, EMPTY_POSITION).unsqueeze(1)
        #: tokens seen after the step, ``[rows, 1, 1]`` (what ``ScoreContext.seen`` is in a ragged batch)
        self.seen_after = (seen_t + self.t.view(-1, 1)).view(-1, 1, 1)

    def mask(self) -> torch.Tensor:
        """``[rows, 1, T, M]`` (True: visible): a real query sees its row's cached slots ``[0, n_r)`` and its
        row's real tail slots up to its own; a padding query sees only its own slot."""
        tail = (self.slots - self.base).view(1, 1, -1)  # [1, 1, M]
        col = torch.arange(self.T, device=self.slots.device).view(1, -1, 1)  # [1, T, 1]
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


def compact_rows(buffers, kept: torch.Tensor, keep: torch.Tensor, width: int) -> None:
    """Move each row's kept slots (``kept [rows, h, m]``, ``keep[r]`` of them) into ``[0, keep[r])`` of every
    buffer ``[rows, h, slots, ...]``: each free slot below ``keep[r]`` (a hole) receives one kept slot from
    ``[keep[r], m)``, at most ``width`` per row and head (``RaggedStep.movers``); an O(width) move."""
    m = kept.shape[-1]
    slot = torch.arange(m, device=kept.device)
    below = slot < keep.view(-1, 1, 1)
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
