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
- Eviction (kdeval/keydiff/headpool_eviction.py) gathers each head's tokens in position order, scores them with
  the policy and keeps the best ``H * N`` of the row; :meth:`HeadPoolLayer.commit` compacts them into
  ``[0, H * N)``, moved in place (an O(evicted) move: slot order is then not position order).

``length`` is the tokens per KV head on average (``slots / H``; the pool always holds a multiple of ``H``), the
figure the engine's counters and bounds read for every cache.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from kdeval.keydiff.attention import AttentionCapture
from kdeval.keydiff.buffers import BufferedLayer, SlotBuffers
from kdeval.keydiff.cache import BudgetCache, BudgetLayerMixin
from kdeval.keydiff.slots import EMPTY_POSITION

POOL_IMPL = "kdeval_pool"


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
            keep = torch.zeros(b, m, dtype=torch.bool, device=kept.device).scatter_(1, kept, True)
            drop = (~keep).nonzero()[:, 1].view(b, 1, m - k)
            self.slot_buffers.compact(drop, k)
        self.length = k // self.heads


class HeadPoolCache(BudgetCache):
    """A :class:`BudgetCache` of :class:`HeadPoolLayer` (``capacity``: slots per KV head), which the engine
    evicts by :func:`~kdeval.keydiff.headpool_eviction.evict_pool`."""


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


def _no_mask(*args, **kwargs) -> None:
    """The pool's mask is built per layer by its attention function, from the slots' tags."""
    return None


AttentionInterface.register(POOL_IMPL, pool_attention_forward)
AttentionMaskInterface.register(POOL_IMPL, _no_mask)
