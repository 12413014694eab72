"""One question per sample through the engine: one sample at a time (batch 1) or in batches, in order, on
one engine; consecutive questions on one context share its compressed prefill (:func:`context_groups`).
These are :func:`kdeval.evals.task_run.runner.run_task`'s loops for tasks with one question per context
(:mod:`kdeval.evals.task_run.conversation` runs the others)."""
from __future__ import annotations

import time
from itertools import groupby
from typing import Any, Iterable, Mapping, Sequence

import torch

from kdeval.evals.task_run.generation_jobs import GenerateJob, JobLoop
from kdeval.evals.task_run.rows import result_row
from kdeval.evals.task_run.settings import protected_tokens
from kdeval.evals.task_run.stores import Stores, sharing
from kdeval.evals.tasks.base import Sample, Task
from kdeval.evals.tasks.prompting import BuiltPrompt, PromptBuilder


def context_groups(prompts: Sequence[BuiltPrompt]) -> Iterable[list[int]]:
    """Runs of consecutive prompt indices whose prefix token ids are identical."""
    for _, run in groupby(range(len(prompts)), key=lambda i: prompts[i].prefix_ids):
        yield list(run)


def run_each(eng: Any, task: Task, samples: Sequence[Sample], built: Sequence[BuiltPrompt],
              builder: PromptBuilder, share_context: bool, compress: str, decode_evict: bool, eos: Any,
              device: Any, weight_bytes: int, strip: tuple[str, str] | None,
              stores: Stores | None = None) -> JobLoop[list[dict[str, Any]]]:
    """:func:`~kdeval.evals.task_run.runner.run_task`'s loop one sample at a time (batch 1), in order, on one engine: a
    generator that yields each sample's :class:`~kdeval.evals.task_run.generation_jobs.GenerateJob` and is sent its
    result (:func:`~kdeval.evals.task_run.generation_jobs.answer_alone` answers them one by one); returns the rows.
    ``stores``: each sample's id to the store of its context (:mod:`kdeval.evals.task_run.stores`), whose steps the
    engine replays or records while it runs that context's samples. ``compress``: the protocol's
    (:data:`~kdeval.evals.task_run.settings.COMPRESS`), which says what each call protects
    (:func:`~kdeval.evals.task_run.settings.protected_tokens`)."""
    rows: list[dict[str, Any]] = []
    scratch = None  # the fork each shared-context question continues from, reused (with its CUDA graphs)
    for group in context_groups(built):
        with sharing(eng, stores, samples[group[0]].id):
            shared, state, shared_s = shared_prefill(eng, built, group, share_context, device, compress)
            for i in group:
                s, p = samples[i], built[i]
                ids = list(p.suffix_ids) if shared else p.ids
                fork = None
                if shared:
                    fork = scratch = state.fork(into=scratch)
                res = yield GenerateJob(eng, torch.tensor([ids], device=device), s.max_new_tokens, eos, fork,
                                        protected_tokens(compress, p, len(ids)), decode_evict, s.id)
                gen = res.tokens[0]
                rows.append(result_row(task, s, p, builder.decode(gen), len(gen), res.stats.to_dict(), shared,
                                       shared_s, weight_bytes, eng.config.budget if eng.plan.evicting else None,
                                       eng.config.chunk_size, compress, strip, timing_batch=len(rows)))
                if not shared:
                    eng.release(res.state)  # its cache (and CUDA graphs) serves the next request
            if shared:
                eng.release(state)
    return rows


def shares_context(group: Sequence[int], share_context: bool) -> bool:
    """Whether a context group's questions continue from one prefill of its context (more than one question on it,
    ``share_context`` on)."""
    return share_context and len(group) > 1


def shared_prefill(eng: Any, built: Sequence[BuiltPrompt], group: list[int], share_context: bool,
                    device: Any, compress: str = "prompt") -> tuple[bool, Any, float]:
    """(shared, state, seconds): a group of questions on one context prefills that context once (compressed
    as the engine's policy says; under ``compress="generated"`` fed without eviction and protected); a lone
    sample, or ``share_context=False``, prefills nothing here."""
    if not shares_context(group, share_context):
        return False, None, 0.0
    t0 = time.perf_counter()
    state = eng.prefill(torch.tensor([list(built[group[0]].prefix_ids)], device=device),
                        evict=compress != "generated")
    return True, state, time.perf_counter() - t0


def _record_trunks(eng: Any, samples: Sequence[Sample], built: Sequence[BuiltPrompt], share_context: bool,
                   batch_size: int, compress: str, stores: Mapping[str, Any], device: Any) -> None:
    """The shared steps of the samples that prefill no shared context (:func:`shares_context`), recorded in their
    stores ``batch_size`` prompts at a time (``Engine.record_shared``), before each sample replays them."""
    todo = [i for group in context_groups(built) if not shares_context(group, share_context) for i in group]
    for at in range(0, len(todo), batch_size):
        part = todo[at : at + batch_size]
        eng.record_shared([torch.tensor(built[i].ids, device=device) for i in part],
                          [stores[samples[i].id] for i in part],
                          [protected_tokens(compress, built[i], built[i].n_tokens) for i in part])


def run_batched(eng: Any, task: Task, samples: Sequence[Sample], built: Sequence[BuiltPrompt],
                 builder: PromptBuilder, batch_size: int, share_context: bool, compress: str,
                 decode_evict: bool, eos: Any, device: Any, weight_bytes: int, strip: tuple[str, str] | None,
                 stores: Stores | None = None) -> list[dict[str, Any]]:
    """:func:`~kdeval.evals.task_run.runner.run_task`'s loop ``batch_size`` samples at a time, in order. A shared context is
    prefilled once; its questions are rows continuing from that state (read, not forked) and it goes back to the
    engine once the last of them has run.

    ``stores``: sample id -> the :class:`~kdeval.keydiff.step.shared.SharedSteps` of its context, filled by the other
    cells of a group (:func:`kdeval.evals.task_run.group_run.run_group`). A shared context is then prefilled through its
    store; the samples of their own have their trunks recorded there ``batch_size`` at a time
    (:func:`_record_trunks`) unless another cell did, then each replays (or records what is left of) its prompt
    steps there up to this cell's fork (``Engine.prefill_shared``, at batch 1) and the rest of its prompt runs in
    the batch from that state. The rows
    are the same either way (timings aside); ``replayed_steps`` counts each row's replayed steps."""
    rows: list[dict[str, Any] | None] = [None] * len(samples)
    batches = [0]  # generate_batch calls so far: each call's rows share one timing
    queue: list[tuple[int, Any, bool, float, Any]] = []  # (sample, start state, shared, its seconds, ids to feed)
    waiting: list[tuple[int, Any]] = []  # (last sample, state) of start states not yet released

    def flush() -> None:
        if not queue:
            return
        res = eng.generate_batch(
            [ids for *_, ids in queue], max_new_tokens=[samples[i].max_new_tokens for i, *_ in queue],
            eos_token_id=eos, states=[state for _, state, *_ in queue],
            protect_last=[protected_tokens(compress, built[i], len(ids)) for i, _, _, _, ids in queue],
            decode_evict=decode_evict)
        for (i, state, shared, shared_s, _), r in zip(queue, res):
            gen = r.tokens[0]
            stats = {**r.stats.to_dict(), "replayed_steps": state.replayed if state is not None else 0}
            rows[i] = result_row(task, samples[i], built[i], builder.decode(gen), len(gen), stats, shared,
                                 shared_s, weight_bytes, eng.config.budget if eng.plan.evicting else None,
                                 eng.config.chunk_size, compress, strip, timing_batch=batches[0])
        batches[0] += 1
        done = queue[-1][0]
        queue.clear()
        while waiting and waiting[0][0] <= done:
            eng.release(waiting.pop(0)[1])

    if stores:
        _record_trunks(eng, samples, built, share_context, batch_size, compress, stores, device)
    for group in context_groups(built):
        with sharing(eng, stores, samples[group[0]].id) as store:
            shared, state, shared_s = shared_prefill(eng, built, group, share_context, device, compress)
            if shared:
                waiting.append((group[-1], state))
            for i in group:
                start, ids = state, list(built[i].suffix_ids) if shared else built[i].ids
                if not shared and store is not None:
                    start = eng.prefill_shared(torch.tensor([ids], device=device),
                                               protected_tokens(compress, built[i], len(ids)))
                    waiting.append((i, start))
                    start, ids = (start, ids[start.seen:]) if start.seen else (None, ids)
                queue.append((i, start, shared, shared_s, ids))
                if len(queue) == batch_size:
                    flush()
    flush()
    return rows  # type: ignore[return-value]
