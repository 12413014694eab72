"""Chunked prefill and greedy decoding with eviction to a hard budget after every chunk and every token.

Per layer and KV head the cache never holds more than ``budget + chunk_size`` tokens (``budget + 1`` while
decoding), whatever the prompt length; a policy with per-layer budgets (``Policy.layer_budgets``, PyramidKV)
makes that bound each layer's own budget, the layers' total staying ``layers * budget``. Positions are
absolute: chunk ``[s, s + t)`` of the prompt is fed with ``position_ids = s .. s + t - 1`` even when only
``budget`` older tokens remain cached, so RoPE sees the true distances (a policy that ``rerotates``,
StreamingLLM's cache, is fed after the cached tokens instead and its kept keys are re-rotated:
kdeval/keydiff/attention/rerotation.py).

Two evaluation protocols run on these steps (``generate``'s ``protect_last`` and ``decode_evict``):

- the KeyDiff paper's (the defaults): every chunk of the whole prompt is evicted to ``N``, and so is every
  generated token;
- kvpress's (``protect_last=len(question)``): the context is prefilled with eviction to ``N`` (at most
  ``N + B`` held), then the question is fed without eviction and *protected*: never evicted afterwards. The
  budget ``N`` counts the unprotected tokens (the context's survivors and the generated tokens); the ``P``
  protected ones are held on top of it, so an evicting step leaves ``min(N, unprotected) + P`` tokens.
  ``decode_evict=False`` stops eviction after the prompt: the cache grows by one token per decode step.

The engine is a front: :func:`~kdeval.keydiff.plan.plan.make_plan` decides once what runs (budgets, layout,
attention function, graphs), :class:`~kdeval.keydiff.step.step.Step` runs one forward with its eviction, and one
generation loop (:class:`~kdeval.keydiff.loop.decoding.GenerationLoop`) feeds it each request's prompt chunks and
generated tokens, for ``generate`` (batch 1 is a batch of one row) as for ``generate_batch``.

A policy that shares a layer's ``H * N`` kept tokens among its KV heads (``PolicyNeeds.shares_heads``, AdaKV)
runs over one pool of ``H * (N + B)`` slots per layer instead (kdeval/keydiff/cache/headpool.py), eagerly.

``generate`` takes rows of one length that share positions; ``generate_batch`` takes independent requests of
any lengths, each as it runs alone (kdeval/keydiff/batch/batching.py, kdeval/keydiff/cache/ragged.py).

A policy scored by a repeat pass (``PolicyNeeds.repeat``, KVzip) runs a second forward after every evicting prompt
step (kdeval/keydiff/attention/repeat_prompt.py); ``generate_batch`` then runs its requests one at a time, as for a head pool.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from itertools import accumulate
from typing import Callable, Iterator, Sequence

import torch

from kdeval.keydiff.batch.requests import one_at_a_time
from kdeval.keydiff.batch.batching import BatchView, generate_batch
from kdeval.keydiff.plan.cache_maker import LayerFactory, slot_layer
from kdeval.keydiff.plan.capacity import forwards, planned
from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.loop.decoding import GenerationLoop, Request, check_protect, eos_ids, prompt_steps
from kdeval.keydiff.step.graphs import CapturedStep
from kdeval.keydiff.loop.memory import PeakMemory, own_bytes, own_kept_bytes
from kdeval.keydiff.plan.plan import expanded_latent_groups, check_ids, make_plan
from kdeval.keydiff.policy.interface import Policy
from kdeval.keydiff.attention.repeat_prompt import RepeatPrompt
from kdeval.keydiff.step.shared import SharedSteps, undiverged
from kdeval.keydiff.loop.state import GenerationResult, PrefillState
from kdeval.keydiff.step.step import GraphRunner, Step
from kdeval.keydiff.batch.trunk import record_trunks, trunk_end


class Engine:
    """Runs one policy under one budget on one model; reusable across prompts."""

    def __init__(self, model: torch.nn.Module, policy: Policy, config: EngineConfig,
                 on_step: Callable[[PrefillState], None] | None = None,
                 on_batch_step: Callable[[BatchView], None] | None = None, *,
                 cache_layer: LayerFactory = slot_layer, graph_runner: GraphRunner | None = None,
                 repeat_prompt: RepeatPrompt | None = None):
        """``on_step(state)`` runs after every chunk and decode step, once eviction is done (tests, tracing);
        ``on_batch_step(view)`` after every step of :meth:`generate_batch`.

        The hooks tests plug their references into (not user options; no grid or config reaches them):
        ``cache_layer(capacity, state_names, static_base, shares_heads, limit)`` makes each layer of every cache
        (default :func:`~kdeval.keydiff.plan.cache_maker.slot_layer`); ``graph_runner(step, batch, t, device)`` makes the
        runner of one captured step (default :class:`~kdeval.keydiff.step.graphs.CapturedStep`, CUDA graphs, which
        need CUDA); given one, the graph path runs on any device.

        ``repeat_prompt``: the token ids of a repeat-pass policy's prompt (KVzip: ``RepeatPrompt.from_tokenizer``,
        kdeval/keydiff/attention/repeat_prompt.py); ``None``: the bare one (the chunk fed again, no instruction or template)."""
        self.model, self.policy, self.config = model, policy, config
        self.on_step, self.on_batch_step = on_step, on_batch_step
        expanded_latent_groups(model)
        #: everything decided once (budgets, layout, attention function, graphs)
        self.plan = make_plan(model, policy, config, graph_runner_given=graph_runner is not None)
        self.step = Step(model, policy, self.plan, cache_layer, graph_runner or CapturedStep, repeat_prompt)
        self._shared: SharedSteps | None = None

    # ------------------------------------------------------------------ public API

    @property
    def shared(self) -> SharedSteps | None:
        """The store of prompt steps shared with other cells of a group (kdeval/keydiff/step/shared.py) while a
        :meth:`sharing` block runs; ``None``: every step is computed here. Results are the same either way; only
        the work done differs."""
        return self._shared

    @contextmanager
    def sharing(self, store: SharedSteps | None) -> Iterator[SharedSteps | None]:
        """While the block runs, prompt steps are replayed from ``store`` or recorded into it (``None``: none);
        the store before the block is back after it."""
        before, self._shared = self._shared, store
        try:
            yield store
        finally:
            self._shared = before

    def new_state(self, batch: int = 1) -> PrefillState:
        """An empty cache of ``batch`` rows: each layer's limit plus a chunk, grown if a call needs more
        (``prefill`` and ``generate`` size theirs for what they will feed, kdeval/keydiff/plan/capacity.py).

        On the graph path a cache handed back by :meth:`release` for the same batch size is reused, emptied,
        with the graphs captured on it."""
        return self.step.caches.new_state(batch)

    def _planned_state(self, batch: int, request: Request, decode_evict: bool = True) -> PrefillState:
        """An empty cache of ``batch`` rows that each run ``request``'s steps, sized for all of them."""
        return self.step.caches.new_state(batch, planned(self.plan, [forwards(request, decode_evict)]))

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, state: PrefillState | None = None,
                collect_logits: bool = False, evict: bool = True, protect_last: int = 0) -> PrefillState:
        """Feed ``input_ids [batch, L]`` chunk by chunk after ``state`` (a fresh cache if ``None``).

        ``protect_last``: the last tokens are fed after the others without eviction, and protected (never evicted
        by later steps, held on top of the budget): kvpress's question; ``evict=False``: all of them are."""
        input_ids = check_ids(self.plan, input_ids, state)
        protected = input_ids.shape[1] if not evict else protect_last
        check_protect(protected, input_ids.shape[1])
        memory = PeakMemory(self.plan.device)
        steps = prompt_steps(input_ids, self.config.chunk_size, protected)
        state = state or self._planned_state(input_ids.shape[0], Request(0, steps, 0))
        room = False
        for ids, evicts, protect in steps:
            if protect and not room:  # the protected tokens' room, made once before the first of them
                self.step.caches.make_room(state, protected)
                room = True
            logits = self._step(state, ids, collect_logits, evict=evicts, protect=protect, prompt=True)
            memory.sample()
            if collect_logits:
                state.chunk_logits.append(logits.float().cpu())
            state.last_logits = logits[:, -1, :]
        return state

    @torch.inference_mode()
    def prefill_shared(self, input_ids: torch.Tensor, protect_last: int = 0) -> PrefillState:
        """The steps of the prompt ``input_ids [1, L]`` that :attr:`shared` replays or records, up to this cell's
        fork: chunks of ``B`` from the first token, each fed while the state has evicted nothing and the store
        serves it or would record it, the first that evicts included. Stops before the prompt's last token and
        before the protected question (``protect_last`` tokens), so the rest is a prompt of its own:
        ``generate_batch([ids[state.seen:]], states=[state], protect_last=...)`` then gives what ``generate``
        gives the whole prompt (the same chunks, from the same state). A prompt protected whole
        (``protect_last=L``) is shared up to its last token, fed unevicted and protected; the rest is then
        protected whole too (``protect_last=L - state.seen``). Returns the state (``seen``: how far it
        got, 0 when nothing was shared), its ``kv_buffer_bytes`` left at 0: the batch it continues in allocates
        the row's buffers (a batch-1 cache's figure is not the batch's); its ``peak_kv_bytes`` are its own
        tokens', as in the batch."""
        if self.shared is None or input_ids.shape[0] != 1:
            raise ValueError("prefill_shared: needs a shared store (Engine.sharing) and one prompt [1, L]")
        length = input_ids.shape[1]
        check_protect(protect_last, length)
        end = trunk_end(length, protect_last)  # the last token, or the question, stay for the caller
        steps = prompt_steps(input_ids, self.config.chunk_size, protect_last)
        steps = [s for s, e in zip(steps, accumulate(ids.shape[1] for ids, _, _ in steps)) if e <= end]
        state = self._planned_state(1, Request(0, steps, 0))
        for ids, evicts, _ in steps:
            if not self.shared.serves_next(self.plan, state, ids):
                break
            self.prefill(ids, state, evict=evicts)  # a step of a prompt protected whole stays protected
            if not undiverged(state, self.plan):  # this cell's first eviction: its own steps from here
                break
        state.kv_buffer_bytes = 0
        return state

    def record_shared(self, prompts: Sequence[torch.Tensor], stores: Sequence[SharedSteps],
                      protect_last: Sequence[int]) -> int:
        """Record in one batch the shared steps that :meth:`prefill_shared` would record one prompt at a time:
        ``prompts[i]`` (token ids ``[L_i]``) into ``stores[i]``, its protected question ``protect_last[i]`` tokens
        (kdeval/keydiff/batch/trunk.py). :meth:`prefill_shared` then replays them. Returns the chunks recorded per
        prompt (0: none)."""
        return record_trunks(self.step, prompts, stores, protect_last)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int | None = None,
                 eos_token_id: int | list[int] | None = None, state: PrefillState | None = None, *,
                 protect_last: int = 0, decode_evict: bool = True, prompt_only: bool = False) -> GenerationResult:
        """Prefill ``input_ids [batch, L]`` (after ``state`` if given), then decode greedily.

        ``protect_last``: the last ``protect_last`` prompt tokens (the question) are fed after the others
        without eviction and stay protected (:meth:`prefill` with ``evict=False``); 0: every chunk is evicted.
        ``decode_evict``: evict after every generated token (protected tokens stay); ``False``: the cache
        grows by one token per decode step.
        ``prompt_only``: stop at the first token (none when it is eos or ``max_new_tokens`` is 0), the result's
        state left as this call leaves it before its first decode step (sized and with room for
        ``max_new_tokens``), so that the rest can be decoded elsewhere (kdeval/evals/task_run/group_decode.py).
        """
        max_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        input_ids = check_ids(self.plan, input_ids, state, max_new)
        check_protect(protect_last, input_ids.shape[1])
        batch = input_ids.shape[0]
        requests = [Request(r, prompt_steps(input_ids[r], self.config.chunk_size, protect_last),
                            min(max_new, 1) if prompt_only else max_new) for r in range(batch)]
        memory = PeakMemory(self.plan.device)
        loop = GenerationLoop(requests, eos_ids(eos_token_id), decode_evict, memory, rows_leave=False)
        # a decode step holds one more token than the cache keeps; without eviction each one stays
        decode_room = 0 if max_new < 2 else (1 if decode_evict else max_new - 1)
        # sized once for every step, the rest of max_new_tokens included when the call stops at the first token
        state = state or self._planned_state(batch, Request(0, requests[0].steps, max_new), decode_evict)
        results: list[GenerationResult] = []
        question_ahead = protect_last > 0

        def forward(rows: list[Request], feeds) -> torch.Tensor:
            nonlocal question_ahead
            ids, evict, protect = feeds[0]
            prompt = not isinstance(ids, int)
            if not prompt:
                ids = loop.choice.view(-1, 1)  # the rows' greedy tokens, on the device (no row leaves this batch)
            else:
                ids = torch.stack([f[0] for f in feeds])
            if protect and question_ahead:  # the question is held whole, unevicted: room for it at once
                self.step.caches.make_room(state, protect_last + decode_room)
                question_ahead = False
            logits = self._step(state, ids, False, evict=evict, protect=protect, prompt=prompt)[:, -1, :]
            if rows[0].ending_prompt:
                state.last_logits = logits
                for row in rows:
                    row.prompt_tokens = state.seen
                if not decode_evict and decode_room:
                    self.step.caches.make_room(state, decode_room)
            return logits

        def leave(finished: list[int]) -> None:
            decode_s = time.perf_counter() - requests[0].t_first
            stats = requests[0].stats(decode_s, memory, peak_kv_tokens=state.peak_kv_tokens,
                                      kept_tokens=state.cache.length, kv_cache_bytes=own_kept_bytes(state.cache),
                                      peak_kv_bytes=state.peak_kv_bytes,
                                      decode_tokens=max(len(row.out) for row in requests))
            stats.replayed_steps = state.replayed
            stats.extra_forward_tokens = state.extra_forward_tokens
            stats.kv_buffer_bytes = state.kv_buffer_bytes
            windowed = [state.cache.layers[i] for i in self.plan.windowed_layers]
            stats.windowed_kv_bytes = own_bytes(windowed, [layer.length for layer in windowed])
            stats.state_bytes = state.cache.state_nbytes() // max(state.cache.batch_size or 1, 1)
            stats.layer_kinds = self.plan.layer_kinds_label()
            results.append(GenerationResult([row.out for row in requests], stats, state))

        loop.run(forward, leave)
        return results[0]

    @torch.inference_mode()
    def generate_batch(self, prompts: Sequence[Sequence[int] | torch.Tensor],
                       max_new_tokens: int | Sequence[int] | None = None,
                       eos_token_id: int | list[int] | None = None,
                       states: PrefillState | Sequence[PrefillState | None] | None = None, *,
                       protect_last: int | Sequence[int] = 0, decode_evict: bool = True) -> list[GenerationResult]:
        """Independent requests in one batch: ``prompts[i]`` (token ids ``[L_i]``, any lengths) after
        ``states[i]`` (a batch-1 state, e.g. a shared context, read and left as it is; ``None``: none), each
        with its own ``max_new_tokens`` and ``protect_last``. Returns one result per prompt, in order, with
        the tokens, kept set and counters :meth:`generate` gives that request alone (timings and memory are
        the batch's, ``kv_buffer_bytes`` too; ``peak_kv_bytes``/``kv_cache_bytes``: the row's own tokens'), and
        the row's final state (a dynamic cache this engine can continue).

        Rows are aligned on their first token and left-padded within each step; padding is masked and never
        kept, and finished rows leave the batch (kdeval/keydiff/batch/batching.py). Runs eagerly, also on an
        engine that uses CUDA graphs. On a model with recurrent layers (whose states padding would enter), under a
        head-shared pool and with a repeat pass, the requests run one at a time.
        """
        # a pool's mask, a request's repeat pass; a recurrent layer's state, which a row's padding would enter
        if self.plan.shares_heads or self.plan.needs.repeat is not None or self.plan.recurrent:
            return one_at_a_time(self.generate, self.config.max_new_tokens, prompts, max_new_tokens, eos_token_id,
                                 states, protect_last, decode_evict)
        return generate_batch(self.step, prompts, max_new_tokens, eos_token_id, states, protect_last, decode_evict,
                              self.on_batch_step)

    def release(self, state: PrefillState) -> None:
        """Hand back a state the caller is done with; it must not be used again (fork it first to keep it).

        On the graph path its cache, and the CUDA graphs captured on its buffers, serve the next request of
        the same batch size, so a stream of requests captures its graphs once instead of once per request
        (the engine then holds one idle ``budget + chunk`` cache per batch size). Other caches are dropped.
        """
        self.step.caches.release(state)

    def _step(self, state: PrefillState, ids: torch.Tensor, all_logits: bool, evict: bool = True,
              protect: bool = False, prompt: bool = False) -> torch.Tensor:
        """:meth:`Step.run` (a prompt step with :attr:`shared`, when set), then ``on_step``."""
        logits = self.step.run(state, ids, all_logits, evict, protect, self.shared if prompt else None, prompt)
        if self.on_step is not None:
            self.on_step(state)
        return logits
