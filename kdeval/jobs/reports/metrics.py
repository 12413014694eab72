"""Which numbers a report shows for a set of tasks: each benchmark's headline numbers, as it defines them.

Every number is the (stratified) mean of per-sample scores over a selection of samples, in points:

* every task: its score (LongBench per-task score, RULER task score, Math-500 accuracy, needle
  ``contains``, phonebook accuracy — the same means as each task's ``aggregate`` in ``kdeval.evals``);
* LongBench: ``longbench.avg`` (mean of the task scores), and per LongBench-E length bucket
  (``0-4k``, ``4-8k``, ``8k+`` words) per task and averaged;
* RULER: ``ruler.avg`` (mean of the task scores), per length per task and averaged;
* Math-500: accuracy per level; needle: accuracy per length × depth; phonebook: per length.

A number that would only repeat another is not defined: no benchmark average over a single task, no
slice when the task (or average) has a single one (one length, one level, one bucket).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kdeval.jobs.reports.samples import Samples, benchmark_of

#: LongBench-E length buckets (words), as in the official eval script.
LONGBENCH_E_BUCKETS: tuple[tuple[str, float, float], ...] = (
    ("0-4k", 0, 4000), ("4-8k", 4000, 8000), ("8k+", 8000, float("inf")),
)
#: Benchmarks whose average over tasks is a headline number.
AVERAGED = ("longbench", "ruler")

Selector = Callable[[Samples], np.ndarray]


@dataclass(frozen=True)
class MetricDef:
    """One number: which samples, and whether it is a mean of per-task means (``stratified``)."""

    level: str                   # "task" | "benchmark" | "detail"
    benchmark: str
    metric: str
    tasks: frozenset[str]        # tasks whose cells it depends on (for its state)
    select: Selector
    stratified: bool = False
    length: int | None = None
    depth: float | None = None
    subset: str | None = None

    @property
    def sort_key(self) -> tuple:
        order = {"task": 0, "benchmark": 1, "detail": 2}[self.level]
        return (self.benchmark, order, self.metric, self.length or 0, self.depth or 0.0, self.subset or "")


def _task_is(names: frozenset[str]) -> Selector:
    return lambda s: np.isin(s.task, list(names))


def _and(a: Selector, b: Selector) -> Selector:
    return lambda s: a(s) & b(s)


def _length_is(value: float) -> Selector:
    return lambda s: s.length == value


def _depth_is(value: float) -> Selector:
    return lambda s: s.depth == value


def _subset_is(value: str) -> Selector:
    return lambda s: s.subset == value


def _bucket_is(low: float, high: float) -> Selector:
    return lambda s: (s.length >= low) & (s.length < high)


def _lengths(samples: Samples, mask: np.ndarray) -> list[float]:
    vals = samples.length[mask]
    return sorted({float(v) for v in vals if not np.isnan(v)})


def _buckets(samples: Samples, mask: np.ndarray) -> list[tuple[str, Selector]]:
    """The LongBench-E buckets that hold some of the ``mask``-ed samples: (label, selector)."""
    return [(label, _bucket_is(low, high)) for label, low, high in LONGBENCH_E_BUCKETS
            if (mask & (samples.length >= low) & (samples.length < high)).any()]


def _task_details(task: str, bench: str, samples: Samples) -> list[MetricDef]:
    """Slices of one task's score."""
    only = frozenset({task})
    base = _task_is(only)
    mask = base(samples)
    out: list[MetricDef] = []
    if bench == "needle":
        pairs = sorted({(float(l), float(d)) for l, d in zip(samples.length[mask], samples.depth[mask])
                        if not (np.isnan(l) or np.isnan(d))})
        for length, depth in pairs:
            sel = _and(base, _and(_length_is(length), _depth_is(depth)))
            out.append(MetricDef("detail", bench, task, only, sel, length=int(length), depth=depth))
    elif bench in ("ruler", "phonebook"):
        for length in _lengths(samples, mask):
            out.append(MetricDef("detail", bench, task, only, _and(base, _length_is(length)), length=int(length)))
    elif bench == "math500":
        for level in sorted({str(x) for x in samples.subset[mask] if x}):
            out.append(MetricDef("detail", bench, task, only, _and(base, _subset_is(level)), subset=level))
    elif bench == "longbench":
        for label, in_bucket in _buckets(samples, mask):
            out.append(MetricDef("detail", bench, task, only, _and(base, in_bucket), subset=label))
    return out if len(out) > 1 else []  # a single slice is the task's own score


def _benchmark_defs(bench: str, tasks: frozenset[str], samples: Samples) -> list[MetricDef]:
    """The benchmark average and its per-length slices."""
    name = f"{bench}.avg"
    base = _task_is(tasks)
    out = [MetricDef("benchmark", bench, name, tasks, base, stratified=True)]
    mask = base(samples)
    slices = []
    if bench == "ruler":
        for length in _lengths(samples, mask):
            slices.append(MetricDef("detail", bench, name, tasks, _and(base, _length_is(length)), True,
                                    length=int(length)))
    elif bench == "longbench":
        for label, in_bucket in _buckets(samples, mask):
            slices.append(MetricDef("detail", bench, name, tasks, _and(base, in_bucket), True, subset=label))
    return out + (slices if len(slices) > 1 else [])  # a single slice is the average itself


def metric_defs(tasks: set[str], samples: Samples) -> list[MetricDef]:
    """Every number to report for a configuration that ran ``tasks`` (slices found in ``samples``)."""
    by_bench: dict[str, set[str]] = {}
    for t in tasks:
        by_bench.setdefault(benchmark_of(t), set()).add(t)
    defs: list[MetricDef] = []
    for bench, names in by_bench.items():
        for t in sorted(names):
            defs.append(MetricDef("task", bench, t, frozenset({t}), _task_is(frozenset({t}))))
            defs.extend(_task_details(t, bench, samples))
        if bench in AVERAGED and len(names) > 1:  # the average of one task is that task's score
            defs.extend(_benchmark_defs(bench, frozenset(names), samples))
    return sorted(defs, key=lambda d: d.sort_key)
