"""Independent requests in one batch (``Engine.generate_batch``): each row as it would run alone.

Every row follows exactly the steps ``Engine.generate`` takes for it at batch 1: its prompt is cut into chunks
of ``B`` from *its own* first token (after its own prefilled state, if any), the protected question last, then
one step per generated token. The rows advance in lockstep, one step of their own each per forward, so a
shorter prompt starts decoding while longer ones are still prefilling (a row's decode token then rides in a
step of ``B`` columns, padded: no forward is spent on idle rows). Rows are thus aligned on their first token,
as right padding aligns them; within a step each row's tokens are left-padded (kdeval/keydiff/ragged.py says
why). Each row keeps its own absolute positions (its first token is position 0, or its state's next one), its
own budget and kept set, and stops at its own eos or generation length; a finished row leaves the batch.

Requests run eagerly (no CUDA graphs): the shapes change from step to step. A state prefilled on the graph
path is read as it is; a row's resulting state is a dynamic cache the same engine can continue.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from kdeval.keydiff.attention import RAGGED_IMPL, AttentionCapture, attention_implementation
from kdeval.keydiff.decoding import Feed, GenerationLoop, Request, check_protect, eos_ids, prompt_steps
from kdeval.keydiff.memory import PeakMemory
from kdeval.keydiff.plan import check_ids
from kdeval.keydiff.queries import QueryWindow, capture_queries, record_step
from kdeval.keydiff.ragged import RaggedCache, RaggedStep
from kdeval.keydiff.state import GenerationResult, PrefillState

if TYPE_CHECKING:
    from kdeval.keydiff.step import Step

PAD_ID = 0  # the token fed at padding columns (masked: any id does)


@dataclass
class _Row(Request):
    """A request of the batch, with the counters of its own cache (``state``: seen, steps, protected ranges,
    peaks, last prompt logits; its cache is filled in when it leaves the batch)."""

    state: PrefillState | None = None


class BatchView:
    """What ``Engine(on_batch_step=...)`` sees after every step of a batch: ``requests[r]`` is the request
    (its index in the call) in row ``r``; ``seen[r]`` its tokens processed."""

    def __init__(self, cache: RaggedCache, requests: list[int], seen: list[int]):
        self.cache, self.requests, self.seen = cache, requests, seen

    def kept_positions(self, request: int) -> list[torch.Tensor]:
        """Per layer, the sorted absolute positions the request's row holds: ``[1, kv_heads, tokens]``."""
        r = self.requests.index(request)
        return [layer.positions[r : r + 1, :, : lengths[r]].sort(dim=-1).values.clone()
                for layer, lengths in zip(self.cache.layers, self.cache.lengths)]


def _as_ids(prompt, i: int) -> torch.Tensor:
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids, got shape {tuple(ids.shape)}")
    return ids


def _per_row(name: str, value, n: int) -> list:
    if isinstance(value, (int, type(None))) and not isinstance(value, bool):
        return [value] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"{name}: expected one value per prompt ({n}), got {len(value)}")
    return value


def _capacity(runner: "Step", rows: list[_Row], lengths: list[int], decode_evict: bool,
              budget: int | None) -> int:
    """Slots a layer that keeps ``budget`` can need: over the batch's steps, the most a row holds before the
    step (where the step's columns land) plus the step's widest row (a row's ``j``-th step runs in the batch's
    ``j``-th forward)."""
    base: list[int] = []  # per forward: the most a row holds before it
    width: list[int] = []  # per forward: its widest row
    for row, n in zip(rows, lengths):
        held = row.state.n_protected
        steps = [(ids.shape[0], ev, pr) for ids, ev, pr in row.steps]
        steps += [(1, decode_evict, False)] * max(row.max_new - 1, 0)
        for j, (t, ev, pr) in enumerate(steps):
            if j == len(base):
                base.append(0)
                width.append(1)
            base[j], width[j] = max(base[j], n), max(width[j], t)
            n = min(budget + held, n + t) if runner.plan.evicting and ev else n + t
            held += t if pr else 0
    return max(b + w for b, w in zip(base, width))


def _row_state(runner: "Step", cache: RaggedCache, r: int, row: _Row) -> PrefillState:
    """Row ``r`` as a batch-1 state the engine can continue (a dynamic cache of the engine's layers)."""
    out = runner.new_cache([lengths[r] for lengths in cache.lengths])
    for layer, (k, v, p, st) in zip(out.layers, cache.row(r)):
        layer.load(k, v, p, st)
    out.thawed_from = runner.plan.config.budget if runner.plan.use_graphs else None
    out.rerotated = runner.plan.rerotate
    if cache.query_window is not None:
        out.query_window = cache.query_window.rows(torch.tensor([r], device=runner.plan.device))
    row.state.cache = out
    return row.state


def _load(cache: RaggedCache, states: list[PrefillState | None], rows: int, window: int | None) -> None:
    """Allocate the buffers for ``rows`` rows and copy every start state's valid tokens into its row (and its
    recent queries, for a policy that keeps ``window`` of them)."""
    if window is not None:
        cache.query_window = QueryWindow(window)
        for r, state in enumerate(states):
            cache.query_window.load_row(r, state.cache.query_window if state is not None else None, rows)
    first = next((s for s in states if s is not None and s.cache.length), None)
    if first is None:  # only empty states: the first forward allocates
        return
    for layer, src in zip(cache.layers, first.cache.layers):
        k, _, _ = src.view()
        v = src.values
        layer.allocate(rows, k.shape[1], k.shape[3], v.shape[3], k.dtype, k.device)
    for r, state in enumerate(states):
        if state is None or not state.cache.length:
            continue

        def layers(state=state):
            for src in state.cache.layers:
                k, p, st = src.view()
                yield k, src.values[:, :, : k.shape[2]], p, st

        cache.load_row(r, layers())


def _requests(default_max_new: int, prompts: Sequence, max_new_tokens, states, protect_last) -> tuple[list, list, list]:
    """The per-request start states, generation lengths and protected counts of a ``generate_batch`` call,
    broadcast to one per prompt and checked (``ValueError`` naming the argument and the request)."""
    n = len(prompts)
    if n == 0:
        raise ValueError("prompts: expected at least one prompt")
    max_new = _per_row("max_new_tokens", default_max_new if max_new_tokens is None else max_new_tokens, n)
    starts = [states] * n if isinstance(states, PrefillState) else _per_row("states", states, n)
    protect = _per_row("protect_last", protect_last, n)
    for i, (m, state) in enumerate(zip(max_new, starts)):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"max_new_tokens[{i}]: must be an integer >= 0, got {m!r}")
        if state is not None and (not isinstance(state, PrefillState) or state.last_logits.shape[0] > 1):
            raise ValueError(f"states[{i}]: expected a batch-1 PrefillState or None")
    return starts, max_new, protect


def generate_batch(runner: "Step", prompts: Sequence, max_new_tokens, eos_token_id, states, protect_last,
                   decode_evict: bool, on_batch_step: Callable[[BatchView], None] | None) -> list[GenerationResult]:
    """See ``Engine.generate_batch``."""
    n_req = len(prompts)
    starts, max_new, protect = _requests(runner.plan.config.max_new_tokens, prompts, max_new_tokens, states,
                                         protect_last)
    ids = [_as_ids(p, i) for i, p in enumerate(prompts)]
    impl = runner.model.config._attn_implementation
    if impl not in ("sdpa", RAGGED_IMPL):
        raise ValueError(f"prompts: a batch of requests runs on SDPA with a padding mask; the model uses {impl!r} "
                         f"(load it with attn_implementation='sdpa', or send one request at a time)")
    rows: list[_Row] = []
    for i in range(n_req):
        state = starts[i]
        try:
            ids[i] = check_ids(runner.plan, ids[i].unsqueeze(0), state, max_new[i])[0]
        except ValueError as e:
            raise ValueError(f"prompts[{i}]: {e}") from None
        p = check_protect(protect[i], ids[i].shape[0], f"protect_last[{i}]")
        counters = PrefillState(None, state.seen, None, state.peak_kv_tokens, state.steps,
                                protected=list(state.protected), peak_kv_bytes=state.peak_kv_bytes) if state else \
            PrefillState(None, 0, None)
        rows.append(_Row(i, prompt_steps(ids[i], runner.plan.config.chunk_size, p), max_new[i], state=counters))
    cache = RaggedCache(runner.plan.num_layers, 1, runner.plan.needs.token_state)
    budgets = runner.plan.budgets or [None] * runner.plan.num_layers
    cache.lengths = [[s.cache.layers[i].length if s is not None else 0 for s in starts] for i in range(len(budgets))]
    capacity: dict = {}  # one computation per distinct (budget, lengths)
    for layer, budget, lengths in zip(cache.layers, budgets, cache.lengths):
        key = (budget, tuple(lengths))
        if key not in capacity:
            capacity[key] = _capacity(runner, rows, lengths, decode_evict, budget)
        layer.capacity = capacity[key]
    if any(s is not None for s in starts):
        _load(cache, starts, n_req, runner.plan.needs.queries.window if runner.plan.needs.queries is not None else None)
    return _Batch(runner, cache, rows, eos_ids(eos_token_id), decode_evict, on_batch_step).run()


def one_at_a_time(generate: Callable[..., GenerationResult], default_max_new: int, prompts: Sequence,
                  max_new_tokens, eos_token_id, states, protect_last,
                  decode_evict: bool) -> list[GenerationResult]:
    """``Engine.generate_batch`` for a policy whose KV heads share a pool of slots (``PolicyNeeds.shares_heads``,
    kdeval/keydiff/headpool.py): each request by ``Engine.generate``, alone, so each gets exactly its batch-1
    result (a ragged step over a pool would need every row's own head counts; the batch's throughput is lost,
    and ``on_batch_step`` is not called)."""
    starts, max_new, protect = _requests(default_max_new, prompts, max_new_tokens, states, protect_last)
    out = []
    for i, prompt in enumerate(prompts):
        state = starts[i]
        try:
            out.append(generate(_as_ids(prompt, i).unsqueeze(0), max_new[i], eos_token_id,
                                       state.fork() if state is not None else None, protect_last=protect[i],
                                       decode_evict=decode_evict))
        except ValueError as e:
            raise ValueError(f"prompts[{i}]: {e}") from None
    return out


class _Batch:
    """The ragged steps of one ``generate_batch`` call, run by the generation loop; finished rows leave."""

    def __init__(self, runner: "Step", cache: RaggedCache, rows: list[_Row], eos: set[int], decode_evict: bool,
                 on_batch_step):
        self.runner, self.cache, self.rows = runner, cache, rows
        self.on_batch_step = on_batch_step
        self.memory = PeakMemory(runner.plan.device)
        self.loop = GenerationLoop(rows, eos, decode_evict, self.memory, rows_leave=True)
        self.results: list[GenerationResult | None] = [None] * len(rows)
        self.share = 0  # the rows' share of the K/V buffers' bytes after the last step

    def _keep(self, row: _Row, n: int, t: int, evict: bool, budget: int | None) -> int:
        if not (self.runner.plan.evicting and evict):
            return n + t
        return min(budget + row.state.n_protected, n + t)

    def _geometries(self, rows: list[_Row], t: list[int], feeds: list[Feed]) -> list[RaggedStep]:
        """Each layer's :class:`RaggedStep` for a step of ``t[r]`` tokens per row (layers whose rows hold and keep
        the same counts share one)."""
        eng = self.runner
        seen = [row.state.seen for row in rows]
        by_counts: dict = {}
        out = []
        for lengths, budget in zip(self.cache.lengths, eng.plan.budgets or [None] * eng.plan.num_layers):
            keep = [self._keep(row, a, b, f[1], budget) for row, a, b, f in zip(rows, lengths, t, feeds)]
            key = (tuple(lengths), tuple(keep))
            if key not in by_counts:
                by_counts[key] = RaggedStep(list(lengths), t, keep, seen, eng.plan.device, eng.plan.rerotate)
            out.append(by_counts[key])
        return out

    def run(self) -> list[GenerationResult]:
        self.loop.run(self._step, self._leave)
        return self.results  # type: ignore[return-value]

    def _step(self, rows: list[_Row], feeds: list[Feed]) -> torch.Tensor:
        """One ragged step of every row (left-padded to the widest) → the last column's logits ``[rows, vocab]``."""
        eng, cache = self.runner, self.cache
        t = [f[0].shape[0] if isinstance(f[0], torch.Tensor) else 1 for f in feeds]
        layer_steps = self._geometries(rows, t, feeds)
        step = layer_steps[0]
        ids = torch.full((step.rows, step.T), PAD_ID, dtype=torch.long, device=eng.plan.device)
        for r, (f, tr) in enumerate(zip(feeds, t)):
            ids[r, step.T - tr :] = f[0]
        for r, (row, b) in enumerate(zip(rows, t)):
            row.state.peak_kv_tokens = max(row.state.peak_kv_tokens,
                                           max(lengths[r] for lengths in cache.lengths) + b)
        steps = [row.state.steps for row in rows]
        steps_arg = steps[0] if len(set(steps)) == 1 else torch.tensor(
            steps, dtype=torch.long, device=eng.plan.device).view(-1, 1, 1)
        logits = self._forward(rows, ids, layer_steps, steps_arg)
        cache.lengths = [list(s.host_keep) for s in layer_steps]
        self.share = cache.nbytes() // step.rows
        for r, (row, f, b) in enumerate(zip(rows, feeds, t)):
            state = row.state
            state.peak_kv_bytes = max(state.peak_kv_bytes, self.share)
            if f[2]:
                state.protect(state.seen, state.seen + b)
            state.seen += b
            state.steps += 1
            if row.ending_prompt:
                state.last_logits = logits[r : r + 1].clone()
                row.prompt_tokens = state.seen
        if self.on_batch_step is not None:
            self.on_batch_step(BatchView(cache, [row.index for row in rows], [row.state.seen for row in rows]))
        return logits

    def _forward(self, rows: list[_Row], ids: torch.Tensor, layer_steps: list[RaggedStep], steps) -> torch.Tensor:
        """The model on ``ids [rows, T]`` under each layer's step mask, then eviction; the last column's logits."""
        eng = self.runner
        capture = None
        if eng.plan.needs.attention is not None:
            capture = AttentionCapture(eng.plan.needs.attention,
                                       float32_logits=eng.plan.config.score_precision == "float32")
        kwargs = {"kdeval_capture": capture} if capture is not None else {}
        step = layer_steps[0]
        masks = {id(s): s.mask() for s in layer_steps}
        if len(masks) > 1:  # the layers' geometries differ: each layer's attention takes its own mask
            kwargs["kdeval_layer_masks"] = [masks[id(s)] for s in layer_steps]
        self.cache.begin_step([s.base for s in layer_steps], step.cache_positions)
        queries = capture_queries(eng.model) if eng.plan.needs.queries is not None else contextlib.nullcontext()
        with attention_implementation(eng.model, RAGGED_IMPL), queries as captured:
            out = eng.model(input_ids=ids, position_ids=step.position_ids, attention_mask=masks[id(step)],
                            past_key_values=self.cache, use_cache=True, logits_to_keep=1, **kwargs)
        recent = None
        if eng.plan.needs.queries is not None:
            recent = record_step(eng.model, eng.plan.needs.queries, self.cache, captured, step.cache_positions[:, 0],
                                 step.seen_after)
        eng.evictor.evict_ragged(self.cache, layer_steps, steps, capture, [row.state.protected for row in rows],
                                 recent)
        return out.logits[:, -1, :]

    def _leave(self, finished: list[int]) -> None:
        """The finished rows' results (each row's own figures, its state with its cache); the others stay."""
        rows = self.loop.rows
        for r in finished:
            row = rows[r]
            stats = row.stats(time.perf_counter() - row.t_first, self.memory,
                              peak_kv_tokens=row.state.peak_kv_tokens,
                              kept_tokens=max(lengths[r] for lengths in self.cache.lengths),
                              kv_cache_bytes=self.share, peak_kv_bytes=row.state.peak_kv_bytes)
            state = _row_state(self.runner, self.cache, r, row)
            self.results[row.index] = GenerationResult([list(row.out)], stats, state)
        stay = [r for r in range(len(rows)) if r not in finished]
        if stay:
            self.cache.keep_rows(stay)
