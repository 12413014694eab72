"""Accuracy per KV byte: per model × task, every configuration's score against its peak KV-cache bytes.

A configuration is a policy (with its protocol and KV-store tags: ``keydiff [kivi-4b-g32-w128]``) × budget ×
chunk size; its score pools the task's lengths and seeds (points, mean over samples), its bytes are the most
any of its samples' caches held (``peak_kv_bytes``: payload, scales, zeros and the full-precision window of a
quantized store, kdeval/keydiff/quant/store.py). A configuration is *dominated* when another scores at least as much
with at most its bytes (one of the two strictly); the others form the Pareto frontier. At a frontier
configuration's bytes it is the best any configuration does (that is what being on the frontier means), and its
row gives the margin over the best other configuration within those bytes, paired by sample with a bootstrap CI:
a CI that spans 0 means the runs cannot tell the two apart at that byte level.

Rows exist only for a model × task whose cells include a quantized store, so reports of runs without
``kv_quant`` are unchanged.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from kdeval.evals.task_run.budget import budget_order
from kdeval.jobs.reports.report_rows import FrontierRow, State, stored
from kdeval.jobs.reports.samples import LoadedCell, Samples, paired_delta

#: bits of a stored number at the model's own width, by the grid's dtype (``auto``: unknown)
DTYPE_BITS = {"float16": 16, "bfloat16": 16, "float32": 32}


def kv_bits(cell: LoadedCell) -> int | None:
    """Bits per stored number of a cell: its ``kv_quant`` bits, else its model's width (None when unknown)."""
    spec = cell.view.spec or {}
    quant = spec.get("kv_quant")
    if quant:
        return int(quant.get("bits", 4))
    return DTYPE_BITS.get(str((spec.get("model") or {}).get("dtype", "")))


def _point(cells: list[LoadedCell]) -> tuple[Samples, int | None, str]:
    done = [c for c in cells if c.done]
    samples = Samples.concat([c.samples for c in done])
    kv = np.concatenate([c.perf["peak_kv_bytes"] for c in done]) if done else np.array([])
    kv = kv[~np.isnan(kv)]
    if len(done) == len(cells):
        state = State.OK
    elif done:
        state = State.PARTIAL
    else:  # "done" here: done in the index, but its file could not be read
        state = State.FAILED if any(c.view.state in ("failed", "done") for c in cells) else State.PENDING
    return samples, (int(kv.max()) if kv.size else None), state


def _dominates(a: FrontierRow, b: FrontierRow) -> bool:
    return (a.kv_bytes <= b.kv_bytes and a.value >= b.value
            and (a.kv_bytes < b.kv_bytes or a.value > b.value))


def _group_rows(model: str, task: str, configs: dict[tuple, list[LoadedCell]], **boot: Any) -> list[FrontierRow]:
    rows, samples = [], {}
    for (policy, budget, chunk, bits), cells in configs.items():
        s, kv, state = _point(cells)
        value = stored(float(s.score.mean() * 100)) if len(s) else None
        row = FrontierRow(model=model, task=task, policy=policy, budget=budget, chunk=chunk, kv_bits=bits,
                          state=state, n=len(s), value=value, kv_bytes=kv)
        samples[row.config] = s
        rows.append(row)
    scored = [r for r in rows if r.value is not None and r.kv_bytes is not None]
    out = []
    for r in rows:
        if r not in scored:
            out.append(r)
            continue
        over = [o for o in scored if o is not r and _dominates(o, r)]
        if over:
            best = min(over, key=lambda o: (o.kv_bytes, -o.value))
            out.append(_with(r, position="dominated", dominated_by=best.config))
            continue
        within = [o for o in scored if o is not r and o.kv_bytes <= r.kv_bytes]
        if not within:
            out.append(_with(r, position="frontier", note="fewest bytes"))
            continue
        runner = max(within, key=lambda o: (o.value, -o.kv_bytes))
        d = paired_delta(samples[r.config], samples[runner.config], False, **boot)
        extra = dict(position="frontier", runner_up=runner.config, n_paired=d.paired.n)
        if d.ci is None:
            out.append(_with(r, **extra, note="no paired samples"))
        else:
            out.append(_with(r, **extra, delta=stored(d.ci.estimate), ci_low=stored(d.ci.low),
                             ci_high=stored(d.ci.high), note=d.note))
    return sorted(out, key=lambda r: (r.kv_bytes is None, r.kv_bytes or 0, -(r.value or 0.0)))


def _with(row: FrontierRow, **changes: Any) -> FrontierRow:
    from dataclasses import replace

    return replace(row, **changes)


def kv_frontier(cells: Iterable[LoadedCell], **boot: Any) -> list[FrontierRow]:
    """The frontier rows of every model × task whose cells include a quantized KV store (module docstring)."""
    groups: dict[tuple, dict[tuple, list[LoadedCell]]] = defaultdict(lambda: defaultdict(list))
    quantized: set[tuple] = set()
    for c in cells:
        key = (c.view.model, c.task)
        spec = c.view.spec or {}
        groups[key][(c.slot.policy, c.view.grid_budget, int(c.view.chunk_size), kv_bits(c))].append(c)
        if spec.get("kv_quant"):
            quantized.add(key)
    rows: list[FrontierRow] = []
    for key in sorted(quantized):
        configs = dict(sorted(groups[key].items(), key=lambda kv: (kv[0][0], budget_order(kv[0][1]), kv[0][2])))
        rows += _group_rows(*key, configs, **boot)
    return rows
