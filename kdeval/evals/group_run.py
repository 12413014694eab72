"""Running several cells of one task on the same samples as a group: the prompt steps they compute alike are
computed once (:mod:`kdeval.keydiff.shared`), their decoding batched where they do not evict while decoding
(:mod:`kdeval.evals.group_decode`), and every cell's rows are what :func:`~kdeval.evals.runner.run_task` gives it
alone (timings aside)."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

from kdeval.evals.base import Sample, Task
from kdeval.evals.budget import budget_groups
from kdeval.evals.chunking import resolve_chunk
from kdeval.evals.group_decode import BATCHED_FIGURES, GroupDecoder
from kdeval.evals.prompting import BuiltPrompt
from kdeval.evals.question_runs import context_groups
from kdeval.evals.runner import resolve_policy, run_task


@dataclasses.dataclass
class MemberResult:
    """One member cell's part of :func:`run_group`: its rows (as :func:`run_task` gives them, plus how each sample
    was computed) and the seconds spent on its own runs."""

    rows: list[dict[str, Any]]
    seconds: float


#: row columns that measure a run: a sample computed with steps shared among cells has none of its own (its
#: process peak includes the group's recorded steps, its first token waited on the record)
OWN_FIGURES = ("ttft_s", "shared_prefill_s", "peak_memory_bytes")


def run_group(lm: Any, task: Task, members: Sequence[Mapping[str, Any]],
              prompts: tuple[Sequence[Sample], Sequence[BuiltPrompt]], *, share: bool = True,
              time_first: bool = True, on_samples: Callable[[int, int], None] | None = None) -> list[MemberResult]:
    """Run several cells of one task on the same samples, computing once the prompt steps they compute alike
    (:mod:`kdeval.keydiff.shared`): ``members[i]`` are :func:`run_task`'s keyword arguments of cell ``i``
    (policy, policy_params, budget, chunk_size, engine, compress, decode, max_new_tokens, thinking, batch_size).
    Returns one :class:`MemberResult` per member, in order, with the rows each cell gives run alone.

    Samples run one context group at a time (consecutive samples on one context:
    :func:`~kdeval.evals.question_runs.context_groups`), every member
    on it before the next, so the shared steps held are those of one prompt, at most the members' largest
    budget plus a chunk. ``time_first``: the first group runs every member alone, so each cell has samples timed
    on their own; rows say ``execution="alone"`` or ``"shared"``, and shared rows carry no TTFT (a replayed
    step costs the cell nothing). ``share=False``, and members with ``batch_size > 1`` (batches do not share
    steps), run alone on all samples. Rows of a member that replayed or recorded nothing say ``"alone"``.

    After the first group, members that do not evict while decoding (``decode="keep"``) decode their tokens after
    the first in batches with each other (:mod:`kdeval.evals.group_decode`): such rows say ``"shared"`` and have
    no ``decode_s`` of their own either.

    ``on_samples(i, n)``: member ``i`` has finished ``n`` more samples (a member running alone on all samples,
    once; in the timed first context group, as each member's own run ends; after it, every member of a context
    group at once, as they decode together), so a worker can say how far a group has got before it returns."""
    from kdeval.keydiff.shared import SharedSteps

    told = on_samples or (lambda i, n: None)

    samples, built = list(prompts[0]), list(prompts[1])
    out = [MemberResult([], 0.0) for _ in members]
    groups = list(context_groups(built))
    sharing = [share and m.get("batch_size", 1) == 1 for m in members]
    for i, kwargs in enumerate(members):
        if not sharing[i]:
            _run_alone(out[i], lm, task, kwargs, prompts)
            told(i, len(samples))
    shared_ix = [i for i, yes in enumerate(sharing) if yes]
    if not shared_ix:
        return out
    policies = {i: resolve_policy(members[i].get("policy", "keydiff"), members[i].get("policy_params"))
                for i in shared_ix}
    decoder = GroupDecoder(lm.model)
    for g, group in enumerate(groups):
        ids = [samples[j].id for j in group]
        if time_first and g == 0:
            for i in shared_ix:
                _run_alone(out[i], lm, task, {**members[i], "policy": policies[i], "policy_params": None},
                           prompts, ids)
                told(i, len(group))
            continue
        store = SharedSteps(policies.values(), _most_held(members, policies, shared_ix, samples, built, group))
        loops = {i: run_task(lm, task, prompts=prompts, sample_ids=ids, shared=store, as_jobs=True,
                             **{**members[i], "policy": policies[i], "policy_params": None}) for i in shared_ix}
        for i, run in decoder.drive(loops, lambda: (store.recorded, store.replayed)).items():
            _add_rows(out[i], run.value, run.seconds, run.touched_store or bool(run.batched), run.batched)
        for i in shared_ix:
            told(i, len(group))
    for r in out:
        r.rows.sort(key=lambda row, at={s.id: k for k, s in enumerate(samples)}: at[row["id"]])
    return out


def _run_alone(result: MemberResult, lm: Any, task: Task, kwargs: Mapping[str, Any], prompts: Any,
               sample_ids: Sequence[str] | None = None) -> None:
    """Run one member alone on ``sample_ids`` (all: ``None``); add its rows to ``result``."""
    t0 = time.perf_counter()
    rows = run_task(lm, task, prompts=prompts, sample_ids=sample_ids, **kwargs)
    _add_rows(result, rows, time.perf_counter() - t0, False)


def _add_rows(result: MemberResult, rows: list[dict[str, Any]], seconds: float, took_part: bool,
              batched: set[str] = frozenset()) -> None:
    """Add a member's ``rows`` (of ``seconds`` of work) to ``result``: ``execution`` says whether it took part in
    shared work (then its own figures are empty), timings are numbered after its earlier rows, and the rows
    whose decoding ran in a batch with other cells' (ids in ``batched``) have no decode time of their own."""
    result.seconds += seconds
    numbered = 1 + max((r["timing_batch"] for r in result.rows), default=-1)
    for row in rows:
        row.update(execution="shared" if took_part else "alone", timing_batch=row["timing_batch"] + numbered)
        if took_part:
            row.update({c: None for c in OWN_FIGURES})
        if row["id"] in batched:
            row.update({c: None for c in BATCHED_FIGURES})
    result.rows.extend(rows)


def _most_held(members: Sequence[Mapping[str, Any]], policies: Mapping[int, Any], which: Sequence[int],
               samples: Sequence[Sample], built: Sequence[BuiltPrompt], group: Sequence[int]) -> int:
    """The most tokens a shared step may leave held (:class:`~kdeval.keydiff.shared.SharedSteps`'s bound): the
    largest budget + chunk any evicting member resolves for these samples (0 when no member evicts: no member
    forks, so nothing is worth recording)."""
    most = 0
    for i in which:
        m = members[i]
        if not policies[i].evicts or m.get("budget") is None:
            continue
        context_only = m.get("compress", "prompt") == "context"
        part = [samples[j] for j in group], [built[j] for j in group]
        for n, idx in budget_groups(m["budget"], policies[i], *part, context_only).items():
            for j in idx:
                p = part[1][j]
                b = resolve_chunk(m.get("chunk_size", 128), len(p.prefix_ids) if context_only else p.n_tokens)
                most = max(most, n + b)
    return most
