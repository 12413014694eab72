"""Metrics by name, for tasks that name theirs in a grid (``tasks[i].params.metric`` of a ``file`` task): each
is the official code of the benchmark it comes from, taking one prediction and its acceptable answers and giving a
score in [0, 1] (the best over the answers where the benchmark takes one)."""
from __future__ import annotations

from typing import Callable, Sequence

from kdeval.evals.metrics.longbench import normalize_answer, qa_f1_score, rouge_score
from kdeval.evals.metrics.string_match import string_match_all, string_match_part
from kdeval.evals.metrics.text import contains_answer
from kdeval.names import suggest

Metric = Callable[[str, Sequence[str]], float]


def _best(fn: Callable[[str, str], float]) -> Metric:
    return lambda prediction, references: max(float(fn(prediction, r)) for r in references)


#: name -> (the metric, where it comes from)
METRICS: dict[str, tuple[Metric, str]] = {
    "string_match_part": (string_match_part, "RULER: 1 if any answer is in the prediction (case-insensitive)"),
    "string_match_all": (string_match_all, "RULER: the share of the answers found in the prediction"),
    "qa_f1": (_best(qa_f1_score), "LongBench: token F1 after SQuAD normalisation, best over the answers"),
    "rouge_l": (_best(rouge_score), "LongBench: ROUGE-L F1 (rouge package), best over the answers"),
    "exact_match": (_best(lambda p, r: float(normalize_answer(p) == normalize_answer(r))),
                    "SQuAD: normalised prediction equals an answer"),
    "contains": (_best(lambda p, r: float(contains_answer(p, r))),
                 "the needle test's: an answer appears in the prediction"),
}


#: metric name -> where a metric that is not built in came from (``kdeval.cluster.plugins``)
ORIGINS: dict[str, str] = {}


def register_metric(name: str, fn: Metric, origin: str) -> None:
    """Add a metric of a plugin (entry-point group ``kdeval.metrics``); a taken name is a ``ValueError``."""
    if name in METRICS and METRICS[name][0] is not fn:
        raise ValueError(f"metric name '{name}' is already taken by the {ORIGINS.get(name, 'built-in')} metric; "
                         "rename it")
    METRICS[name] = (fn, origin)
    ORIGINS[name] = origin


def unregister_metric(name: str) -> None:
    """Remove a plugin's metric (unknown and built-in names are left alone)."""
    if name in ORIGINS:
        METRICS.pop(name, None)
        ORIGINS.pop(name)


def metric_names() -> list[str]:
    return sorted(METRICS)


def get_metric(name: str) -> Metric:
    """The metric ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in METRICS:
        known = ", ".join(metric_names())
        raise ValueError(f"metric: unknown {name!r}{suggest(name, metric_names())} (known: {known})")
    return METRICS[name][0]
