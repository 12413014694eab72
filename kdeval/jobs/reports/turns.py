"""Conversations by turn: each turn's score against the reference and against turn 1, and query dependence by turn.

* :func:`turn_rows`: per cell configuration (policy × budget × chunk × task instance) of a run holding
  conversations, one row per turn: the score, Δ against the reference's same turn (paired by sample), and the
  *turn decay* Δ(turn t − turn 1) of the configuration itself (paired by sample), each with its bootstrap CI.
* :func:`query_dependence_by_turn`: query-aware − query-agnostic per turn (SCBench's finding, on the cells
  here: query-aware compression's first-turn advantage, and what is left of it at the later turns).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import numpy as np

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.grid.schema import COMPRESS_NAMES
from kdeval.jobs.reports.contrasts import _decode_note, base_policy, group_cells, key_order, protocol_of
from kdeval.jobs.reports.report_rows import ContrastRow, State, TurnRow, stored
from kdeval.jobs.reports.samples import LoadedCell, Samples, Slot, paired_delta


def has_turns(cell: LoadedCell | None) -> bool:
    """Whether a done cell's rows are turns of conversations."""
    return cell is not None and cell.done and bool((cell.samples.turn > 0).any())


def at_turn(samples: Samples, turn: int) -> Samples:
    """The samples of one turn."""
    return samples.take(samples.turn == turn)


def untagged(samples: Samples) -> Samples:
    """The samples keyed by sample alone (the turn dropped from the key): pairs turn t with turn 1."""
    keys = np.array([k.rsplit("|t", 1)[0] for k in samples.key], dtype=object)
    return dataclasses.replace(samples, key=keys)


def turn_rows(own: dict[Slot, LoadedCell], ref_of: Callable[[Slot], LoadedCell | None],
              is_reference: Callable[[Slot], bool], **boot: Any) -> list[TurnRow]:
    """One row per turn of every done cell with conversations (see the module docstring)."""
    rows = []
    for slot in sorted(own):
        cell = own[slot]
        if not has_turns(cell):
            continue
        ref = None if is_reference(slot) else ref_of(slot)
        first = untagged(at_turn(cell.samples, 1))
        for t in sorted({int(x) for x in cell.samples.turn}):
            mine = at_turn(cell.samples, t)
            row: dict[str, Any] = dict(model=slot.model, policy=slot.policy, budget=slot.budget, chunk=slot.chunk,
                                       task=slot.task, turn=t, n=len(mine),
                                       value=stored(float(mine.score.mean() * 100)) if len(mine) else None)
            notes = []
            if ref is not None and ref.done:
                theirs = at_turn(ref.samples, t)
                row["ref_value"] = stored(float(theirs.score.mean() * 100)) if len(theirs) else None
                d = paired_delta(mine, theirs, False, **boot)
                row["n_paired"] = d.paired.n
                if d.ci is not None:
                    row.update(delta=stored(d.ci.estimate), ci_low=stored(d.ci.low), ci_high=stored(d.ci.high))
                notes.append(d.note)
            elif is_reference(slot):
                notes.append("reference")
            else:
                row["state"] = State.MISSING if ref is None else State.FAILED
                notes.append("no reference cell" if ref is None else "reference not done")
            decay = paired_delta(untagged(mine), first, False, **boot)
            if decay.ci is not None:
                row.update(decay=stored(decay.ci.estimate), decay_low=stored(decay.ci.low),
                           decay_high=stored(decay.ci.high))
            rows.append(TurnRow(**row, note="; ".join(n for n in notes if n)))
    return rows


def query_dependence_by_turn(cells: Iterable[LoadedCell], **boot: Any) -> list[ContrastRow]:
    """Query-aware − query-agnostic per turn, for each group of conversation cells that ran both."""
    def key_of(c: LoadedCell) -> tuple[tuple, str]:
        compress, decode = protocol_of(c)
        return (c.view.model, base_policy(c), c.view.grid_budget, int(c.view.chunk_size), decode, c.task), compress

    groups = group_cells([c for c in cells if has_turns(c)], key_of)
    rows = []
    for key in sorted(groups, key=key_order):
        model, policy, budget, chunk, decode, task = key
        sides = groups[key]
        if "prompt" not in sides or "context" not in sides:
            continue
        a = Samples.concat([c.samples for c in sides["prompt"]])
        b = Samples.concat([c.samples for c in sides["context"]])
        for t in sorted({int(x) for x in a.turn} & {int(x) for x in b.turn}):
            sa, sb = at_turn(a, t), at_turn(b, t)
            d = paired_delta(sa, sb, False, **boot)
            row = dict(model=model, policy=policy, budget=budget, task=task,
                       setting=f"B={chunk_text(chunk)}{_decode_note(decode)}, turn {t}",
                       a_label=COMPRESS_NAMES["prompt"], b_label=COMPRESS_NAMES["context"], n_paired=d.paired.n,
                       n_dropped=d.dropped)
            if d.ci is None:
                rows.append(ContrastRow(**row, note="no paired samples"))
                continue
            rows.append(ContrastRow(**row, a_value=stored(float(sa.score[d.paired.own].mean() * 100)),
                                    b_value=stored(float(sb.score[d.paired.ref].mean() * 100)),
                                    delta=stored(d.ci.estimate), ci_low=stored(d.ci.low), ci_high=stored(d.ci.high),
                                    note=d.note))
    return rows
