"""The cells of a group decoded together: each cell's prompt on its own engine, then the greedy steps of
several cells (of one sample, and of several) as one batch.

:func:`kdeval.evals.task_run.group_run.run_group` runs its members' question loops (:mod:`kdeval.evals.task_run.generation_jobs`)
side by side through :meth:`GroupDecoder.drive`. A job whose decoding does not depend on its policy (it does not
evict after the prompt, ``decode: keep``) runs its prompt alone, up to its first token (``Engine.generate``'s
``prompt_only``); the rest of its tokens are decoded in a ragged batch with other such jobs
(``Engine.generate_batch`` on one engine without eviction), fed the first token, from the state its prompt left.
Without eviction a decode step reads the kept tokens and attends over them whatever policy chose them, so a
row gives its cell's tokens and kept set as the cell alone (tests/evals/test_group_decode.py checks every
registered policy). The jobs that do not qualify are answered alone, in place: decoding that evicts (the policy runs at
every step), a re-rotating policy (its keys sit at other positions), a head pool (AdaKV's layout), a quantized
store, a model whose attention is not SDPA, one new token.

Each row keeps the figures it has alone: its KV peak and final bytes are the cell's own cache's (the prompt left
it with room for every token, which alone it never outgrows), its token counts its own row's. Its decode time
is the batch's: a batched row's ``decode_s`` is left empty (:data:`BATCHED_FIGURES`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kdeval.evals.task_run.generation_jobs import GenerateJob, JobLoop

#: row columns a batched decode measures for the batch, not the row: left empty in such a row
BATCHED_FIGURES = ("decode_s",)

#: the most rows decoded in one batch (each row's state waits for the batch: a cap on what waits)
ROWS_PER_BATCH = 16


@dataclass
class Driven:
    """What :meth:`GroupDecoder.drive` gives back for one loop: its return value, the seconds spent on it (its
    share of each batch it was in), whether it touched the shared store, the sample ids decoded in a batch."""

    value: Any = None
    seconds: float = 0.0
    touched_store: bool = False
    batched: set[str] = field(default_factory=set)


def batchable(job: GenerateJob) -> bool:
    """Whether ``job``'s tokens after the first may be decoded in a batch with other cells' (module docstring)."""
    from kdeval.keydiff.attention.capture import RAGGED_IMPL

    plan = job.engine.plan
    return (not job.decode_evict and job.max_new_tokens >= 2 and not plan.rerotate and not plan.shares_heads
            and plan.kv_quant is None and job.engine.model.config._attn_implementation in ("sdpa", RAGGED_IMPL))


class GroupDecoder:
    """Decodes the batchable jobs of several question loops in ragged batches on one engine without eviction."""

    def __init__(self, model: Any, rows_per_batch: int = ROWS_PER_BATCH):
        from kdeval.baselines import get_policy
        from kdeval.keydiff.engine import Engine, EngineConfig

        #: no eviction and one-token prompts (each row is fed its first token): any policy's rows continue here
        self.engine = Engine(model, get_policy("full"), EngineConfig(budget=None, chunk_size=1, cuda_graphs=False))
        self.rows_per_batch = rows_per_batch

    def drive(self, loops: Mapping[int, JobLoop], store_counters: Callable[[], Any] = lambda: None
              ) -> dict[int, Driven]:
        """Run every loop to its end, in turns: each is advanced until it waits on a batchable job (its prompt
        done) or ends; the waiting jobs are decoded together (:attr:`rows_per_batch` at most at a time) and
        each loop is sent its result. ``store_counters()``: the shared store's counters, read around each
        advance to tell which loops touched it."""
        out = {i: Driven() for i in loops}
        answer: dict[int, Any] = {i: None for i in loops}
        waiting: list[tuple[int, GenerateJob, Any]] = []  # (loop, job, its result up to the first token)
        live = list(loops)
        while live:
            for i in list(live):
                if i not in answer:  # waits on the next batch
                    continue
                t0, before = time.perf_counter(), store_counters()
                try:
                    job = loops[i].send(answer.pop(i))
                    while not batchable(job):
                        job = loops[i].send(job.run())
                    first = job.run(prompt_only=True)
                except StopIteration as stop:
                    out[i].value = stop.value
                    live.remove(i)
                else:
                    if first.tokens[0]:
                        waiting.append((i, job, first))
                    else:  # eos first: the whole answer already
                        answer[i] = first
                out[i].seconds += time.perf_counter() - t0
                out[i].touched_store |= store_counters() != before
                if len(waiting) >= self.rows_per_batch:
                    self._decode(waiting, answer, out)
            self._decode(waiting, answer, out)
        return out

    def _decode(self, waiting: list[tuple[int, GenerateJob, Any]], answer: dict[int, Any],
                out: dict[int, Driven]) -> None:
        """Decode the waiting jobs' remaining tokens in one batch; each loop's answer is its alone result."""
        if not waiting:
            return
        from kdeval.keydiff.loop.state import GenerationResult

        t0 = time.perf_counter()
        rest = self.engine.generate_batch(
            [[first.tokens[0][0]] for _, _, first in waiting],
            max_new_tokens=[job.max_new_tokens - 1 for _, job, _ in waiting], eos_token_id=waiting[0][1].eos,
            states=[first.state for _, _, first in waiting], protect_last=0, decode_evict=False)
        share = (time.perf_counter() - t0) / len(waiting)
        for (i, job, first), r in zip(waiting, rest):
            cache = first.state.cache  # the cell's own, with room for every token: alone it stays this size
            stats = dataclasses.replace(
                first.stats, decode_tokens=1 + len(r.tokens[0]), decode_s=0.0, decode_tokens_per_s=0.0,
                peak_kv_tokens=r.stats.peak_kv_tokens, kept_tokens=r.stats.kept_tokens,
                kv_cache_bytes=r.stats.kv_cache_bytes,  # the row's own tokens: what it holds alone
                peak_kv_bytes=max(first.stats.peak_kv_bytes, r.stats.peak_kv_bytes),
                kv_buffer_bytes=max(first.stats.kv_buffer_bytes, cache.held_nbytes()))
            answer[i] = GenerationResult([first.tokens[0] + r.tokens[0]], stats, first.state)
            out[i].seconds += share
            out[i].batched.add(job.sample_id)
        waiting.clear()
