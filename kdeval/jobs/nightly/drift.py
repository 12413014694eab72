"""Slow drifts over the nightly history: a change-point rule beside the night-to-baseline gate.

The rule, per tracked task score (model × policy × budget × chunk × task): take the last K nights (this one
included) and the K nights before them; for every sample present in all 2K nights, its mean score over
the last K minus its mean score over the K before (points); the paired bootstrap CI of the mean of those
differences (stratified by task instance, as the report's scores). A drift is flagged when the mean drops
by more than ``drift.max_drop`` points **and** the CI's upper end is below ``-drift.max_drop`` — the same
CI-aware test as the gate, over 2K nights instead of two. A slide of 2 points a night that no single
night's gate catches adds up to 2·K points between the two windows. Fewer than 2K nights: no test yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports.samples import LoadedCell
from kdeval.jobs.reports.stats import Interval, paired_bootstrap

#: A series: (model, policy label, budget, chunk, task name).
SeriesKey = tuple[str, str, object, int, str]


@dataclass(frozen=True)
class DriftFinding:
    """A series whose last K nights scored below the K before them beyond the threshold."""

    series: SeriesKey
    interval: Interval         # mean of (last K − K before) per sample, points
    n: int                     # samples present in all 2K nights
    runs: list[str]            # the 2K nights' runs, oldest first
    max_drop: float

    def describe(self) -> str:
        model, policy, budget, chunk, task = self.series
        iv, k = self.interval, len(self.runs) // 2
        budget_text = "" if budget is None else f" N={budget}"
        return (f"{task} {policy}{budget_text} B={chunk_text(chunk)} ({model}): the last {k} nights average "
                f"{-iv.estimate:.2f} points below the {k} before (95% CI of the drop {-iv.high:.2f}..{-iv.low:.2f}, "
                f"{self.n} samples) > {self.max_drop:g}")

    def to_json(self) -> dict:
        return {"series": list(self.series), "delta": self.interval.estimate, "ci_low": self.interval.low,
                "ci_high": self.interval.high, "n": self.n, "runs": self.runs, "max_drop": self.max_drop,
                "text": self.describe()}


def window_test(recent: np.ndarray, before: np.ndarray, strata: np.ndarray | None, max_drop: float, *,
                resamples: int, seed: int, confidence: float) -> tuple[Interval, bool]:
    """The rule on score arrays ``recent`` and ``before`` (``[K, n]``, in [0, 1], columns = the same samples):
    the CI of the mean per-sample difference (points) and whether it flags a drift."""
    diffs = 100.0 * (recent.mean(axis=0) - before.mean(axis=0))
    iv = paired_bootstrap(diffs, strata, resamples=resamples, seed=seed, confidence=confidence)
    return iv, (-iv.estimate > max_drop and -iv.high > max_drop)


def night_scores(cells: list[LoadedCell]) -> dict[SeriesKey, dict[str, tuple[str, float]]]:
    """Per series, sample key -> (task instance, score) of one night's done cells."""
    out: dict[SeriesKey, dict[str, tuple[str, float]]] = {}
    for c in cells:
        if c.samples is None:
            continue
        s = c.slot
        series = out.setdefault((s.model, s.policy, s.budget, s.chunk, c.task), {})
        for key, score in zip(c.samples.key, c.samples.score):
            series[str(key)] = (s.task, float(score))
    return out


def find_drifts(nights: list[tuple[str, list[LoadedCell]]], tracked: set[SeriesKey], k: int, max_drop: float, *,
                resamples: int = 2000, seed: int = 0, confidence: float = 0.95) -> list[DriftFinding]:
    """The rule over ``nights`` ((run, cells), oldest first; the last is tonight) for the ``tracked`` series."""
    if len(nights) < 2 * k:
        return []
    window = nights[-2 * k:]
    scores = [night_scores(cells) for _, cells in window]
    found = []
    for series in sorted(tracked, key=str):
        per_night = [s.get(series, {}) for s in scores]
        keys = sorted(set.intersection(*(set(p) for p in per_night)))
        if len(keys) < 2:
            continue
        grid = np.array([[p[key][1] for key in keys] for p in per_night])  # [2K, n]
        strata = np.array([per_night[0][key][0] for key in keys], dtype=object)
        iv, flagged = window_test(grid[k:], grid[:k], strata, max_drop, resamples=resamples, seed=seed,
                                  confidence=confidence)
        if flagged:
            found.append(DriftFinding(series, iv, len(keys), [run for run, _ in window], max_drop))
    return found
