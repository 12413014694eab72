"""The caches one engine's steps run on: made for its plan, grown, thawed, and pooled for reuse.

A :class:`CacheMaker` makes every cache of one plan (the uniform and per-layer slot caches, the static layout of
the graph path, the head-shared pool) from one layer factory (:func:`slot_layer`, or a test's reference,
``Engine(cache_layer=...)``). On the graph path a released static cache, and the CUDA graphs captured on its
buffers, is kept per batch size (:meth:`CacheMaker.spare`) and serves the next request of that size.
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
from transformers.cache_utils import DynamicLayer

from kdeval.keydiff.cache.budget_cache import BudgetCache, RowLayer, StateRowLayer, StaticLayer
from kdeval.keydiff.cache.row_moves import rows_of, thawed
from kdeval.keydiff.cache.headpool import HeadPoolCache, HeadPoolLayer
from kdeval.keydiff.cache.state_layer import StateLayer
from kdeval.keydiff.plan.plan import Plan
from kdeval.keydiff.loop.state import PrefillState


def slot_layer(capacity: int, state_names: tuple[str, ...], static_base: int | None, shares_heads: bool,
               limit: int | None) -> DynamicLayer:
    """One layer of the engine's cache: ``capacity`` slots per KV head, the per-token ``state_names``, the static
    layout's N (``None``: dynamic), a pool shared by the KV heads (``shares_heads``, no per-token state), the
    most slots it needs while evicting (``limit``: budget + chunk; ``None``: it does not evict)."""
    if shares_heads:
        return HeadPoolLayer(capacity)
    if static_base is not None:
        return StaticLayer(capacity, state_names, static_base)
    return RowLayer(capacity, state_names, limit)


#: makes one cache layer from the arguments :func:`slot_layer` takes
LayerFactory = Callable[[int, tuple, int | None, bool, int | None], DynamicLayer]


class CacheMaker:
    """Makes, grows and pools the caches of one plan (module docstring)."""

    def __init__(self, plan: Plan, cache_layer: LayerFactory = slot_layer):
        self.plan, self.cache_layer = plan, cache_layer
        self._spare: dict[int, BudgetCache] = {}  # released static caches (with their graphs), by batch size

    def spare(self, batch: int) -> BudgetCache | None:
        """The released static cache kept for the next request of ``batch`` rows (``None``: none)."""
        return self._spare.get(batch)

    def new_state(self, batch: int = 1, capacities: list[int] | None = None) -> PrefillState:
        """An empty cache of ``batch`` rows: on the graph path the static layout's ``N + B`` slots per layer (a
        spare one of ``batch`` rows reused, emptied); otherwise ``capacities[l]`` slots in layer ``l`` (planned for
        the call, kdeval/keydiff/plan/capacity.py), or when not given a layer's limit plus a chunk (a chunk for a layer
        that keeps everything), grown if needed."""
        plan = self.plan
        B = plan.config.chunk_size
        if plan.use_graphs:
            spare = self._spare.pop(batch, None)
            if spare is not None:
                spare.reset()
                return PrefillState(spare, 0, torch.empty(0))
            return PrefillState(self.new_cache([b + B for b in plan.budgets], plan.config.budget), 0, torch.empty(0))
        if capacities is None:
            capacities = [B if lim is None else lim + B for lim in map(plan.layer_limit, range(plan.num_layers))]
        return PrefillState(self.new_cache(capacities), 0, torch.empty(0))

    def new_cache(self, capacities: list[int], static_base: int | None = None) -> BudgetCache:
        """An empty cache of this plan's kind with ``capacities[i]`` slots per KV head in layer ``i`` (the static
        layout's N: ``static_base``), owned by this maker."""
        plan = self.plan
        pooled = plan.shares_heads
        names = () if pooled else plan.needs.token_state
        layers = [self._layer(i, cap, names, static_base, pooled, lim)
                  for i, (cap, lim) in enumerate(zip(capacities, self._limits()))]
        return self._owned((HeadPoolCache if pooled else BudgetCache)(layers, names, static_base))

    def _layer(self, idx: int, capacity: int, names: tuple[str, ...], static_base: int | None, pooled: bool,
               limit: int | None) -> DynamicLayer:
        """Layer ``idx`` of a new cache: the factory's, or a recurrent layer's states (with the eager layer beside
        them for a hybrid layer's attention)."""
        kind, plan = self.plan.kind(idx), self.plan
        if not kind.attends:
            return StateLayer(plan.states_per_layer)
        if kind.holds_state:
            return StateRowLayer(capacity, names, limit, number_of_states=plan.states_per_layer)
        return self.cache_layer(capacity, names, static_base, pooled, limit)

    def row_state_cache(self, cache: BudgetCache, row: int) -> BudgetCache:
        """Row ``row`` of a batch's eager cache as a state of its own (its held tokens, copied by
        :func:`~kdeval.keydiff.cache.row_moves.rows_of`), which this plan's steps continue."""
        out = self._owned(rows_of([(cache, row)], [lengths[row] for lengths in cache.lengths],
                                  self.plan.needs.token_state, self._limits()))
        out.thawed_from = self.plan.config.budget if self.plan.use_graphs else None
        return out

    def _limits(self) -> list[int | None]:
        """Per layer, the most slots it needs while evicting (its limit plus a chunk; ``None``: it grows)."""
        B = self.plan.config.chunk_size
        return [None if lim is None else lim + B for lim in map(self.plan.layer_limit, range(self.plan.num_layers))]

    def _owned(self, cache: BudgetCache) -> BudgetCache:
        if self.plan.windowed or self.plan.recurrent:  # layers that hold different counts, whatever their slots
            cache.uniform = False
        cache.owner = weakref.ref(self)  # a fork's deep copy keeps it (weak references copy as they are)
        cache.rerotated = self.plan.rerotate
        return cache

    def release(self, state: PrefillState) -> None:
        """Take back a state its caller is done with (see ``Engine.release``)."""
        state.check_usable()
        state.released = True
        self._pool(state.cache)

    def _pool(self, cache: BudgetCache) -> None:
        """Keep ``cache`` for the next request of its batch size when it is one of this maker's static ones."""
        mine = cache.owner is not None and cache.owner() is self
        if mine and self.plan.use_graphs and cache.static_base is not None and cache.batch_size is not None:
            self._spare[cache.batch_size] = cache

    def make_room(self, state: PrefillState, tokens: int) -> None:
        """Room for ``tokens`` more without eviction: a static-layout cache is thawed into a dynamic one (its
        buffers and graphs go back to the pool), a slot cache grows its buffers once."""
        cache = state.cache
        if cache.static_base is not None:
            state.cache = thawed(cache, cache.length + tokens)
            if cache.graphs or cache.batch_size not in self._spare:  # keep a pooled cache with graphs
                self._pool(cache)
        else:
            cache.reserve_more(tokens)
