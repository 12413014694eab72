"""Independent requests in one batch (``Engine.generate_batch``): each row as it would run alone.

Every row follows exactly the steps ``Engine.generate`` takes for it at batch 1: its prompt is cut into chunks
of ``B`` from *its own* first token (after its own prefilled state, if any), the protected question last, then
one step per generated token. The rows advance in lockstep, one step of their own each per forward, so a
shorter prompt starts decoding while longer ones are still prefilling (a row's decode token then rides in a
step of ``B`` columns, padded: no forward is spent on idle rows). Rows are thus aligned on their first token,
as right padding aligns them; within a step each row's tokens are left-padded (kdeval/keydiff/cache/ragged.py says
why). Each row keeps its own absolute positions (its first token is position 0, or its state's next one), its
own budget and kept set, and stops at its own eos or generation length; a finished row leaves the batch.

The requests are checked and made rows in kdeval/keydiff/batch/requests.py, the batch's cache is planned and
made in kdeval/keydiff/plan/capacity.py (the start states' tokens in their rows), and each step is the engine's
one forward over a ragged layout (kdeval/keydiff/cache/layouts.py). Requests run eagerly (no CUDA graphs): the shapes
change from step to step. A state prefilled on the graph path is read as it is; a row's resulting state is its
row of the batch's cache, which the same engine can continue.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from kdeval.keydiff.plan.capacity import batch_cache
from kdeval.keydiff.batch.requests import Row, batch_rows
from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.loop.decoding import Feed, GenerationLoop, eos_ids
from kdeval.keydiff.cache.layouts import RaggedLayout
from kdeval.keydiff.loop.memory import PeakMemory, own_bytes
from kdeval.keydiff.cache.ragged import RaggedStep
from kdeval.keydiff.loop.state import GenerationResult

if TYPE_CHECKING:
    from kdeval.keydiff.step.step import Step

PAD_ID = 0  # the token fed at padding columns (masked: any id does)


class BatchView:
    """What ``Engine(on_batch_step=...)`` sees after every step of a batch: ``requests[r]`` is the request
    (its index in the call) in row ``r``; ``seen[r]`` its tokens processed."""

    def __init__(self, cache: BudgetCache, requests: list[int], seen: list[int]):
        self.cache, self.requests, self.seen = cache, requests, seen

    def kept_positions(self, request: int) -> list[torch.Tensor]:
        """Per layer, the sorted absolute positions the request's row holds: ``[1, kv_heads, tokens]``."""
        r = self.requests.index(request)
        return [layer.positions[r : r + 1, :, : lengths[r]].sort(dim=-1).values.clone()
                for layer, lengths in zip(self.cache.layers, self.cache.lengths)]


def generate_batch(runner: "Step", prompts: Sequence, max_new_tokens, eos_token_id, states, protect_last,
                   decode_evict: bool, on_batch_step: Callable[[BatchView], None] | None) -> list[GenerationResult]:
    """See ``Engine.generate_batch``."""
    rows, starts = batch_rows(runner.plan, prompts, max_new_tokens, states, protect_last,
                              runner.model.config._attn_implementation)
    cache = batch_cache(runner.plan, rows, starts, decode_evict)
    return _Batch(runner, cache, rows, eos_ids(eos_token_id), decode_evict, on_batch_step).run()


class _Batch:
    """The ragged steps of one ``generate_batch`` call, run by the generation loop; finished rows leave."""

    def __init__(self, runner: "Step", cache: BudgetCache, rows: list[Row], eos: set[int], decode_evict: bool,
                 on_batch_step):
        self.runner, self.cache, self.rows = runner, cache, rows
        self.on_batch_step = on_batch_step
        self.memory = PeakMemory(runner.plan.device)
        self.loop = GenerationLoop(rows, eos, decode_evict, self.memory, rows_leave=True)
        self.results: list[GenerationResult | None] = [None] * len(rows)
        self.share = 0  # the rows' share of the K/V buffers' bytes after the last step

    def run(self) -> list[GenerationResult]:
        self.loop.run(self._step, self._leave)
        return self.results  # type: ignore[return-value]

    def _step(self, rows: list[Row], feeds: list[Feed]) -> torch.Tensor:
        """One ragged step of every row (left-padded to the widest) → the last column's logits ``[rows, vocab]``."""
        eng, cache = self.runner, self.cache
        t = [f[0].shape[0] if isinstance(f[0], torch.Tensor) else 1 for f in feeds]
        geometry = eng.plan.layer_steps(cache.lengths, t, [row.state.seen for row in rows],
                                        [f[1] for f in feeds], [row.state.n_protected for row in rows])
        step = geometry[0]
        ids = torch.full((step.rows, step.T), PAD_ID, dtype=torch.long, device=eng.plan.device)
        for r, (f, tr) in enumerate(zip(feeds, t)):
            ids[r, step.T - tr :] = f[0]
        for r, (row, b) in enumerate(zip(rows, t)):
            row.state.peak_kv_tokens = max(row.state.peak_kv_tokens,
                                           max(lengths[r] for lengths in cache.lengths) + b)
        steps = [row.state.steps for row in rows]
        steps_arg = steps[0] if len(set(steps)) == 1 else torch.tensor(
            steps, dtype=torch.long, device=eng.plan.device).view(-1, 1, 1)
        before = cache.lengths
        logits = self._forward(rows, ids, geometry, steps_arg)
        self.share = cache.held_nbytes() // step.rows
        for r, (row, f, b) in enumerate(zip(rows, feeds, t)):
            state = row.state
            state.peak_kv_bytes = max(state.peak_kv_bytes, self._own(before, r, b))
            state.kv_buffer_bytes = max(state.kv_buffer_bytes, cache.held_nbytes())
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

    def _own(self, lengths: list[list[int]], r: int, extra: int = 0) -> int:
        """Row ``r``'s own K/V bytes holding ``lengths[l][r] + extra`` tokens per layer
        (:func:`~kdeval.keydiff.loop.memory.own_bytes`); a quantized store's: the row's share of the store."""
        if self.cache.kv_store is not None:
            return self.share
        return own_bytes(self.cache.layers, [n[r] for n in lengths], extra)

    def _forward(self, rows: list[Row], ids: torch.Tensor, geometry: list[RaggedStep], steps) -> torch.Tensor:
        """The engine's one forward on ``ids [rows, T]`` over the ragged layout, then eviction; the last column's
        logits."""
        layout = RaggedLayout(self.runner.plan, self.cache, geometry, steps, [row.state.protected for row in rows])
        return self.runner.forward(layout, ids)[:, -1, :]

    def _leave(self, finished: list[int]) -> None:
        """The finished rows' results (each row's own figures, its state with its cache); the others stay."""
        rows = self.loop.rows
        for r in finished:
            row = rows[r]
            stats = row.stats(time.perf_counter() - row.t_first, self.memory,
                              peak_kv_tokens=row.state.peak_kv_tokens,
                              kept_tokens=max(lengths[r] for lengths in self.cache.lengths),
                              kv_cache_bytes=self._own(self.cache.lengths, r), peak_kv_bytes=row.state.peak_kv_bytes)
            stats.kv_buffer_bytes = row.state.kv_buffer_bytes
            plan = self.runner.plan
            stats.windowed_kv_bytes = own_bytes([self.cache.layers[i] for i in plan.windowed_layers],
                                                [self.cache.lengths[i][r] for i in plan.windowed_layers])
            stats.layer_kinds = plan.layer_kinds_label()
            row.state.cache = self.runner.caches.row_state_cache(self.cache, r)
            self.results[row.index] = GenerationResult([list(row.out)], stats, row.state)
        stay = [r for r in range(len(rows)) if r not in finished]
        if stay:
            self.cache.keep_rows(stay)
