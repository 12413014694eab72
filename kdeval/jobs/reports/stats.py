"""Means and paired bootstrap confidence intervals over (optionally stratified) per-sample differences.

A headline number is a weighted mean of per-sample scores: one stratum for a task's score, one stratum
per task with equal weights for a benchmark average ("the mean of the per-task scores"). The paired
bootstrap resamples the per-sample differences with replacement *within* each stratum, recomputes the
same weighted mean, and takes the percentile interval. It is seeded: same inputs, same interval.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile CI."""

    estimate: float
    low: float
    high: float


def stratified_mean(values: np.ndarray, strata: np.ndarray | None = None) -> float:
    """Mean of the per-stratum means (each stratum weighs the same); the plain mean without strata."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return float("nan")
    if strata is None:
        return float(values.mean())
    return _mean_of_groups(values, _groups(strata))


def _mean_of_groups(values: np.ndarray, groups: list[np.ndarray]) -> float:
    return float(np.mean([values[idx].mean() for idx in groups]))


def _groups(strata: np.ndarray) -> list[np.ndarray]:
    """Index arrays of each distinct stratum, in sorted stratum order."""
    strata = np.asarray(strata)
    _, inverse = np.unique(strata, return_inverse=True)
    return [np.flatnonzero(inverse == k) for k in range(int(inverse.max()) + 1)] if strata.size else []


def paired_bootstrap(
    diffs: np.ndarray, strata: np.ndarray | None = None, *, resamples: int = 2000, seed: int = 0,
    confidence: float = 0.95,
) -> Interval:
    """Point estimate and ``confidence`` CI of the (stratified) mean of paired differences.

    Args:
        diffs: per-sample differences ``score_this − score_reference`` of the paired samples.
        strata: a label per sample (e.g. its task); the estimate is the mean of per-stratum means.
        resamples: bootstrap resamples (0: no interval, ``low == high == estimate``).
        seed: the generator's seed.
        confidence: e.g. 0.95 for the 2.5th..97.5th percentiles.
    """
    diffs = np.asarray(diffs, dtype=float)
    if diffs.size == 0:
        raise ValueError("paired_bootstrap: no paired samples")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 0:
        raise ValueError(f"resamples must be >= 0, got {resamples}")
    groups = [np.arange(diffs.size)] if strata is None else _groups(strata)
    estimate = _mean_of_groups(diffs, groups)
    if resamples == 0:
        return Interval(estimate, estimate, estimate)
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    for g in groups:
        d = diffs[g]
        picks = rng.integers(0, d.size, size=(resamples, d.size))
        total += d[picks].mean(axis=1)
    # a constant difference gives exactly [c, c]: the interval is clamped around the estimate
    return _percentile_interval(estimate, total / len(groups), confidence)


def median_ratio_bootstrap(
    own: np.ndarray, ref: np.ndarray, *, resamples: int = 2000, seed: int = 0, confidence: float = 0.95,
) -> Interval | None:
    """``median(own) / median(ref)`` over paired samples and its percentile CI from resampled pairs.

    Args:
        own, ref: ``[n]`` per-sample values (e.g. TTFT seconds) of the same samples, in the same order.
        resamples: bootstrap resamples (0: no interval, ``low == high == estimate``).
    Returns None without samples or when the reference's median is not positive.
    """
    own, ref = np.asarray(own, dtype=float), np.asarray(ref, dtype=float)
    if own.shape != ref.shape:
        raise ValueError(f"median_ratio_bootstrap: {own.size} own values vs {ref.size} reference values (paired)")
    if own.size == 0 or np.median(ref) <= 0:
        return None
    estimate = float(np.median(own) / np.median(ref))
    if resamples == 0:
        return Interval(estimate, estimate, estimate)
    picks = np.random.default_rng(seed).integers(0, own.size, size=(resamples, own.size))
    den = np.median(ref[picks], axis=1)
    ratios = np.median(own[picks], axis=1)[den > 0] / den[den > 0]
    return _percentile_interval(estimate, ratios, confidence)


def _percentile_interval(estimate: float, resampled: np.ndarray, confidence: float) -> Interval:
    """``estimate`` with the percentile CI of its ``resampled`` values (zero width when there are none)."""
    if resampled.size == 0:
        return Interval(estimate, estimate, estimate)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(resampled, [alpha, 1.0 - alpha])
    return Interval(estimate, float(min(low, estimate)), float(max(high, estimate)))


def unpaired_median_ratio_bootstrap(
    own: np.ndarray, ref: np.ndarray, *, resamples: int = 2000, seed: int = 0, confidence: float = 0.95,
) -> Interval | None:
    """``median(own) / median(ref)`` of two independent samples (e.g. batch timings of cells batched
    differently) and its percentile CI, each side resampled on its own.

    Args:
        own: ``[n]`` values of this cell; ref: ``[m]`` values of the reference.
    Returns None when either is empty or the reference's median is not positive."""
    own, ref = np.asarray(own, dtype=float), np.asarray(ref, dtype=float)
    if own.size == 0 or ref.size == 0 or np.median(ref) <= 0:
        return None
    estimate = float(np.median(own) / np.median(ref))
    if resamples == 0:
        return Interval(estimate, estimate, estimate)
    rng = np.random.default_rng(seed)
    num = np.median(own[rng.integers(0, own.size, size=(resamples, own.size))], axis=1)
    den = np.median(ref[rng.integers(0, ref.size, size=(resamples, ref.size))], axis=1)
    return _percentile_interval(estimate, num[den > 0] / den[den > 0], confidence)
