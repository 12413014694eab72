"""Chunked prefill and greedy decoding with eviction to a hard budget after every chunk and every token.

Per layer and KV head the cache never holds more than ``budget + chunk_size`` tokens (``budget + 1`` while
decoding), whatever the prompt length. Positions are absolute: chunk ``[s, s + t)`` of the prompt is fed with
``position_ids = s .. s + t - 1`` even when only ``budget`` older tokens remain cached, so RoPE sees the true
distances.
"""
from __future__ import annotations

import contextlib
import functools
import time
import weakref
from typing import Callable

import torch

from kdeval.keydiff.attention import (CAPTURE_IMPL, STATIC_IMPL, AttentionCapture, attention_implementation,
                                     static_mask)
from kdeval.keydiff.blocks import CompiledBlocks
from kdeval.keydiff.cache import BudgetCache, EmptySlots, compact, move_tail
from kdeval.keydiff.compiling import compile_fn
from kdeval.keydiff.config import EngineConfig
from kdeval.keydiff.flex_static import static_block_mask
from kdeval.keydiff.graphs import CapturedStep
from kdeval.keydiff.memory import PeakMemory
from kdeval.keydiff.policy import Policy, ScoreContext, lowest_oldest_first, protect
from kdeval.keydiff.state import GenerationResult, PrefillState, RunStats

class Engine:
    """Runs one policy under one budget on one model; reusable across prompts."""

    def __init__(self, model: torch.nn.Module, policy: Policy, config: EngineConfig,
                 on_step: Callable[[PrefillState], None] | None = None):
        """``on_step(state)`` runs after every chunk and decode step, once eviction is done (tests, tracing)."""
        self.model = model
        self.on_step = on_step
        self.policy = policy
        self.config = config
        cfg = model.config
        self.num_layers = cfg.num_hidden_layers
        self.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.evicting = policy.evicts and config.budget is not None
        if self.evicting:
            policy.check_budget(config.budget)
        self.need = policy.attention_need() if self.evicting else None
        self.device = next(model.parameters()).device
        if config.cuda_graphs and self.device.type != "cuda" and not config.emulate_graphs:
            raise ValueError(f"cuda_graphs: needs a CUDA device (the model is on {self.device.type})")
        graphs = config.cuda_graphs if config.cuda_graphs is not None else self.device.type == "cuda"
        #: graphs imply the static slot layout (same shapes for every full chunk, from the first one on)
        self.use_graphs = graphs and self.evicting and config.store == "slot" and policy.graph_safe
        self.fused = self.use_graphs and config.fuse_layers and policy.layer_independent
        self.compiled_scoring = self.use_graphs and config.compile_scoring
        self._score = _compiled_score() if self.compiled_scoring else _score
        self._blocks = CompiledBlocks(model) if self.use_graphs and config.compile_blocks else None
        dtype = next(model.parameters()).dtype
        if self.use_graphs and config.flex_attention and self.device.type == "cpu" and dtype == torch.float64:
            raise ValueError("flex_attention: FlexAttention on a CPU takes float32, float16 or bfloat16 models; "
                             "this one is float64")
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
        cap = (self.config.budget + self.config.chunk_size) if self.evicting else max(tokens, self.config.chunk_size)
        state_names = self.policy.slot_state if self.evicting else ()
        cache = BudgetCache(self.num_layers, self.config.store, cap, state_names,
                            static_base=self.config.budget if self.use_graphs else None, fused=self.fused)
        cache.owner = weakref.ref(self)  # a fork's deep copy keeps it (weak references copy as they are)
        return PrefillState(cache, 0, torch.empty(0))

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, state: PrefillState | None = None,
                collect_logits: bool = False) -> PrefillState:
        """Feed ``input_ids [batch, L]`` chunk by chunk after ``state`` (a fresh cache if ``None``)."""
        input_ids = self._check_ids(input_ids, state)
        return self._prefill(input_ids, state, collect_logits, PeakMemory(self.device), reserve=0)

    def _prefill(self, input_ids: torch.Tensor, state: PrefillState | None, collect_logits: bool,
                 memory: PeakMemory, reserve: int) -> PrefillState:
        """``reserve``: tokens that will follow (generation), so a non-evicting cache is allocated once."""
        state = state or self.new_state(input_ids.shape[0], input_ids.shape[1] + reserve)
        B = self.config.chunk_size
        for s in range(0, input_ids.shape[1], B):
            logits = self._step(state, input_ids[:, s : s + B], collect_logits)
            memory.sample()
            if collect_logits:
                state.chunk_logits.append(logits.float().cpu())
            state.last_logits = logits[:, -1, :]
        return state

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int | None = None,
                 eos_token_id: int | list[int] | None = None, state: PrefillState | None = None) -> GenerationResult:
        """Prefill ``input_ids [batch, L]`` (after ``state`` if given), then decode greedily."""
        max_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        input_ids = self._check_ids(input_ids, state, max_new)
        memory = PeakMemory(self.device)
        t0 = time.perf_counter()
        state = self._prefill(input_ids, state, False, memory, reserve=max_new)
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
            logits = self._step(state, nxt.view(batch, 1), False)[:, -1, :]
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
        )
        return GenerationResult(out, stats, state)

    def release(self, state: PrefillState) -> None:
        """Hand back a state the caller is done with; it must not be used again (fork it first to keep it).

        On the graph path its cache, and the CUDA graphs captured on its buffers, serve the next request of
        the same batch size, so a stream of requests captures its graphs once instead of once per request
        (the engine then holds one idle ``budget + chunk`` cache per batch size). Other caches are dropped.
        """
        state.check_usable()
        state.released = True
        cache = state.cache
        mine = cache.owner is not None and cache.owner() is self
        if mine and self.use_graphs and cache.batch_size is not None:
            self._spare[cache.batch_size] = cache

    # ------------------------------------------------------------------ internals

    def _check_ids(self, input_ids: torch.Tensor, state: PrefillState | None, max_new: int = 0) -> torch.Tensor:
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids: expected a non-empty [batch, tokens] tensor, got shape {tuple(input_ids.shape)}")
        if state is not None:
            state.check_usable()
        if state is not None and state.cache.static_base != (self.config.budget if self.use_graphs else None):
            raise ValueError("state: its cache was laid out by an engine with other graph/store settings; "
                             "continue it with the engine that made it")
        wanted = self.policy.slot_state if self.evicting else ()
        if state is not None and set(wanted) - set(state.cache.state_names):
            raise ValueError(f"state: its cache keeps the per-token state {list(state.cache.state_names)}, policy "
                             f"'{self.policy.name}' needs {list(wanted)}; continue it with the policy that made it")
        total = (state.seen if state else 0) + input_ids.shape[1] + max_new
        if self.max_context and total > self.max_context:
            raise ValueError(
                f"prompt: {total} tokens (prompt + cached + max_new_tokens) exceed the model's context of "
                f"{self.max_context} tokens (max_position_embeddings)"
            )
        return input_ids.to(self.device)

    def _step(self, state: PrefillState, ids: torch.Tensor, all_logits: bool) -> torch.Tensor:
        """One forward of ``ids [batch, t]`` at positions ``seen .. seen + t - 1``, then eviction to the budget."""
        t = ids.shape[1]
        state.peak_kv_tokens = max(state.peak_kv_tokens, state.cache.length + t)  # held during this forward
        graph = self._graph_for(state, ids, all_logits)
        if graph is not None:
            logits = graph.run(self, state.cache, ids, state.seen)
        else:
            positions = torch.arange(state.seen, state.seen + t, device=self.device)
            logits = self._device_step(state.cache, ids, positions, state.seen + t, state.steps, all_logits)
        state.seen += t
        state.steps += 1
        if self.on_step is not None:
            self.on_step(state)
        return logits

    def _device_step(self, cache: BudgetCache, ids: torch.Tensor, positions: torch.Tensor,
                     seen_after: int | torch.Tensor, steps: int, all_logits: bool) -> torch.Tensor:
        """Forward + eviction with no host synchronisation: capturable as one CUDA graph (static layout).

        ``positions [t]`` and ``seen_after`` (an int, or a 0-d device tensor under graphs) are the only inputs
        that change from chunk to chunk.
        """
        t = ids.shape[1]
        cache.begin_chunk(positions)
        capture = None
        if self.need is not None:
            capture = AttentionCapture(self.need, float32_logits=self.config.score_precision == "float32")
        kwargs = {"kdeval_capture": capture} if capture is not None else {}
        impl = CAPTURE_IMPL if capture is not None else None
        empty = None
        if cache.static_base is not None:
            impl = STATIC_IMPL
            n = cache.static_base
            cached = (seen_after - t).clamp(max=n) if isinstance(seen_after, torch.Tensor) else min(seen_after - t, n)
            phase = self.phase(cache, t)  # from host bookkeeping, exact
            empty = EmptySlots(n, t, cached, ids.device, self._empty_ranks, room=phase == "room")
            flex = self.config.flex_attention and t in (self.config.chunk_size, 1)  # the graphs' shapes only
            if flex:
                kwargs["kdeval_flex"] = static_block_mask(n, t, cached, ids.device)
            elif phase == "full" and self.config.attention_splits:
                kwargs["kdeval_splits"] = self.config.attention_splits
            # A full head needs no mask (lower-right causal); with flex only captured rows read the dense one.
            # A 4-D mask reaches the attention function as it is.
            if phase != "full" and (capture is not None or not flex):
                kwargs["attention_mask"] = static_mask(n, t, cached, ids.device, self.group)
        blocks = self._blocks.active() if self._blocks is not None else contextlib.nullcontext()
        with attention_implementation(self.model, impl), blocks:
            out = self.model(
                input_ids=ids,
                position_ids=positions.unsqueeze(0).expand(ids.shape[0], t),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
                **kwargs,
            )
        self._evict(cache, t, seen_after, steps, capture, empty)
        return out.logits

    def _graph_for(self, state: PrefillState, ids: torch.Tensor, all_logits: bool):
        """The captured step for this cache and chunk shape, when graphs apply (static layout); else ``None``."""
        if not self.use_graphs or all_logits:
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

    def _evict(self, cache: BudgetCache, t: int, seen: int | torch.Tensor, steps: int,
               capture: AttentionCapture | None, empty: EmptySlots | None = None) -> None:
        """Score and free slots per layer. ``empty``: the static layout's empty slots (``None`` otherwise)."""
        if cache.fused is not None:
            self._evict_fused(cache, t, seen, steps, capture, empty)
            return
        budget = self.config.budget
        for idx, layer in enumerate(cache.layers):
            m = budget + t if empty is not None else layer.length + layer.pending
            if not self.evicting:
                layer.evict(None)
                continue
            keys, positions, pstate = layer.view()
            ctx = ScoreContext(idx, positions, seen, t, capture.by_layer.get(idx) if capture else None, pstate, steps)
            self.policy.observe(ctx)
            if empty is not None and empty.room_slots is not None:
                layer.commit_into(empty.room_slots)
                continue
            if m <= budget:
                layer.evict(None)
                continue
            layer.evict(self._choose(keys, ctx, m - budget, empty))
        if capture is not None:
            capture.clear()

    def _choose(self, keys: torch.Tensor, ctx: ScoreContext, k: int, empty: EmptySlots | None) -> torch.Tensor:
        """The ``k`` slots to free per row of ``keys [rows, h, slots, d]``: the policy's scores, the protected
        positions raised, empty slots (static layout) lowered, then the ``k`` lowest → ``[rows, h, k]``."""
        budget = self.config.budget
        scores = self._score(self.policy, keys, ctx)
        scores = protect(scores, ctx.positions, ctx.seen, self.policy.n_sink(), self.policy.n_recent(budget))
        if empty is not None:
            scores = empty.ranked(scores)
        if self.policy.ties:
            # Scores with exact ties (pooled ones): among equal scores the oldest position goes first (topk's
            # own choice among ties depends on the array's layout), so the kept set depends neither on which
            # slot a token occupies nor on empty slots.
            return lowest_oldest_first(scores, ctx.positions, k, ctx.position_order)
        return torch.topk(scores, k, dim=-1, largest=False, sorted=False).indices

    def _evict_fused(self, cache: BudgetCache, t: int, seen: int | torch.Tensor, steps: int,
                     capture: AttentionCapture | None, empty: EmptySlots) -> None:
        """The static layout's eviction for all layers at once, over the cache's shared buffers: the same
        scoring, protection and selection as :meth:`_evict`, on ``layers * batch`` rows."""
        budget = self.config.budget
        m = budget + t
        buffers = cache.fused
        keys, positions = buffers["keys"][:, :, :m], buffers["positions"][:, :, :m]
        pstate = {n: buffers[f"state.{n}"][:, :, :m] for n in self.policy.slot_state}
        attention = None
        if capture is not None:
            attention = torch.cat([capture.by_layer[i] for i in range(len(cache.layers))], dim=0)
            capture.clear()
        ctx = ScoreContext(-1, positions, seen, t, attention, pstate, steps)
        self.policy.observe(ctx)
        if empty.room_slots is not None:
            move_tail(list(buffers.values()), empty.room_slots, budget)
        else:
            compact(list(buffers.values()), self._choose(keys, ctx, t, empty), budget)
        cache.advance_static(t)


def _score(policy: Policy, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
    return policy.score(keys, ctx)


@functools.cache
def _compiled_score():
    """One compiled :func:`_score` per process: its guards are on the policy's class and parameters, not on the
    instance, so new engines reuse it; a second shape makes it compile a dynamic-shape version."""
    return compile_fn(_score)
