"""One engine step: the forward of a chunk (or a generated token) with the attention rows and queries the policy
reads, then eviction to the budget; and the caches the steps run on (made, grown, pooled).

A step reads everything it decides from the :class:`~kdeval.keydiff.plan.Plan`. On the graph path
(:attr:`Plan.use_graphs`, the static slot layout) :meth:`Step.device_step` is what a CUDA graph captures
(kdeval/keydiff/graphs.py); steps that do not evict run eagerly: a static-layout cache is first thawed into a
dynamic one (``BudgetCache.thawed``) and its buffers, with the graphs captured on them, go back to the pool.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable

import torch
from transformers.cache_utils import DynamicLayer

from kdeval.keydiff.attention import (
    CAPTURE_IMPL, SDPA_IMPL, STATIC_IMPL, AttentionCapture, attention_implementation, static_mask,
)
from kdeval.keydiff.cache import BudgetCache, EmptySlots, SlotLayer
from kdeval.keydiff.eviction import Evictor
from kdeval.keydiff.graphs import CapturedStep
from kdeval.keydiff.headpool import HeadPoolCache, HeadPoolLayer
from kdeval.keydiff.plan import Plan
from kdeval.keydiff.policy import Policy
from kdeval.keydiff.queries import capture_queries, record_step
from kdeval.keydiff.shared import SharedSteps, StepRecord, capture_key, member_capture
from kdeval.keydiff.state import PrefillState


def slot_layer(capacity: int, state_names: tuple[str, ...], static_base: int | None, shares_heads: bool,
               limit: int | None) -> DynamicLayer:
    """One layer of the engine's cache: ``capacity`` slots per KV head, the per-token ``state_names``, the static
    layout's N (``None``: dynamic), a pool shared by the KV heads (``shares_heads``, no per-token state), the
    most slots it needs while evicting (``limit``: budget + chunk; ``None``: it does not evict)."""
    if shares_heads:
        return HeadPoolLayer(capacity)
    return SlotLayer(capacity, state_names, static_base, limit)


#: makes one cache layer from the arguments :func:`slot_layer` takes
LayerFactory = Callable[[int, tuple, int | None, bool, int | None], DynamicLayer]
#: makes the runner of one captured step from the arguments :class:`CapturedStep` takes
GraphRunner = Callable[..., CapturedStep]


class Step:
    """Runs the steps of one policy under one plan on one model; keeps released static caches for reuse."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: Plan, cache_layer: LayerFactory = slot_layer,
                 graph_runner: GraphRunner = CapturedStep):
        """``cache_layer``, ``graph_runner``: see ``Engine``."""
        self.model, self.policy, self.plan = model, policy, plan
        self.cache_layer, self.graph_runner = cache_layer, graph_runner
        self.evictor = Evictor(model, policy, plan)
        self._spare: dict[int, BudgetCache] = {}  # released static caches (with their graphs), by batch size

    def new_state(self, batch: int = 1, tokens: int = 0) -> PrefillState:
        """An empty cache sized for the ``tokens`` the call will feed, when given (while evicting, at most a layer's
        budget plus a chunk); it still grows if needed.

        On the graph path a cache handed back by :meth:`release` for the same batch size is reused, emptied,
        with the graphs captured on it."""
        spare = self._spare.pop(batch, None)
        if spare is not None:
            spare.reset()
            return PrefillState(spare, 0, torch.empty(0))
        plan = self.plan
        B = plan.config.chunk_size
        if plan.use_graphs:  # the static layout: N + B slots, whatever the call
            cap = [b + B for b in plan.budgets]
        elif plan.evicting:  # a budget plus a chunk, or less when the call feeds fewer tokens (B past the prompt)
            cap = [min(b + B, tokens) if tokens else b + B for b in plan.budgets]
        else:  # what the call will hold, when it says (a chunk size past the prompt allocates nothing)
            cap = [tokens or B] * plan.num_layers
        cache = self.new_cache(cap, plan.config.budget if plan.use_graphs else None)
        return PrefillState(cache, 0, torch.empty(0))

    def new_cache(self, capacities: list[int], static_base: int | None = None) -> BudgetCache:
        """An empty cache of this plan's kind with ``capacities[i]`` slots per KV head in layer ``i`` (the static
        layout's N: ``static_base``), owned by this step."""
        plan = self.plan
        pooled = plan.shares_heads
        names = () if pooled else plan.needs.token_state
        B = plan.config.chunk_size
        limits = [b + B for b in plan.budgets] if plan.evicting else [None] * len(capacities)
        layers = [self.cache_layer(cap, names, static_base, pooled, lim) for cap, lim in zip(capacities, limits)]
        cache = (HeadPoolCache if pooled else BudgetCache)(layers, names, static_base)
        cache.owner = weakref.ref(self)  # a fork's deep copy keeps it (weak references copy as they are)
        cache.rerotated = plan.rerotate
        return cache

    def release(self, state: PrefillState) -> None:
        """Take back a state its caller is done with (see ``Engine.release``)."""
        state.check_usable()
        state.released = True
        self._pool(state.cache)

    def _pool(self, cache: BudgetCache) -> None:
        """Keep ``cache`` for the next request of its batch size when it is one of this step's static ones."""
        mine = cache.owner is not None and cache.owner() is self
        if mine and self.plan.use_graphs and cache.static_base is not None and cache.batch_size is not None:
            self._spare[cache.batch_size] = cache

    def make_room(self, state: PrefillState, tokens: int) -> None:
        """Room for ``tokens`` more without eviction: a static-layout cache is thawed into a dynamic one (its
        buffers and graphs go back to the pool), a slot cache grows its buffers once."""
        cache = state.cache
        if cache.static_base is not None:
            state.cache = cache.thawed(cache.length + tokens)
            if cache.graphs or cache.batch_size not in self._spare:  # keep a pooled cache with graphs
                self._pool(cache)
        else:
            cache.reserve_more(tokens)

    def run(self, state: PrefillState, ids: torch.Tensor, all_logits: bool, evict: bool = True,
            protect: bool = False, shared: SharedSteps | None = None) -> torch.Tensor:
        """One forward of ``ids [batch, t]`` at positions ``seen .. seen + t - 1``, then eviction to the budget
        plus the protected tokens (``evict=False``: none; ``protect``: these tokens become protected); returns
        the logits ``[batch, t or 1, vocab]``.

        ``shared``: a store of prompt steps other cells computed alike (kdeval/keydiff/shared.py): a step found
        there is replayed into this cache instead of computed, one that is not is computed and recorded there."""
        t = ids.shape[1]
        if not evict and state.cache.static_base is not None:
            self.make_room(state, t)
        key = shared.step_key(self.plan, state, ids) if shared is not None and not all_logits else None
        state.cache.rerotated = self.plan.rerotate  # check_ids let it through: the schemes agree so far
        state.peak_kv_tokens = max(state.peak_kv_tokens, state.cache.length + t)  # held during this forward
        graph = self._graph_for(state, ids, all_logits) if evict else None
        record = shared.find(key, self.plan) if shared is not None else None
        positions = torch.arange(state.seen, state.seen + t, device=self.plan.device) if graph is None else None
        if graph is not None:
            logits = graph.run(self, state.cache, ids, state.seen)
        elif record is not None:
            logits = self.replay_step(state.cache, record, positions, state.seen + t, state.steps, evict,
                                      tuple(state.protected))
            shared.replayed += 1
            state.replayed += 1
        else:
            recording = (shared, key) if shared is not None and shared.wants(key, state, t) else None
            logits = self.device_step(state.cache, ids, positions, state.seen + t, state.steps, all_logits,
                                      evict=evict, protected=tuple(state.protected), recording=recording)
        state.history = key
        state.peak_kv_bytes = max(state.peak_kv_bytes, state.cache.held_nbytes())
        if protect:
            state.protect(state.seen, state.seen + t)
        state.seen += t
        state.steps += 1
        return logits

    def device_step(self, cache: BudgetCache, ids: torch.Tensor, positions: torch.Tensor,
                    seen_after: int | torch.Tensor, steps: int, all_logits: bool, evict: bool = True,
                    protected: tuple[tuple[int, int], ...] = (),
                    recording: tuple[SharedSteps, str] | None = None) -> torch.Tensor:
        """Forward + eviction with no host synchronisation: capturable as one CUDA graph (static layout).

        ``positions [t]`` and ``seen_after`` (an int, or a 0-d device tensor under graphs) are the only inputs
        that change from chunk to chunk. ``evict=False`` and ``protected`` (position ranges never evicted, on
        top of the budget) take the eager path only: a dynamic-layout cache. ``recording``: (store, step key) to
        record this step in, with the attention rows and queries every member of the store reads (eager only).
        """
        plan = self.plan
        t = ids.shape[1]
        cache.begin_chunk(positions)
        need = plan.needs.attention
        capture = passed = None
        impl = plan.step_attention
        if recording is not None:
            passed, captures = recording[0].recording_capture(plan)
            capture = captures.get(capture_key(need, plan)) if need is not None else None
            if passed is not None and impl == SDPA_IMPL:
                impl = CAPTURE_IMPL  # SDPA's same output, with the rows beside it
        elif need is not None:
            capture = passed = AttentionCapture(need, float32_logits=plan.config.score_precision == "float32")
        kwargs = {"kdeval_capture": passed} if passed is not None else {}
        if isinstance(cache, HeadPoolCache):
            kwargs["kdeval_pool"] = cache  # its attention function builds one mask per layer from the slots' tags
        empty = None
        if cache.static_base is not None:
            impl = STATIC_IMPL
            n = cache.static_base
            cached = (seen_after - t).clamp(max=n) if isinstance(seen_after, torch.Tensor) else min(seen_after - t, n)
            phase = self.phase(cache, t)  # from host bookkeeping, exact
            empty = EmptySlots(n, t, cached, ids.device, room=phase == "room")
            # A full head needs no mask (lower-right causal); a 4-D mask reaches the attention function as it is.
            if phase != "full":
                kwargs["attention_mask"] = static_mask(n, t, cached, ids.device, plan.group)
        query_need = plan.needs.queries
        want_queries = query_need is not None or (recording is not None and recording[0].queries)
        queries = capture_queries(self.model) if want_queries else contextlib.nullcontext()
        with attention_implementation(self.model, impl), queries as captured:
            out = self.model(
                input_ids=ids,
                position_ids=self._rope_positions(cache, positions).unsqueeze(0).expand(ids.shape[0], t),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
                **kwargs,
            )
        if recording is not None:
            recording[0].store(recording[1], cache, out.logits, captures, captured if want_queries else None)
        recent = None
        if query_need is not None:
            recent = record_step(self.model, query_need, cache, captured, positions.unsqueeze(0), seen_after)
        self.evictor.evict(cache, t, seen_after, steps, capture, empty, evict, protected, recent)
        return out.logits

    def replay_step(self, cache: BudgetCache, record: StepRecord, positions: torch.Tensor, seen_after: int,
                    steps: int, evict: bool, protected: tuple[tuple[int, int], ...]) -> torch.Tensor:
        """A recorded step instead of its forward (kdeval/keydiff/shared.py): its keys and values written into
        ``cache`` as the model writes them, the policy's rows and queries from the record, then this plan's own
        eviction; returns the recorded logits."""
        plan = self.plan
        cache.begin_chunk(positions)
        for idx, (keys, values) in enumerate(zip(record.keys, record.values)):
            cache.update(keys, values, idx)
        recent = None
        if plan.needs.queries is not None:
            recent = record_step(self.model, plan.needs.queries, cache, record.queries, positions.unsqueeze(0),
                                 seen_after)
        self.evictor.evict(cache, positions.shape[0], seen_after, steps, member_capture(record, plan), None, evict,
                           protected, recent)
        return record.logits.clone()

    def _rope_positions(self, cache: BudgetCache, positions: torch.Tensor) -> torch.Tensor:
        """The RoPE positions ``[t]`` of a chunk at absolute ``positions [t]``: the same, or, for a policy that
        re-rotates, right after the ``cache.length`` cached tokens."""
        if not self.plan.rerotate:
            return positions
        return torch.arange(cache.length, cache.length + positions.shape[0], device=positions.device)

    def _graph_for(self, state: PrefillState, ids: torch.Tensor, all_logits: bool) -> CapturedStep | None:
        """The captured step for this cache and chunk shape, when graphs apply (static layout); else ``None``."""
        if not self.plan.use_graphs or all_logits or state.cache.static_base is None:  # thawed: eager
            return None
        t = ids.shape[1]
        if t not in (self.plan.config.chunk_size, 1):
            return None
        key = (ids.shape[0], t, self.phase(state.cache, t))
        graph = state.cache.graphs.get(key)
        if graph is None or graph.owner() is not self:  # another engine's graph ran its policy and settings
            graph = self.graph_runner(self, ids.shape[0], t, self.plan.device)
            state.cache.graphs[key] = graph
        return graph

    def phase(self, cache: BudgetCache, t: int) -> str:
        """The static layout's step kind for ``t`` more tokens, each its own graph: ``room`` (the empty head slots
        take the whole chunk: nothing to score), ``partial`` (some empty slots, some eviction) or ``full``."""
        n = self.plan.config.budget
        return "full" if cache.length >= n else "room" if cache.length + t <= n else "partial"
