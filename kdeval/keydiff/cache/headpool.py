"""A KV cache whose layers share one pool of slots among their KV heads (head-adaptive budgets, AdaKV).

Under a uniform budget every KV head of a layer keeps ``N`` tokens, in its own ``N + B`` slots. A policy that
``shares_heads`` (``PolicyNeeds.shares_heads``) lets a layer's ``H`` KV heads share ``H * N`` kept tokens by
score, so one head may keep many more than ``N`` and another fewer. Giving every head room for ``H * N`` would
cost ``H`` times the memory; here each layer instead has one pool of ``H * (N + B)`` slots per batch row,
exactly the uniform cache's bytes:

- ``keys``/``values`` ``[batch, 1, P, head_dim]``, ``positions`` ``[batch, 1, P]`` (absolute), ``tags``
  ``[batch, 1, P]`` (the KV head a slot belongs to). The filled slots are a prefix ``[0, slots)``; a chunk of
  ``t`` tokens writes its ``H * t`` keys after it, head-major (head 0's ``t`` tokens first).
- Attention (:func:`pool_attention_forward`, implementation ``kdeval_pool``) sees the prefix as one key head
  ``[batch, 1, M, head_dim]`` under a mask ``[batch, q_heads, t, M]``: a slot is visible to a query head when
  its tag is that query head's KV head and its position is at or before the query's. The trade-off: every
  query head scores all ``M`` slots, ``H`` times the attention compute of the per-head layout, for the same
  memory (the per-head layout with room for adaptive budgets costs ``H`` times the memory instead).
- Eviction (the pool adapter of kdeval/keydiff/cache/layouts.py) gathers each head's filled slots in position order
  into a padded ``[b, H, L]`` layout (:class:`HeadTokens`; padding: zero keys, the empty position, no
  attention), scores them with the policy as any per-head score, raises the protected tokens as every layout
  does, and :func:`select_across_heads` keeps the best ``H * N`` of the row across its heads (each head's
  ``safeguard`` best always; equal scores evicted oldest position first, then lower head first; padding never
  kept); :meth:`HeadPoolLayer.commit` compacts them into ``[0, H * N)``, moved in place (an O(evicted) move:
  slot order is then not position order).

``length`` is the tokens per KV head on average (``slots / H``; the pool always holds a multiple of ``H``), the
figure the engine's counters and bounds read for every cache.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from kdeval.keydiff.attention.capture import POOL_IMPL, AttentionCapture
from kdeval.keydiff.attention.functions import no_mask
from kdeval.keydiff.cache.budget_cache import BudgetCache, BudgetLayerMixin
from kdeval.keydiff.policy.selection import lowest_oldest_first
from kdeval.keydiff.cache.slot_buffers import EMPTY_POSITION, BufferedLayer, SlotBuffers, expand_index


class HeadPoolLayer(BudgetLayerMixin, BufferedLayer):
    """One decoder layer's pool: ``capacity`` slots per KV head, shared by all of them (module docstring); its slot
    buffers are ``[b, 1, H * capacity, ...]``, with the head ``tags``."""

    def __init__(self, capacity: int):
        BufferedLayer.__init__(self, SlotBuffers(0, EMPTY_POSITION, {"tags": (torch.long, -1)}))
        self.head_capacity = capacity
        self.heads = 0
        self._init_budget()

    @property
    def capacity(self) -> int:
        """Slots per KV head."""
        return self.head_capacity

    @property
    def tags(self) -> torch.Tensor:
        """``[b, 1, slots]``: the KV head each slot belongs to (-1: empty)."""
        return self.slot_buffers.tensors["tags"]

    @property
    def slots(self) -> int:
        """Filled slots (all heads): ``heads * length``."""
        return self.heads * self.length

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.heads = h
        self.slot_buffers.capacity = h * self.head_capacity
        self.allocate(b, 1, d, value_states.shape[-1], key_states.dtype, key_states.device)

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` tokens per KV head at once (no-op when there is)."""
        if capacity <= self.head_capacity:
            return
        if self.is_initialized:
            self.slot_buffers.grow(self.heads * capacity, self.slots, exact=True)
        self.head_capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the chunk ``[b, H, t, d]`` head-major after the filled slots; return the filled keys and values
        ``[b, 1, slots + H * t, d]``."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, t, d = key_states.shape
        self.reserve(self.length + t)
        m = self.slot_buffers.write(self.slots, key_states.reshape(b, 1, h * t, d),
                                    value_states.reshape(b, 1, h * t, -1),
                                    self.next_positions.reshape(1, t).repeat(1, h).view(1, 1, -1),
                                    tags=torch.arange(h, device=self.device).repeat_interleave(t).view(1, 1, -1))
        self.pending = t
        return self.keys[:, :, :m], self.values[:, :, :m]

    def filled(self) -> int:
        """Slots attention and eviction see during a step: the kept ones plus the pending chunk's."""
        return self.heads * (self.length + self.pending)

    def view(self) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The filled slots: keys ``[b, 1, slots + pending, d]``, positions ``[b, 1, ...]``, no per-token state
        (``tags[:, :, :m]`` says whose each slot is)."""
        m = self.filled()
        return self.keys[:, :, :m], self.positions[:, :, :m], {}

    def head_counts(self) -> torch.Tensor:
        """Tokens each KV head holds: ``[b, H]``."""
        tags = self.tags[:, 0, : self.filled()]
        return torch.stack([(tags == h).sum(dim=-1) for h in range(self.heads)], dim=-1)

    def mask(self, q_heads: int) -> torch.Tensor:
        """``[b, q_heads, t, M]`` (True: visible) for the pending chunk's queries over the filled slots."""
        m = self.filled()
        tags, positions = self.tags[:, 0, :m], self.positions[:, 0, :m]
        owner = torch.arange(q_heads, device=tags.device) // (q_heads // self.heads)
        query_pos = self.next_positions.reshape(-1)
        return ((tags[:, None, None, :] == owner[None, :, None, None])
                & (positions[:, None, None, :] <= query_pos[None, None, :, None]))

    def commit(self, kept: torch.Tensor | None) -> None:
        """End the step: keep every filled slot (``None``), or only the slots ``kept [b, K]`` (each row the same
        number ``K``, a multiple of ``H``, in (head, position) order), compacted into ``[0, K)``."""
        m = self.filled()
        self.pending = 0
        if kept is None:
            self.length = m // self.heads
            return
        b, k = kept.shape
        if k < m:
            keep = torch.zeros(b, 1, m, dtype=torch.bool, device=kept.device).scatter_(2, kept.unsqueeze(1), True)
            self.slot_buffers.compact(keep, k, min(k, m - k))
        self.length = k // self.heads


class HeadPoolCache(BudgetCache):
    """A :class:`BudgetCache` of :class:`HeadPoolLayer` (``capacity``: slots per KV head), which the engine evicts
    through its pool adapter (kdeval/keydiff/cache/layouts.py)."""


def pool_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """``query [b, hq, t, d]`` over the pool's filled slots ``key``/``value [b, 1, M, d]`` under the layer's
    head mask (:meth:`HeadPoolLayer.mask`); returns ``[b, t, hq, d]``. A ``kdeval_capture`` gets the rows it
    asks for under the same mask, ``[b, H, group, M]`` (the query heads of each KV head), summed over rows."""
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    layer: HeadPoolLayer = kwargs.pop("kdeval_pool").layers[module.layer_idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    b, hq, t, _ = query.shape
    mask = layer.mask(hq)
    out = torch.nn.functional.scaled_dot_product_attention(query, key.expand(b, hq, *key.shape[2:]),
                                                           value.expand(b, hq, *value.shape[2:]),
                                                           attn_mask=mask, scale=scale)
    if capture is not None:
        w = capture.need.rows(t)
        dt = torch.promote_types(query.dtype, torch.float32)
        logits = torch.matmul(query[:, :, t - w :].to(dt), key.to(dt).transpose(-1, -2)) * scale  # [b, hq, w, M]
        probs = torch.softmax(logits.masked_fill(~mask[:, :, t - w :], float("-inf")), dim=-1)
        capture.by_layer[module.layer_idx] = probs.sum(dim=2).view(b, layer.heads, hq // layer.heads, -1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(POOL_IMPL, pool_attention_forward)
AttentionMaskInterface.register(POOL_IMPL, no_mask)  # the mask is built per layer from the slots' tags


class HeadTokens:
    """A layer's filled slots regrouped per KV head, in position order, padded to the fullest head:
    ``slots [b, H, L]`` (pool slot of each entry), ``valid [b, H, L]``, ``keys [b, H, L, d]`` (zero where not
    valid), ``positions [b, H, L]`` (:data:`EMPTY_POSITION` where not valid)."""

    def __init__(self, layer: "HeadPoolLayer", seen: int):
        """``seen``: tokens processed so far (every cached position is below it)."""
        m, h = layer.filled(), layer.heads
        tags, positions = layer.tags[:, 0, :m], layer.positions[:, 0, :m]
        order = (tags * (seen + 1) + positions).argsort(dim=-1)  # head-major, then position
        counts = layer.head_counts()  # [b, H]
        starts = counts.cumsum(dim=-1) - counts
        length = int(counts.max())
        j = torch.arange(length, device=tags.device)
        self.valid = j < counts.unsqueeze(-1)  # [b, H, L]
        at = (starts.unsqueeze(-1) + j).clamp(max=m - 1).view(tags.shape[0], -1)
        self.slots = order.gather(1, at).view(*self.valid.shape)
        flat = self.slots.view(tags.shape[0], 1, -1)
        keys = layer.keys[:, :, :m].gather(2, expand_index(flat, layer.keys)).view(*self.valid.shape, -1)
        self.keys = keys.masked_fill(~self.valid.unsqueeze(-1), 0)
        self.positions = positions.gather(1, flat[:, 0]).view(*self.valid.shape).masked_fill(~self.valid,
                                                                                               EMPTY_POSITION)

    def values(self, layer: "HeadPoolLayer") -> torch.Tensor:
        """The layer's values regrouped like the keys: ``[b, H, L, d_v]``, zero where not valid."""
        flat = self.slots.view(self.slots.shape[0], 1, -1)
        m = layer.filled()
        values = layer.values[:, :, :m].gather(2, expand_index(flat, layer.values)).view(*self.valid.shape, -1)
        return values.masked_fill(~self.valid.unsqueeze(-1), 0)

    def take(self, per_slot: torch.Tensor) -> torch.Tensor:
        """``[b, H, group, M]`` per pool slot (captured attention) → ``[b, H, group, L]``, zero where not valid."""
        index = self.slots.unsqueeze(2).expand(-1, -1, per_slot.shape[2], -1)
        return per_slot.gather(-1, index).masked_fill(~self.valid.unsqueeze(2), 0)

    def kept_slots(self, kept: torch.Tensor) -> torch.Tensor:
        """``kept [b, H, L]`` (the same count per row) → their pool slots ``[b, K]`` in (head, position) order."""
        return self.slots[kept].view(kept.shape[0], -1)


def select_across_heads(scores: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, safeguard: int,
                        keep: int) -> torch.Tensor:
    """Which of the ``[b, H, L]`` entries to keep: ``keep`` per row (module docstring) → bool ``[b, H, L]``.

    ``scores``: the policy's, the entries always kept (the protected tokens) raised to +inf
    (:func:`kdeval.keydiff.policy.selection.raise_kept`); ``safeguard``: each head's best tokens also always kept
    (equal scores: oldest first). Entries not ``valid`` are freed first, whatever their score. Needs at most
    ``keep`` raised valid entries and at least ``keep`` valid ones per row."""
    scores = scores if scores.dtype == torch.float64 else scores.float()
    if safeguard > 0:
        best = lowest_oldest_first((-scores).masked_fill(~valid, float("inf")), positions, safeguard)
        scores = scores.scatter(-1, best, float("inf"))
    b, h, n = scores.shape
    flat_scores, flat_valid = scores.reshape(b, -1), valid.reshape(b, -1)
    head = torch.arange(h, device=scores.device).repeat_interleave(n)
    order = (positions.masked_fill(~valid, 0).reshape(b, -1) * h + head).argsort(dim=-1)  # oldest, then head
    order = order.gather(1, torch.sort(flat_scores.gather(1, order), dim=-1, stable=True).indices)  # lowest first
    order = order.gather(1, torch.sort(flat_valid.gather(1, order).to(torch.uint8), dim=-1, stable=True).indices)
    kept = torch.ones_like(flat_valid).scatter_(1, order[:, : h * n - keep], False)
    return kept.view(b, h, n)

