"""Chunked prefill and greedy decoding with eviction to a hard budget after every chunk and every token.

Per layer and KV head the cache never holds more than ``budget + chunk_size`` tokens (``budget + 1`` while
decoding), whatever the prompt length; a policy with per-layer budgets (``Policy.layer_budgets``, PyramidKV)
makes that bound each layer's own budget, the layers' total staying ``layers * budget``. Positions are
absolute: chunk ``[s, s + t)`` of the prompt is fed with ``position_ids = s .. s + t - 1`` even when only
``budget`` older tokens remain cached, so RoPE sees the true distances (a policy that ``rerotates``,
StreamingLLM's cache, is fed after the cached tokens instead and its kept keys are re-rotated:
kdeval/keydiff/rerotation.py).

Two evaluation protocols run on these steps (``generate``'s ``protect_last`` and ``decode_evict``):

- the KeyDiff paper's (the defaults): every chunk of the whole prompt is evicted to ``N``, and so is every
  generated token;
- kvpress's (``protect_last=len(question)``): the context is prefilled with eviction to ``N`` (at most
  ``N + B`` held), then the question is fed without eviction and *protected*: never evicted afterwards. The
  budget ``N`` counts the unprotected tokens (the context's survivors and the generated tokens); the ``P``
  protected ones are held on top of it, so an evicting step leaves ``min(N, unprotected) + P`` tokens.
  ``decode_evict=False`` stops eviction after the prompt: the cache grows by one token per decode step.

Steps that do not evict run eagerly: a static-layout (graph path) cache is first thawed into a dynamic one
(``BudgetCache.thawed``) and its buffers, with the graphs captured on them, go back to the engine's pool.

A policy that shares a layer's ``H * N`` kept tokens among its KV heads (``PolicyNeeds.shares_heads``, AdaKV)
runs over one pool of ``H * (N + B)`` slots per layer instead (kdeval/keydiff/headpool.py), eagerly.

``generate`` takes rows of one length that share positions; ``generate_batch`` takes independent requests of
any lengths, each as it runs alone (kdeval/keydiff/batching.py, kdeval/keydiff/ragged.py).
"""
from __future__ import annotations

import contextlib
import time
import weakref
from typing import Callable, Sequence

import torch

from kdeval.keydiff.attention import (CAPTURE_IMPL, STATIC_IMPL, AttentionCapture, attention_implementation,
                                     static_mask)
from kdeval.keydiff.batching import BatchView, generate_batch, one_at_a_time
from kdeval.keydiff.cache import BudgetCache, EmptySlots
from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.continuation import check_continuable, checked_layer_budgets
from kdeval.keydiff.eviction import Eviction
from kdeval.keydiff.graphs import CapturedStep
from kdeval.keydiff.headpool import POOL_IMPL, HeadPoolCache
from kdeval.keydiff.memory import PeakMemory
from kdeval.keydiff.policy import Policy, PolicyNeeds
from kdeval.keydiff.queries import capture_queries, query_sources, record_step, rotary_embedding
from kdeval.keydiff.state import GenerationResult, PrefillState, RunStats


class Engine(Eviction):
    """Runs one policy under one budget on one model; reusable across prompts."""

    def __init__(self, model: torch.nn.Module, policy: Policy, config: EngineConfig,
                 on_step: Callable[[PrefillState], None] | None = None,
                 on_batch_step: Callable[[BatchView], None] | None = None, *, store: str = "slot",
                 emulate_graphs: bool = False):
        """``on_step(state)`` runs after every chunk and decode step, once eviction is done (tests, tracing);
        ``on_batch_step(view)`` after every step of :meth:`generate_batch`.

        For tests and ``bench/`` only, not user options: ``store="gather"`` keeps the cache in transformers'
        growing layers, evicted by gathering (the reference the default slot store is checked against);
        ``emulate_graphs`` runs the graph path's static layout with plain calls instead of graph replays (on a
        CPU; on CUDA, the eager reference the captured graphs are checked against)."""
        self.model = model
        self.on_step = on_step
        self.on_batch_step = on_batch_step
        self.policy = policy
        self.config = config
        self.store = store
        self.emulate_graphs = emulate_graphs
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.evicting = policy.evicts and config.budget is not None
        #: tokens each layer keeps (the policy's allocation of N; ``None`` without eviction)
        self.budgets = checked_layer_budgets(policy, config.budget, self.num_layers) if self.evicting else None
        #: every layer keeps N: the static layout, graphs and transformers' own mask apply
        self.uniform = self.budgets is None or len(set(self.budgets)) == 1
        #: what the policy's scores read; the engine derives from it how to run them (graphs, fusion, ties)
        self.policy_needs = policy.needs() if self.evicting else PolicyNeeds()
        self.need = self.policy_needs.attention
        self.query_need = self.policy_needs.queries
        self.rerotate = self.policy_needs.rerotates
        #: a layer's heads share one pool of slots (kdeval/keydiff/headpool.py)
        self.shares_heads = self.policy_needs.shares_heads
        if self.query_need is not None:
            query_sources(model)  # the model must have what the policy reads: refused here, not mid-run
        if self.query_need is not None or self.rerotate:
            rotary_embedding(model)
        self.device = next(model.parameters()).device
        if config.cuda_graphs and self.device.type != "cuda" and not emulate_graphs:
            raise ValueError(f"cuda_graphs: needs a CUDA device (the model is on {self.device.type})")
        graphs = config.cuda_graphs if config.cuda_graphs is not None else self.device.type == "cuda"
        #: graphs imply the static slot layout (same shapes for every full chunk, from the first one on)
        # Graphs run one captured step per chunk shape: not when scores read the host's step count (a graph
        # would freeze it), keep a query window between steps or re-rotate every kept key, nor when layers keep
        # different budgets (the static layout gives every layer N slots).
        self.use_graphs = (graphs and self.evicting and store == "slot" and self.uniform
                           and not self.policy_needs.reads_step and self.query_need is None and not self.rerotate
                           and not self.shares_heads)
        cfg = model.config
        self.group = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self._empty_ranks: dict = {}  # EmptySlots ranks per (slots, dtype, device)
        self._spare: dict[int, BudgetCache] = {}  # released static caches (with their graphs), by batch size

    # ------------------------------------------------------------------ public API

    def new_state(self, batch: int = 1, tokens: int = 0) -> PrefillState:
        """An empty cache; without eviction it is sized for ``tokens`` up front (it still grows if needed).

        On the graph path a cache handed back by :meth:`release` for the same batch size is reused, emptied,
        with the graphs captured on it."""
        spare = self._spare.pop(batch, None)
        if spare is not None:
            spare.reset()
            return PrefillState(spare, 0, torch.empty(0))
        B = self.config.chunk_size
        cap = [b + B for b in self.budgets] if self.evicting else max(tokens, B)
        state_names = self.policy_needs.token_state
        if self.shares_heads:
            cache = HeadPoolCache(self.num_layers, self.store, cap)
        else:
            cache = BudgetCache(self.num_layers, self.store, cap, state_names,
                                static_base=self.config.budget if self.use_graphs else None)
        cache.owner = weakref.ref(self)  # a fork's deep copy keeps it (weak references copy as they are)
        cache.rerotated = self.rerotate
        return PrefillState(cache, 0, torch.empty(0))

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, state: PrefillState | None = None,
                collect_logits: bool = False, evict: bool = True) -> PrefillState:
        """Feed ``input_ids [batch, L]`` chunk by chunk after ``state`` (a fresh cache if ``None``).

        ``evict=False``: no eviction after these chunks, and their tokens are protected (never evicted by
        later steps, held on top of the budget): kvpress's question."""
        input_ids = self._check_ids(input_ids, state)
        return self._prefill(input_ids, state, collect_logits, PeakMemory(self.device), reserve=0, evict=evict)

    def _prefill(self, input_ids: torch.Tensor, state: PrefillState | None, collect_logits: bool,
                 memory: PeakMemory, reserve: int, evict: bool = True) -> PrefillState:
        """``reserve``: tokens that will follow (generation), so a non-evicting cache is allocated once; without
        eviction (``evict=False``) the cache makes room for these tokens and ``reserve`` more at once."""
        state = state or self.new_state(input_ids.shape[0], input_ids.shape[1] + reserve)
        if not evict:
            self._make_room(state, input_ids.shape[1] + reserve)
        B = self.config.chunk_size
        for s in range(0, input_ids.shape[1], B):
            logits = self._step(state, input_ids[:, s : s + B], collect_logits, evict=evict, protect=not evict)
            memory.sample()
            if collect_logits:
                state.chunk_logits.append(logits.float().cpu())
            state.last_logits = logits[:, -1, :]
        return state

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int | None = None,
                 eos_token_id: int | list[int] | None = None, state: PrefillState | None = None, *,
                 protect_last: int = 0, decode_evict: bool = True) -> GenerationResult:
        """Prefill ``input_ids [batch, L]`` (after ``state`` if given), then decode greedily.

        ``protect_last``: the last ``protect_last`` prompt tokens (the question) are fed after the others
        without eviction and stay protected (:meth:`prefill` with ``evict=False``); 0: every chunk is evicted.
        ``decode_evict``: evict after every generated token (protected tokens stay); ``False``: the cache
        grows by one token per decode step.
        """
        max_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        input_ids = self._check_ids(input_ids, state, max_new)
        if not isinstance(protect_last, int) or not 0 <= protect_last <= input_ids.shape[1]:
            raise ValueError(f"protect_last: expected 0 .. {input_ids.shape[1]} prompt tokens, got {protect_last!r}")
        memory = PeakMemory(self.device)
        t0 = time.perf_counter()
        split = input_ids.shape[1] - protect_last
        # a decode step holds one more token than the cache keeps; without eviction each one stays
        decode_room = 0 if max_new < 2 else (1 if decode_evict else max_new - 1)
        if split:
            state = self._prefill(input_ids[:, :split], state, False, memory, reserve=protect_last + max_new)
        if protect_last:
            state = self._prefill(input_ids[:, split:], state, False, memory, reserve=decode_room, evict=False)
        if not decode_evict and decode_room:
            self._make_room(state, decode_room)
        prompt_tokens = state.seen
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        batch = input_ids.shape[0]
        out: list[list[int]] = [[] for _ in range(batch)]
        done = [False] * batch
        ttft = 0.0
        t_first = time.perf_counter()
        logits = state.last_logits
        for i in range(max_new):
            nxt = logits.argmax(dim=-1)  # [batch]
            tokens = nxt.tolist()  # the host needs them (eos); on CUDA this also waits for the device
            if i == 0:
                t_first = time.perf_counter()
                ttft = t_first - t0
            for r, tok in enumerate(tokens):
                if not done[r]:
                    if tok in eos:
                        done[r] = True
                    else:
                        out[r].append(tok)
            if all(done) or i == max_new - 1:
                break
            logits = self._step(state, nxt.view(batch, 1), False, evict=decode_evict)[:, -1, :]
            memory.sample()
        decode_s = time.perf_counter() - t_first
        n_decoded = max(len(r) for r in out) if out else 0
        stats = RunStats(
            prompt_tokens=prompt_tokens,
            ttft_s=ttft,
            decode_s=decode_s,
            decode_tokens=n_decoded,
            decode_tokens_per_s=(n_decoded - 1) / decode_s if n_decoded > 1 and decode_s > 0 else 0.0,
            peak_kv_tokens=state.peak_kv_tokens,
            kept_tokens=state.cache.length,
            peak_memory_bytes=memory.peak_bytes,
            kv_cache_bytes=state.cache.nbytes(),
            peak_kv_bytes=state.peak_kv_bytes,
            memory_kind=memory.kind,
        )
        return GenerationResult(out, stats, state)

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
        the batch's; ``peak_kv_bytes``/``kv_cache_bytes``: the row's share of the batch's K/V buffers), and
        the row's final state (a dynamic cache this engine can continue).

        Rows are aligned on their first token and left-padded within each step; padding is masked and never
        kept, and finished rows leave the batch (kdeval/keydiff/batching.py). Runs eagerly, also on an
        engine that uses CUDA graphs.
        """
        if self.shares_heads:
            return one_at_a_time(self, prompts, max_new_tokens, eos_token_id, states, protect_last, decode_evict)
        return generate_batch(self, prompts, max_new_tokens, eos_token_id, states, protect_last, decode_evict,
                              self.on_batch_step)

    def release(self, state: PrefillState) -> None:
        """Hand back a state the caller is done with; it must not be used again (fork it first to keep it).

        On the graph path its cache, and the CUDA graphs captured on its buffers, serve the next request of
        the same batch size, so a stream of requests captures its graphs once instead of once per request
        (the engine then holds one idle ``budget + chunk`` cache per batch size). Other caches are dropped.
        """
        state.check_usable()
        state.released = True
        self._pool(state.cache)

    def _pool(self, cache: BudgetCache) -> None:
        """Keep ``cache`` for the next request of its batch size when it is one of this engine's static ones."""
        mine = cache.owner is not None and cache.owner() is self
        if mine and self.use_graphs and cache.static_base is not None and cache.batch_size is not None:
            self._spare[cache.batch_size] = cache

    # ------------------------------------------------------------------ internals

    def _check_ids(self, input_ids: torch.Tensor, state: PrefillState | None, max_new: int = 0) -> torch.Tensor:
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids: expected a non-empty [batch, tokens] tensor, got shape {tuple(input_ids.shape)}")
        if state is not None:
            check_continuable(self, state)
        total = (state.seen if state else 0) + input_ids.shape[1] + max_new
        if self.max_context and total > self.max_context:
            raise ValueError(
                f"prompt: {total} tokens (prompt + cached + max_new_tokens) exceed the model's context of "
                f"{self.max_context} tokens (max_position_embeddings)"
            )
        return input_ids.to(self.device)

    def _make_room(self, state: PrefillState, tokens: int) -> None:
        """Room for ``tokens`` more without eviction: a static-layout cache is thawed into a dynamic one (its
        buffers and graphs go back to the pool), a slot cache grows its buffers once."""
        cache = state.cache
        if cache.static_base is not None:
            state.cache = cache.thawed(cache.length + tokens)
            if cache.graphs or cache.batch_size not in self._spare:  # keep a pooled cache with graphs
                self._pool(cache)
        else:
            cache.reserve_more(tokens)

    def _step(self, state: PrefillState, ids: torch.Tensor, all_logits: bool, evict: bool = True,
              protect: bool = False) -> torch.Tensor:
        """One forward of ``ids [batch, t]`` at positions ``seen .. seen + t - 1``, then eviction to the budget
        plus the protected tokens (``evict=False``: none; ``protect``: these tokens become protected)."""
        t = ids.shape[1]
        if not evict and state.cache.static_base is not None:
            self._make_room(state, t)
        state.cache.rerotated = self.rerotate  # _check_ids let it through: the schemes agree so far
        state.peak_kv_tokens = max(state.peak_kv_tokens, state.cache.length + t)  # held during this forward
        graph = self._graph_for(state, ids, all_logits) if evict else None
        if graph is not None:
            logits = graph.run(self, state.cache, ids, state.seen)
        else:
            positions = torch.arange(state.seen, state.seen + t, device=self.device)
            logits = self._device_step(state.cache, ids, positions, state.seen + t, state.steps, all_logits,
                                       evict=evict, protected=tuple(state.protected))
        state.peak_kv_bytes = max(state.peak_kv_bytes, state.cache.held_nbytes())
        if protect:
            state.protect(state.seen, state.seen + t)
        state.seen += t
        state.steps += 1
        if self.on_step is not None:
            self.on_step(state)
        return logits

    def _device_step(self, cache: BudgetCache, ids: torch.Tensor, positions: torch.Tensor,
                     seen_after: int | torch.Tensor, steps: int, all_logits: bool, evict: bool = True,
                     protected: tuple[tuple[int, int], ...] = ()) -> torch.Tensor:
        """Forward + eviction with no host synchronisation: capturable as one CUDA graph (static layout).

        ``positions [t]`` and ``seen_after`` (an int, or a 0-d device tensor under graphs) are the only inputs
        that change from chunk to chunk. ``evict=False`` and ``protected`` (position ranges never evicted, on
        top of the budget) take the eager path only: a dynamic-layout cache.
        """
        t = ids.shape[1]
        cache.begin_chunk(positions)
        capture = None
        if self.need is not None:
            capture = AttentionCapture(self.need, float32_logits=self.config.score_precision == "float32")
        kwargs = {"kdeval_capture": capture} if capture is not None else {}
        impl = CAPTURE_IMPL if capture is not None else None
        if not self.uniform:
            # Layers hold different numbers of tokens: transformers builds one mask from layer 0's length, so
            # attention takes none and is lower-right causal over each layer's own keys (the static layout's
            # function with no mask, which also captures the rows a policy needs).
            impl = STATIC_IMPL
        if isinstance(cache, HeadPoolCache):
            impl = POOL_IMPL  # one mask per layer from the slots' head tags (its attention function builds it)
            kwargs["kdeval_pool"] = cache
        empty = None
        if cache.static_base is not None:
            impl = STATIC_IMPL
            n = cache.static_base
            cached = (seen_after - t).clamp(max=n) if isinstance(seen_after, torch.Tensor) else min(seen_after - t, n)
            phase = self.phase(cache, t)  # from host bookkeeping, exact
            empty = EmptySlots(n, t, cached, ids.device, self._empty_ranks, room=phase == "room")
            # A full head needs no mask (lower-right causal); a 4-D mask reaches the attention function as it is.
            if phase != "full":
                kwargs["attention_mask"] = static_mask(n, t, cached, ids.device, self.group)
        queries = capture_queries(self.model) if self.query_need is not None else contextlib.nullcontext()
        with attention_implementation(self.model, impl), queries as captured:
            out = self.model(
                input_ids=ids,
                position_ids=self._rope_positions(cache, positions).unsqueeze(0).expand(ids.shape[0], t),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
                **kwargs,
            )
        recent = None
        if self.query_need is not None:
            recent = record_step(self.model, self.query_need, cache, captured, positions.unsqueeze(0), seen_after)
        self._evict(cache, t, seen_after, steps, capture, empty, evict, protected, recent)
        return out.logits

    def _rope_positions(self, cache: BudgetCache, positions: torch.Tensor) -> torch.Tensor:
        """The RoPE positions ``[t]`` of a chunk at absolute ``positions [t]``: the same, or, for a policy that
        re-rotates, right after the ``cache.length`` cached tokens."""
        if not self.rerotate:
            return positions
        return torch.arange(cache.length, cache.length + positions.shape[0], device=positions.device)

    def _graph_for(self, state: PrefillState, ids: torch.Tensor, all_logits: bool):
        """The captured step for this cache and chunk shape, when graphs apply (static layout); else ``None``."""
        if not self.use_graphs or all_logits or state.cache.static_base is None:  # thawed: eager
            return None
        t = ids.shape[1]
        if t not in (self.config.chunk_size, 1):
            return None
        key = (ids.shape[0], t, self.phase(state.cache, t))
        graph = state.cache.graphs.get(key)
        if graph is None or graph.owner() is not self:  # another engine's graph ran its policy and settings
            graph = CapturedStep(self, ids.shape[0], t)
            state.cache.graphs[key] = graph
        return graph

    def phase(self, cache: BudgetCache, t: int) -> str:
        """The static layout's step kind for ``t`` more tokens, each its own graph: ``room`` (the empty head slots
        take the whole chunk: nothing to score), ``partial`` (some empty slots, some eviction) or ``full``."""
        n = self.config.budget
        return "full" if cache.length >= n else "room" if cache.length + t <= n else "partial"
