"""Running several cells of one task on the same samples as a group: the prompt steps they compute alike are
computed once (:mod:`kdeval.keydiff.step.shared`), their decoding batched where they do not evict while decoding
(:mod:`kdeval.evals.task_run.group_decode`), and every cell's rows are what :func:`~kdeval.evals.task_run.runner.run_task`
gives it alone (timings aside)."""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Mapping, Sequence

from kdeval.evals.task_run.budget import budget_groups
from kdeval.evals.task_run.chunking import WHOLE, resolve_chunk
from kdeval.evals.task_run.group_decode import BATCHED_FIGURES, GroupDecoder
from kdeval.evals.task_run.question_runs import context_groups
from kdeval.evals.task_run.runner import run_task
from kdeval.evals.task_run.settings import RunSettings, resolve_conversation
from kdeval.evals.tasks.base import Sample, Task
from kdeval.evals.tasks.prompting import BuiltPrompt

if TYPE_CHECKING:
    from kdeval.keydiff.step.shared import SharedSteps


@dataclasses.dataclass
class MemberResult:
    """One member cell's part of :func:`run_group`: its rows (as :func:`run_task` gives them, plus how each sample
    was computed) and the seconds spent on its own runs."""

    rows: list[dict[str, Any]]
    seconds: float


#: row columns that measure a run: a sample computed with steps shared among cells has none of its own (its
#: process peak includes the group's recorded steps, its first token waited on the record)
OWN_FIGURES = ("ttft_s", "shared_prefill_s", "peak_memory_bytes")


def run_group(lm: Any, task: Task, members: Sequence[RunSettings],
              prompts: tuple[Sequence[Sample], Sequence[BuiltPrompt]], *, share: bool = True,
              time_first: bool = True, batch_size: int = 1,
              on_samples: Callable[[int, int], None] | None = None,
              on_rows: Callable[[int, list[dict[str, Any]], float], None] | None = None) -> list[MemberResult]:
    """Run several cells of one task on the same samples, computing once the prompt steps they compute alike
    (:mod:`kdeval.keydiff.step.shared`): ``members[i]`` are the :class:`~kdeval.evals.task_run.settings.RunSettings` of cell
    ``i``. Returns one :class:`MemberResult` per member, in order, with the rows each cell gives run alone.

    A member's ``batch_size`` None is chosen here: ``batch_size`` for a chunked member of a task with one question
    per context, else 1. Members at batch 1 run one context group at a time (consecutive samples on one context:
    :func:`~kdeval.evals.task_run.question_runs.context_groups`), every member on it before the next. Members in batches
    run a window of context groups at a time (as many samples as the largest batch): the first member records the
    window's trunks as rows of one batch (``Engine.record_shared``), each sample's steps up to the member's fork
    are replayed from (or what is left recorded in) its context's store at batch 1, the rest of its prompt
    and its decoding run in the member's batches (fork-then-batch:
    :func:`~kdeval.evals.task_run.question_runs.run_batched`). The steps held are those of the window's prompts, per
    prompt at most the members' largest budget plus a chunk (a batch alone holds as many caches of that size).
    ``time_first``: the first context group runs every member alone, so each cell has samples timed on their
    own; rows say ``execution="alone"`` or ``"shared"``, and shared rows carry no TTFT (a replayed step costs the
    cell nothing). Windows end where a run alone's batches end but for the first (the timed group is a batch of
    its own), so a row there may share its batch with other samples than alone: its ``kv_buffer_bytes`` (the
    batch's buffers) are then those of its batch, like its timings; its ``peak_kv_bytes`` are its own tokens', the
    same as alone. ``share=False``, and members in
    batches on a task of several questions per context, run alone on all samples. A row whose sample's steps this
    member neither replayed nor recorded says ``"alone"``.

    After the first group, members at batch 1 that do not evict while decoding (``decode="keep"``) decode their
    tokens after the first in batches with each other (:mod:`kdeval.evals.task_run.group_decode`): such rows say
    ``"shared"`` and have no ``decode_s`` of their own either.

    ``on_samples(i, n)``: member ``i`` has finished ``n`` more samples (a member running alone on all samples,
    once; in the timed first context group, as each member's own run ends; after it, a member in batches as its
    run of a window ends, the members at batch 1 of a context group at once, as they decode together), so a
    worker can say how far a group has got before it returns. ``on_rows(i, rows, seconds)``: at the same
    moments, the rows member ``i`` has just finished (final: nothing changes them after, but their order in the
    result) and the seconds of its own work on them, so a worker can hand over a member's finished samples before
    the group returns."""
    told = on_samples or (lambda i, n: None)
    handed = on_rows or (lambda i, rows, seconds: None)

    samples, built = list(prompts[0]), list(prompts[1])
    out = [MemberResult([], 0.0) for _ in members]
    members = [dataclasses.replace(m, batch_size=_batch_size(task, m, batch_size)) for m in members]
    stepwise = [i for i, m in enumerate(members) if share and m.batch_size == 1]
    windowed = [i for i, m in enumerate(members) if share and m.batch_size > 1  # type: ignore[operator]
                and resolve_conversation(task, m.conversation) is None]
    sharing = sorted(stepwise + windowed)
    for i, settings in enumerate(members):
        if i not in sharing:
            handed(i, *_run_alone(out[i], lm, task, settings, prompts))
            told(i, len(samples))
    if not sharing:
        return out
    resolved = {i: members[i].with_policy_object() for i in sharing}
    policies = {i: resolved[i].policy for i in sharing}
    groups, timed = list(context_groups(built)), 0
    if time_first and groups:
        ids = [samples[j].id for j in groups[0]]
        for i in sharing:
            handed(i, *_run_alone(out[i], lm, task, resolved[i], prompts, ids))
            told(i, len(ids))
        groups, timed = groups[1:], len(ids)
    decoder = GroupDecoder(lm.model)
    width = max((members[i].batch_size for i in windowed), default=1)  # type: ignore[type-var]
    for window in _windows(groups, width, timed):
        stores = [_store(policies.values(), _most_held(members, policies, sharing, samples, built, group))
                  for group in window]
        ids = [[samples[j].id for j in group] for group in window]
        by_id = {sid: store for group_ids, store in zip(ids, stores) for sid in group_ids}
        every_id = [sid for group_ids in ids for sid in group_ids]
        for i in windowed:
            before = [(s.recorded, s.replayed) for s in stores]
            t0 = time.perf_counter()
            rows = run_task(lm, task, resolved[i], prompts=prompts, sample_ids=every_id, shared=by_id)
            touched = {sid for group_ids, s, b in zip(ids, stores, before) if (s.recorded, s.replayed) != b
                       for sid in group_ids}
            took = time.perf_counter() - t0
            _add_rows(out[i], rows, took, touched)
            handed(i, rows, took)
            told(i, len(every_id))
        if not stepwise:
            continue
        for group_ids, store in zip(ids, stores):
            loops = {i: run_task(lm, task, resolved[i], prompts=prompts, sample_ids=group_ids,
                                 shared=dict.fromkeys(group_ids, store), as_jobs=True) for i in stepwise}
            for i, run in decoder.drive(loops, lambda: (store.recorded, store.replayed)).items():
                took_part = run.touched_store or bool(run.batched)
                _add_rows(out[i], run.value, run.seconds, set(group_ids) if took_part else set(), run.batched)
                handed(i, run.value, run.seconds)
            for i in stepwise:
                told(i, len(group_ids))
    for r in out:
        r.rows.sort(key=lambda row, at={s.id: k for k, s in enumerate(samples)}: at[row["id"]])
    return out


def _batch_size(task: Task, member: RunSettings, default: int) -> int:
    """The batch size a member runs at: its own, or when it sets none (``None``) ``default`` for a chunked cell
    of a one-question task (it forks then batches) and 1 for the rest (they share whole steps at batch 1)."""
    if member.batch_size is not None:
        return member.batch_size
    chunked = member.chunk_size != WHOLE
    return default if chunked and resolve_conversation(task, member.conversation) is None else 1


def _windows(groups: Sequence[list[int]], width: int, before: int = 0) -> list[list[list[int]]]:
    """Consecutive context groups taken together, a window closing once the samples so far (``before`` of them
    ahead of ``groups``) reach a multiple of ``width``: the windows' batches are then those of a run alone, but
    the first, wherever context groups allow."""
    windows: list[list[list[int]]] = []
    count, bound = before, before
    for group in groups:
        if count >= bound:
            windows.append([])
            bound = (count // width + 1) * width
        windows[-1].append(group)
        count += len(group)
    return windows


def _run_alone(result: MemberResult, lm: Any, task: Task, settings: RunSettings, prompts: Any,
               sample_ids: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Run one member alone on ``sample_ids`` (all: ``None``); add its rows to ``result``; its rows and seconds."""
    t0 = time.perf_counter()
    rows = run_task(lm, task, settings, prompts=prompts, sample_ids=sample_ids)
    took = time.perf_counter() - t0
    _add_rows(result, rows, took, set())
    return rows, took


def _add_rows(result: MemberResult, rows: list[dict[str, Any]], seconds: float, shared: Collection[str],
              batched: Collection[str] = frozenset()) -> None:
    """Add a member's ``rows`` (of ``seconds`` of work) to ``result``: ``execution`` says whether the row's
    sample took part in shared work (ids in ``shared``; then its own figures are empty), timings are numbered
    after the member's earlier rows, and the rows whose decoding ran in a batch with other cells' (ids in
    ``batched``) have no decode time of their own."""
    result.seconds += seconds
    numbered = 1 + max((r["timing_batch"] for r in result.rows), default=-1)
    for row in rows:
        took_part = row["id"] in shared
        row.update(execution="shared" if took_part else "alone", timing_batch=row["timing_batch"] + numbered)
        if took_part:
            row.update({c: None for c in OWN_FIGURES})
        if row["id"] in batched:
            row.update({c: None for c in BATCHED_FIGURES})
    result.rows.extend(rows)


def _store(policies: Iterable[Any], bounds: dict[int, int]) -> "SharedSteps":
    """A shared store for one context group, bounded per chunk size by ``bounds`` (:func:`_most_held`)."""
    from kdeval.keydiff.step.shared import SharedSteps

    return SharedSteps(policies, max(bounds.values(), default=0), chunk_bounds=bounds)


def _most_held(members: Sequence[RunSettings], policies: Mapping[int, Any], which: Sequence[int],
               samples: Sequence[Sample], built: Sequence[BuiltPrompt], group: Sequence[int]) -> dict[int, int]:
    """The most tokens a shared step may leave held (:class:`~kdeval.keydiff.step.shared.SharedSteps`'s
    bounds), per chunk size the members resolve for these samples: the largest budget + chunk of the evicting
    members of that chunk size (0 where none evicts: no member forks there, so nothing is worth recording),
    and the whole prompt where a member keeps it (``compress: generated``: its prompt steps never evict, so
    every one is shared)."""
    most: dict[int, int] = {}
    part = [samples[j] for j in group], [built[j] for j in group]
    for i in which:
        m = members[i]
        chunks = [resolve_chunk(m.chunk_size, len(p.prefix_ids) if m.context_only else p.n_tokens)
                  for p in part[1]]
        for b in chunks:
            most.setdefault(b, 0)
        if m.prompt_kept:  # nothing of the prompt is evicted: every member shares its steps, full included
            for p, b in zip(part[1], chunks):
                most[b] = max(most[b], p.n_tokens)
        if not policies[i].evicts or m.budget is None:
            continue
        for n, idx in budget_groups(m.budget, policies[i], *part, m.compress).items():
            for j in idx:
                most[chunks[j]] = max(most[chunks[j]], n + chunks[j])
    return most
