"""What compression broke, sample by sample, and whether it made answers longer.

* :func:`broken_rows`: per cell, the samples (turns, in a conversation) whose reference answer passes (score
  >= :data:`PASS`) and whose answer under the policy does not: ids, both predictions and the gold answer
  (Gao et al., "Rethinking KV Cache Compression", MLSys 2025: averages hide per-sample failures). For a 0/1
  metric that is "the reference is right, the policy wrong".
* :func:`answer_length_rows`: per cell, generated tokens against the reference's, paired by sample, with a
  bootstrap CI of the mean difference: a policy whose answers run longer costs decode time the speed table's
  per-token figures do not show; beside it the decode tokens per solved problem and the share of traces cut at
  ``max_new_tokens`` on both sides (what a reasoning answer cost, "Hold Onto That Thought": low budgets make
  traces longer).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kdeval.jobs.reports.report_rows import BrokenRow, LengthRow, State, stored
from kdeval.jobs.reports.samples import LoadedCell, Samples, Slot, pair_samples
from kdeval.jobs.reports.stats import paired_bootstrap

#: The score a sample's answer needs to count as answered.
PASS = 0.5


def _pairs(own: dict[Slot, LoadedCell], ref_of: Callable[[Slot], LoadedCell | None],
           is_reference: Callable[[Slot], bool]):
    """(slot, cell, reference cell, their pairing) for every done cell whose reference cell is done."""
    for slot in sorted(own):
        cell = own[slot]
        ref = None if is_reference(slot) else ref_of(slot)
        if cell.done and ref is not None and ref.done:
            yield slot, cell, ref, pair_samples(cell.samples, ref.samples)


def broken_rows(own: dict[Slot, LoadedCell], ref_of: Callable[[Slot], LoadedCell | None],
                is_reference: Callable[[Slot], bool]) -> list[BrokenRow]:
    """Every sample the reference answers and the policy does not, cell by cell, in sample order."""
    rows = []
    for slot, cell, ref, p in _pairs(own, ref_of, is_reference):
        mine, theirs = cell.samples, ref.samples
        for oi, ri in zip(p.own, p.ref):
            if theirs.score[ri] >= PASS > mine.score[oi]:
                sample_id = str(mine.key[oi]).split("|")[1]
                rows.append(BrokenRow(model=slot.model, policy=slot.policy, budget=slot.budget, chunk=slot.chunk,
                                      task=slot.task, id=sample_id, turn=int(mine.turn[oi]),
                                      score=stored(float(mine.score[oi])), ref_score=stored(float(theirs.score[ri])),
                                      prediction=str(mine.prediction[oi]), ref_prediction=str(theirs.prediction[ri]),
                                      gold=str(mine.gold[oi])))
    return rows


def answer_length_rows(own: dict[Slot, LoadedCell], ref_of: Callable[[Slot], LoadedCell | None],
                       is_reference: Callable[[Slot], bool], **boot: Any) -> list[LengthRow]:
    """Generated tokens of each cell against its reference's, paired by sample, with a CI of the difference."""
    rows = []
    for slot, cell, ref, p in _pairs(own, ref_of, is_reference):
        mine, theirs = cell.samples.take(p.own), ref.samples.take(p.ref)
        ok = ~(np.isnan(mine.generated) | np.isnan(theirs.generated))
        mine, theirs = mine.take(ok), theirs.take(ok)
        a, b = mine.generated, theirs.generated
        base = dict(model=slot.model, policy=slot.policy, budget=slot.budget, chunk=slot.chunk, task=slot.task,
                    n_paired=int(a.size))
        if not a.size:
            rows.append(LengthRow(**base, state=State.MISSING, note="no paired samples with generated tokens"))
            continue
        ci = paired_bootstrap(a - b, None, **boot)
        rows.append(LengthRow(**base, tokens=stored(float(a.mean())), ref_tokens=stored(float(b.mean())),
                              delta=stored(ci.estimate), ci_low=stored(ci.low), ci_high=stored(ci.high),
                              ratio=stored(float(a.mean() / b.mean())) if b.mean() > 0 else None,
                              per_solved=per_solved(mine), ref_per_solved=per_solved(theirs),
                              capped=capped_share(mine), ref_capped=capped_share(theirs)))
    return rows


def per_solved(samples: Samples) -> float | None:
    """Decode tokens per solved problem: all of ``samples``' generated tokens over those answered (score >=
    :data:`PASS`); None when none is (the tokens bought nothing)."""
    solved = int((samples.score >= PASS).sum())
    return stored(float(samples.generated.sum() / solved)) if solved else None


def capped_share(samples: Samples) -> float | None:
    """The share of ``samples`` whose generation stopped at ``max_new_tokens``; None when their rows do not
    record it (results written before rows said so)."""
    known = samples.capped[~np.isnan(samples.capped)]
    return stored(float(known.mean())) if known.size == samples.capped.size and known.size else None
