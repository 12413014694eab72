"""One engine step: the forward of a chunk (or a generated token) with what the policy reads, then eviction to
the budget. One forward serves every cache arrangement (the eager cache of every request, alone or batched; the
static layout of the graph path; a head-shared pool): the layout adapter (kdeval/keydiff/cache/layouts.py) gives its
inputs and its part of eviction.

A step reads everything it decides from the :class:`~kdeval.keydiff.plan.plan.Plan`. On the graph path
(:attr:`Plan.use_graphs`, the static layout, kdeval/keydiff/cache/static.py) :meth:`Step.device_step` is what a CUDA
graph captures (kdeval/keydiff/step/graphs.py); steps that do not evict run eagerly on a dynamic copy of the cache
(:meth:`CacheMaker.make_room <kdeval.keydiff.plan.cache_maker.CacheMaker.make_room>`).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import torch

from kdeval.keydiff.attention.capture import CAPTURE_IMPL, SDPA_IMPL, AttentionCapture
from kdeval.keydiff.attention.functions import attention_implementation
from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.plan.cache_maker import CacheMaker, LayerFactory, slot_layer
from kdeval.keydiff.step.eviction import Evictor
from kdeval.keydiff.step.graphs import CapturedStep
from kdeval.keydiff.cache.layouts import Layout, step_layout
from kdeval.keydiff.loop.memory import layer_lengths, own_peak_bytes
from kdeval.keydiff.plan.plan import Plan
from kdeval.keydiff.policy.interface import Policy
from kdeval.keydiff.attention.queries import capture_queries, record_step
from kdeval.keydiff.attention.reads import StepReads, layer_projections
from kdeval.keydiff.attention.repeat_prompt import RepeatInput, RepeatPrompt
from kdeval.keydiff.step.repeat_pass import RepeatPass
from kdeval.keydiff.step.shared import SharedSteps, StepRecord, capture_key, member_capture
from kdeval.keydiff.loop.state import PrefillState
from kdeval.keydiff.cache.static import phase

#: makes the runner of one captured step from the arguments :class:`CapturedStep` takes
GraphRunner = Callable[..., CapturedStep]


class Step:
    """Runs the steps of one policy under one plan on one model; its caches are made by :attr:`caches`."""

    def __init__(self, model: torch.nn.Module, policy: Policy, plan: Plan, cache_layer: LayerFactory = slot_layer,
                 graph_runner: GraphRunner = CapturedStep, repeat_prompt: RepeatPrompt | None = None):
        """``cache_layer``, ``graph_runner``, ``repeat_prompt``: see ``Engine``."""
        self.model, self.policy, self.plan = model, policy, plan
        self.graph_runner = graph_runner
        self.caches = CacheMaker(plan, cache_layer)
        self.evictor = Evictor(model, policy, plan)
        self.projections = layer_projections(model) if plan.needs.projections else None
        need = plan.needs.repeat
        self.repeat = RepeatPass(model, need, repeat_prompt or RepeatPrompt()) if need is not None else None

    def run(self, state: PrefillState, ids: torch.Tensor, all_logits: bool, evict: bool = True,
            protect: bool = False, shared: SharedSteps | None = None, prompt: bool = False) -> torch.Tensor:
        """One forward of ``ids [batch, t]`` at positions ``seen .. seen + t - 1``, then eviction to the budget
        plus the protected tokens (``evict=False``: none; ``protect``: these tokens become protected); returns
        the logits ``[batch, t or 1, vocab]``.

        ``shared``: a store of prompt steps other cells computed alike (kdeval/keydiff/step/shared.py): a step found
        there is replayed into this cache instead of computed, one that is not is computed and recorded there.
        ``prompt``: the step feeds prompt tokens (an evicting one runs the policy's repeat pass, when it has one)."""
        t = ids.shape[1]
        if not evict and state.cache.static_base is not None:
            self.caches.make_room(state, t)
        key = shared.step_key(self.plan, state, ids) if shared is not None and not all_logits else None
        state.cache.rerotated = self.plan.rerotate  # check_ids let it through: the schemes agree so far
        state.peak_kv_tokens = max(state.peak_kv_tokens, state.cache.length + t)  # held during this forward
        before = layer_lengths(state.cache)
        graph = self._graph_for(state, ids, all_logits) if evict else None
        record = shared.find(key, self.plan) if shared is not None else None
        positions = torch.arange(state.seen, state.seen + t, device=self.plan.device) if graph is None else None
        repeat = self._repeat_input(state, ids, prompt and evict)
        if graph is not None:
            logits = graph.run(self, state.cache, ids, state.seen)
        elif record is not None:
            logits = self.replay_step(state.cache, record, positions, state.seen + t, state.steps, evict,
                                      tuple(state.protected), repeat)
            shared.replayed += 1
            state.replayed += 1
        else:
            wanted = shared is not None and shared.wants(key, state, t, self.plan.config.chunk_size)
            recording = (shared, key) if wanted else None
            logits = self.device_step(state.cache, ids, positions, state.seen + t, state.steps, all_logits,
                                      evict=evict, protected=tuple(state.protected), recording=recording,
                                      repeat=repeat)
        state.history = key
        state.peak_kv_bytes = max(state.peak_kv_bytes, own_peak_bytes(state.cache, before, t))
        state.kv_buffer_bytes = max(state.kv_buffer_bytes, state.cache.held_nbytes())
        if protect:
            state.protect(state.seen, state.seen + t)
        state.seen += t
        state.steps += 1
        return logits

    def device_step(self, cache: BudgetCache, ids: torch.Tensor, positions: torch.Tensor,
                    seen_after: int | torch.Tensor, steps: int, all_logits: bool, evict: bool = True,
                    protected: tuple[tuple[int, int], ...] = (),
                    recording: tuple[SharedSteps, str] | None = None, repeat: RepeatInput | None = None
                    ) -> torch.Tensor:
        """Forward + eviction of ``ids [batch, t]`` on a batch-1 (or shared-positions) cache with no host
        synchronisation: capturable as one CUDA graph (static layout).

        ``positions [t]`` and ``seen_after`` (an int, or a 0-d device tensor under graphs) are the only inputs
        that change from chunk to chunk. ``evict=False`` and ``protected`` (position ranges never evicted, on
        top of the budget) take the eager path only: a dynamic-layout cache. ``recording``: (store, step key) to
        record this step in (eager only); ``repeat``: the step's repeat pass (eager only)."""
        layout = step_layout(self.plan, cache, ids.shape[0], positions, seen_after, steps, all_logits, evict,
                             protected)
        return self.forward(layout, ids, recording, repeat)

    def forward(self, layout: Layout, ids: torch.Tensor,
                recording: tuple[SharedSteps, str] | None = None, repeat: RepeatInput | None = None) -> torch.Tensor:
        """The one forward of a step on any layout: ``ids [batch, t]`` through the model under the layout's inputs
        and attention function, capturing what the policy reads (and, ``recording``, what every member of a
        shared store reads), then ``repeat``'s pass, when given, and eviction; returns the logits ``[batch, t or 1,
        vocab]``."""
        plan = self.plan
        needs = plan.needs
        layout.begin()
        capture = passed = None
        impl = plan.step_attention
        if recording is not None:
            passed, captures = recording[0].recording_capture(plan)
            capture = captures.get(capture_key(needs.attention, plan)) if needs.attention is not None else None
            if passed is not None and impl == SDPA_IMPL:
                impl = CAPTURE_IMPL  # SDPA's same output, with the rows beside it
        elif needs.attention is not None:
            capture = passed = AttentionCapture(needs.attention, float32_logits=plan.config.score_precision == "float32")
        kwargs = layout.inputs(ids.shape[0])
        if passed is not None:
            kwargs["kdeval_capture"] = passed
        store = recording[0] if recording is not None else None
        want_queries = needs.queries is not None or (store is not None and store.queries)
        with attention_implementation(self.model, layout.attention(impl)), \
                (capture_queries(self.model) if want_queries else nullcontext()) as queries:
            out = self.model(input_ids=ids, past_key_values=layout.cache, use_cache=True,
                             logits_to_keep=layout.logits_to_keep, **kwargs)
        if store is not None:
            store.store(recording[1], layout.cache, out.logits, captures, queries)
        self._evict(layout, capture, queries, repeat)
        return out.logits

    def replay_step(self, cache: BudgetCache, record: StepRecord, positions: torch.Tensor, seen_after: int,
                    steps: int, evict: bool, protected: tuple[tuple[int, int], ...],
                    repeat: RepeatInput | None = None) -> torch.Tensor:
        """A recorded step instead of its forward (kdeval/keydiff/step/shared.py): its keys and values written into
        ``cache`` as the model writes them, the policy's reads from the record, then this plan's own eviction;
        returns the recorded logits."""
        layout = step_layout(self.plan, cache, record.logits.shape[0], positions, seen_after, steps, False, evict,
                             protected)
        layout.begin()
        for idx, (keys, values) in enumerate(zip(record.keys, record.values)):
            if keys is not None:
                cache.update(keys, values, idx)
            if idx in record.states:  # the recurrent states after the step, as the forward left them
                cache.layers[idx].load(record.states[idx])
        self._evict(layout, member_capture(record, self.plan), record.queries, repeat)
        return record.logits.clone()

    def _evict(self, layout: Layout, capture: AttentionCapture | None,
               queries: dict[int, torch.Tensor] | None, repeat: RepeatInput | None = None) -> None:
        """Eviction after the step's forward (or replay), with what the policy reads (``repeat``: the step's repeat
        pass, run here over the cache the forward left)."""
        needs = self.plan.needs
        recent = None
        if needs.queries is not None:
            recent = record_step(self.model, needs.queries, layout.cache, queries, layout.query_positions,
                                 layout.seen_after)
        scores = self.repeat.scores(layout.cache, repeat) if repeat is not None and repeat.rows else None
        self.evictor.evict(layout, StepReads(needs, capture, recent, self.projections, scores,
                                             fold_heads=self.plan.latent))

    def _repeat_input(self, state: PrefillState, ids: torch.Tensor, evicting_prompt: bool) -> RepeatInput | None:
        """For a policy with a repeat pass: record ``ids`` as fed and, at an evicting prompt step, its pieces (their
        tokens counted in ``state.extra_forward_tokens``); else ``None``."""
        if self.repeat is None:
            return None
        if state.repeat is None:
            state.repeat = self.repeat.progress(ids.shape[0], ids.device)
        step = None
        if evicting_prompt:
            step = self.repeat.prepare(state.repeat, ids, state.seen, state.seen + ids.shape[1])
            state.extra_forward_tokens += step.tokens
        state.repeat.fed(ids, self.repeat.need.postfix)
        return step

    def _graph_for(self, state: PrefillState, ids: torch.Tensor, all_logits: bool) -> CapturedStep | None:
        """The captured step for this cache and chunk shape, when graphs apply (static layout); else ``None``."""
        if not self.plan.use_graphs or all_logits or state.cache.static_base is None:  # thawed: eager
            return None
        t = ids.shape[1]
        if t not in (self.plan.config.chunk_size, 1):
            return None
        key = (ids.shape[0], t, phase(state.cache.length, self.plan.config.budget, t))
        graph = state.cache.graphs.get(key)
        if graph is None or graph.owner() is not self:  # another engine's graph ran its policy and settings
            graph = self.graph_runner(self, ids.shape[0], t, self.plan.device)
            state.cache.graphs[key] = graph
        return graph
