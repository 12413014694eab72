"""Running one task: (model, task, settings, samples) -> per-sample rows.

Rows are flat dicts of JSON-able scalars and lists (:class:`kdeval.evals.task_run.rows.EvalRow`), ready for Parquet.
Consecutive samples whose prompt prefix (the context) is identical share one prefill: the context
is compressed once and every question continues from a fork of that state.

Two protocols (:data:`~kdeval.evals.task_run.settings.COMPRESS`, :data:`~kdeval.evals.task_run.settings.DECODE`):
``compress="prompt"`` evicts after every chunk of the whole prompt (the KeyDiff paper); ``compress="context"``
evicts while prefilling the context only, then feeds the question without eviction and never evicts it
(kvpress). ``decode="evict"`` keeps evicting after every generated token; ``decode="keep"`` lets the cache
grow while decoding. ``compress="generated"`` (reasoning traces) feeds the whole prompt without eviction and
never evicts it; from the first generated token on, eviction chooses among the generated tokens only, to the
budget (a share: of each sample's ``max_new_tokens``), so the cache holds the prompt plus N (plus the token a
decode step adds).

A budget is N tokens or a share of each prompt (``"25%"``, :mod:`kdeval.evals.task_run.budget`): a sample then keeps
kvpress's ``N = int(tokens × share)``, tokens being what is compressed (the whole prompt under ``compress="prompt"``, the
context under ``"context"``, as kvpress's ratio). Samples run on one engine per resolved N, each group in
sample order, so a batch only holds samples of one N (and equals batch 1). A sample whose N is below what the
policy always keeps (sinks, recent window) fails the run before anything runs: it is not raised to that
minimum, which would make the cell something else than the share it names.

A chunk size of ``"whole"`` (:mod:`kdeval.evals.task_run.chunking`) is one-shot compression: each sample's B is the
number of tokens compressed (its prompt, or its context under ``"context"``), so the engine prefills that part
in one chunk and evicts once; under ``"prompt"`` such samples never share a context prefill (that would evict
after the context and again after the question).

    lm = load_model("random:llama-tiny")
    task = get_task("needle", lengths=[600], depths=[50], haystack="noise")
    rows = run_task(lm, task, RunSettings(policy="keydiff", budget=256, chunk_size=64))
    headline = aggregate(task, rows)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from kdeval.evals.task_run.budget import budget_groups
from kdeval.evals.task_run.chunking import WHOLE, ChunkSize, resolve_chunk
from kdeval.evals.task_run.conversation import conversation_prompts, run_conversations
from kdeval.evals.task_run.generation_jobs import JobLoop, answer_alone
from kdeval.evals.task_run.question_runs import run_batched, run_each
from kdeval.evals.task_run.settings import RunSettings, check_batch_size, generated_refusal, resolve_conversation
from kdeval.evals.task_run.stores import Stores
from kdeval.evals.tasks.base import EvalError, Sample, Task, check_positive
from kdeval.evals.tasks.prompting import BuiltPrompt, PromptBuilder
from kdeval.evals.tasks.thinking import thinking_markers


def _select(task: Task, samples: Sequence[Sample], sample_ids: Sequence[str] | None,
            limit: int | None) -> list[int]:
    """Indices of the samples to run: those in ``sample_ids`` (all when None), then the first ``limit``."""
    keep = list(range(len(samples)))
    if sample_ids is not None:
        wanted = set(sample_ids)
        unknown = wanted - {s.id for s in samples}
        if unknown:
            raise EvalError(f"sample_ids: {sorted(unknown)[:3]} are not samples of {task.name}")
        keep = [i for i in keep if samples[i].id in wanted]
    if limit is not None:
        keep = keep[:limit]
    return keep


def build_prompts(task: Task, builder: PromptBuilder, sample_ids: Sequence[str] | None = None,
                  limit: int | None = None, max_new_tokens: int | None = None
                  ) -> tuple[list[Sample], list[BuiltPrompt]]:
    """The task's samples (optionally a subset) and their tokenized prompts, without a model.

    ``max_new_tokens``: every sample's generation length replaced by it before its prompt is built (the
    truncation leaves room for it); None: each sample's own (the benchmark's) length."""
    check_positive("max_new_tokens", max_new_tokens, allow_none=True)
    samples = task.samples(builder)
    samples = [samples[i] for i in _select(task, samples, sample_ids, limit)]
    if max_new_tokens is not None:
        samples = [dataclasses.replace(s, max_new_tokens=max_new_tokens) for s in samples]
    return samples, [builder.build(s) for s in samples]


def model_prompts(lm: Any, task: Task, sample_ids: Sequence[str] | None = None, limit: int | None = None,
                  chat: str = "auto", max_new_tokens: int | None = None) -> tuple[list[Sample], list[BuiltPrompt]]:
    """:func:`build_prompts` for ``lm``'s tokenizer and context size, after the task's context check: what
    :func:`run_task` builds, to reuse across runs of one task on one model (``run_task(prompts=...)``)."""
    task.check_context(lm.max_context)
    return build_prompts(task, PromptBuilder(lm.tokenizer, lm.max_context, chat=chat), sample_ids, limit,
                         max_new_tokens)


def _check_protocol(task: Task, samples: Sequence[Sample], prompts: Sequence[BuiltPrompt], compress: str,
                    max_new_tokens: int | None) -> None:
    """Refuse a context-only compression without a question and prebuilt prompts whose generation length is
    not ``max_new_tokens``, before anything runs."""
    check_positive("max_new_tokens", max_new_tokens, allow_none=True)
    if compress == "generated" and task.multi_question:
        raise EvalError(f"protocol.compress: 'generated' runs one question per context; {task.name} asks "
                        f"several (use compress 'prompt' or 'context' for it)")
    if compress == "context":
        if not task.separable_question:
            raise EvalError(f"protocol.compress: 'context' needs a task with a separable question; {task.name} has "
                            f"none (its prompt is all question)")
        for s, p in zip(samples, prompts):
            if not s.suffix or not p.suffix_ids:
                raise EvalError(f"protocol.compress: 'context' needs a task with a separable question; "
                                f"{task.name} has none (sample {s.id!r} has an empty question)")
    if max_new_tokens is not None:
        for s in samples:
            if s.max_new_tokens != max_new_tokens:
                raise EvalError(f"max_new_tokens: the prompts were built for sample {s.id!r}'s "
                                f"{s.max_new_tokens} new tokens, not {max_new_tokens}; build them with "
                                f"model_prompts(..., max_new_tokens={max_new_tokens})")


def run_task(lm: Any, task: Task, settings: RunSettings = RunSettings(), *,
             sample_ids: Sequence[str] | None = None, limit: int | None = None,
             prompts: tuple[Sequence[Sample], Sequence[BuiltPrompt]] | None = None, shared: Stores | None = None,
             as_jobs: bool = False) -> list[dict[str, Any]] | JobLoop[list[dict[str, Any]]]:
    """Run ``task`` on ``lm`` (a ``LoadedModel``) as ``settings`` say; one row per sample
    (:class:`kdeval.evals.task_run.rows.EvalRow`), or per (sample, turn) for a task with several questions per context
    (then in sample then turn order, with ``turn``, ``turns``, ``question``, ``answer_fed`` and ``conversation``).

    Args:
        lm: the loaded model (``model``, ``tokenizer``, ``max_context``).
        task: a task from :func:`kdeval.evals.benchmarks.registry.get_task`.
        settings: the cell's :class:`~kdeval.evals.task_run.settings.RunSettings` (policy, budget, chunk size,
            protocol, batch size, ...); its ``batch_size`` must be a number here.
        sample_ids / limit: run a subset (ids from :func:`build_prompts` or earlier rows).
        prompts: the samples and prompts already built for this task and ``lm`` with the same ``chat`` by
            :func:`model_prompts` (or :func:`build_prompts`), e.g. shared by runs that differ only in
            policy, budget, chunk size or engine options; ``sample_ids`` / ``limit`` still select from them.
            None: build them here.
        shared: prompt steps shared with other cells (:func:`kdeval.evals.task_run.group_run.run_group`): each sample's
            id to the store of its context (:mod:`kdeval.evals.task_run.stores`), at any batch size. At batch 1 a
            sample replays or records its steps there; in batches its steps up to the cell's fork come from
            there and the rest runs in the batch (:func:`kdeval.evals.task_run.question_runs.run_batched`). The rows
            are the same without it (timings aside). A task of several questions per context shares at batch 1
            only.
        as_jobs: return the run as a loop of the engine calls it makes one sample at a time
            (:mod:`kdeval.evals.task_run.generation_jobs`; :func:`kdeval.evals.task_run.group_run.run_group` answers several
            cells' together) instead of running it; the arguments are checked first either way.
    """
    from kdeval.keydiff.engine import Engine, EngineConfig
    from kdeval.keydiff.loop.memory import model_weight_bytes
    from kdeval.keydiff.attention.repeat_prompt import RepeatPrompt

    s = settings
    strip = thinking_markers(lm.tokenizer) if s.thinking == "strip" else None
    conv = resolve_conversation(task, s.conversation)  # before any prompt is built
    check_batch_size(s.batch_size)
    batch_size: int = s.batch_size  # type: ignore[assignment]
    if prompts is None:
        samples, built = model_prompts(lm, task, sample_ids, limit, s.chat, s.max_new_tokens)
    else:  # built by model_prompts, which checked the context
        keep = _select(task, prompts[0], sample_ids, limit)
        samples, built = [prompts[0][i] for i in keep], [prompts[1][i] for i in keep]
    _check_protocol(task, samples, built, s.compress, s.max_new_tokens)
    context_only = s.context_only
    compress = s.compress
    builder = PromptBuilder(lm.tokenizer, lm.max_context, chat=s.chat)  # decodes the answers
    # what each sample compresses; a multi-request sample in one chunk ("whole") holds its longest question's
    sizes = [max(len(q.prefix_ids) if context_only else q.n_tokens for q in conversation_prompts(builder, x, p, conv))
             if conv is not None else None for x, p in zip(samples, built)]
    pol = s.policy_object()
    why = generated_refusal(pol.needs()) if s.prompt_kept and pol.evicts else None
    if why is not None:
        raise EvalError(f"policy: '{pol.name}' {why}")
    # a repeat-pass policy's prompt (KVzip): the instruction and chat template of this model's tokenizer
    repeat = RepeatPrompt.from_tokenizer(lm.tokenizer) if pol.evicts and pol.needs().repeat is not None else None
    groups = _chunk_groups(budget_groups(s.budget, pol, samples, built, compress), s.chunk_size, built,
                           context_only, sizes)
    share_context = s.share_context and not (s.chunk_size == WHOLE and not context_only)
    configs = {key: EngineConfig(budget=key[0], chunk_size=key[1], **dict(s.engine or {})) for key in groups}
    eos = getattr(lm, "eos_token_ids", None) or lm.tokenizer.eos_token_id
    device = next(lm.model.parameters()).device
    weight_bytes = model_weight_bytes(lm.model)
    if shared is not None and (not isinstance(shared, Mapping) or (conv is not None and batch_size > 1)):
        raise EvalError("shared: a mapping of sample ids to the SharedSteps of their contexts (at batch 1 only "
                        "for a task of several questions per context)")

    def loop() -> JobLoop[list[dict[str, Any]]]:
        rows: list[list[dict[str, Any]]] = [[] for _ in samples]
        timed = 0  # timings (generate calls) of the (N, B) groups before
        for key, members in groups.items():
            eng = Engine(lm.model, pol, configs[key], repeat_prompt=repeat)
            part = [samples[i] for i in members], [built[i] for i in members]
            if conv is not None:
                done_turns = run_conversations(eng, task, *part, builder, conv, context_only=context_only,
                                               decode_evict=s.decode_evict, eos=eos, device=device,
                                               weight_bytes=weight_bytes, strip=strip, batch_size=batch_size,
                                               stores=shared)
            elif batch_size > 1:
                done = run_batched(eng, task, *part, builder, batch_size, share_context, compress,
                                   s.decode_evict, eos, device, weight_bytes, strip, stores=shared)
            else:
                done = yield from run_each(eng, task, *part, builder, share_context, compress, s.decode_evict,
                                           eos, device, weight_bytes, strip, stores=shared)
            if conv is None:
                done_turns = [[row] for row in done]
            for i, turns in zip(members, done_turns):
                # timings numbered across the (N, B) groups
                rows[i] = [{**row, "timing_batch": row["timing_batch"] + timed} for row in turns]
            timed += 1 + max((r["timing_batch"] for turns in done_turns for r in turns), default=-1)
        return [row for turns in rows for row in turns]

    return loop() if as_jobs else answer_alone(loop())


def _chunk_groups(groups: Mapping[int | None, list[int]], chunk_size: ChunkSize, built: Sequence[BuiltPrompt],
                  context_only: bool, sizes: Sequence[int | None] = ()) -> dict[tuple[int | None, int], list[int]]:
    """The samples (indices, in order) of each (N, B) they run with: B is ``chunk_size``, or under ``"whole"``
    each sample's compressed token count (:func:`kdeval.evals.task_run.chunking.resolve_chunk`; ``sizes[i]``, when
    not None, overrides it)."""
    out: dict[tuple[int | None, int], list[int]] = {}
    for n, members in groups.items():
        for i in members:
            tokens = len(built[i].prefix_ids) if context_only else built[i].n_tokens
            if i < len(sizes) and sizes[i] is not None:
                tokens = sizes[i]
            out.setdefault((n, resolve_chunk(chunk_size, tokens)), []).append(i)
    return out


def aggregate(task: Task, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The task's headline numbers from its rows, plus mean latency, the process/GPU peak
    (``max_peak_memory_bytes``, weights included), the KV cache's peak (``max_peak_kv_bytes``) and the
    model's weights (``model_weight_bytes``), where the rows have them."""
    if not rows:
        raise EvalError(f"rows: expected at least one row to aggregate for {task.name}")
    out = dict(task.aggregate(rows))
    for key in ("ttft_s", "decode_s"):
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        if vals:
            out[f"mean_{key}"] = sum(vals) / len(vals)
    mems = [int(r["peak_memory_bytes"]) for r in rows if r.get("peak_memory_bytes") is not None]
    if mems:
        out["max_peak_memory_bytes"] = max(mems)
    for key, name in (("peak_kv_bytes", "max_peak_kv_bytes"), ("model_weight_bytes", "model_weight_bytes")):
        vals = [int(r[key]) for r in rows if r.get(key) is not None]
        if vals:
            out[name] = max(vals)
    return out
