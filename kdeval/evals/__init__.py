"""Evaluation suites: needle-in-a-haystack, RULER, LongBench v1 and v2, InfiniteBench, LooGLE, MATH-500, AIME 2025, phonebook.

Public API (what the service layer calls):

- :func:`get_task` / :func:`get_spec` / :data:`REGISTRY` / :func:`expand`: tasks by name.
- :func:`run_task`: one cell -> per-sample rows (:class:`EvalRow`); :func:`aggregate`: headline numbers.
- :func:`get_scorer`, :func:`score_records`: re-score stored predictions without a model.
- Errors: :class:`EvalError` (bad input), :class:`UnknownTaskError`, :class:`DataNotFoundError`,
  :class:`TaskUnavailableError` (skip: e.g. a hub dataset offline), :class:`ContextTooLongError`.

Importing this package does not import torch or the engine; :func:`run_task` does, lazily.
"""
from kdeval.evals.base import (
    ContextTooLongError, DataNotFoundError, EvalError, Sample, ScoreResult, Task, TaskUnavailableError,
    UnknownTaskError,
)
from kdeval.evals.prompting import BuiltPrompt, PromptBuilder
from kdeval.evals.registry import REGISTRY, SUITES, TaskSpec, expand, get_scorer, get_spec, get_task, task_names
from kdeval.evals.scoring import read_predictions, score_records

__all__ = [
    "ContextTooLongError", "DataNotFoundError", "EvalError", "Sample", "ScoreResult", "Task", "TaskUnavailableError",
    "UnknownTaskError", "BuiltPrompt", "PromptBuilder", "REGISTRY", "SUITES", "TaskSpec", "expand", "get_scorer",
    "get_spec", "get_task", "task_names", "read_predictions", "score_records", "run_task", "aggregate", "EvalRow",
]


def __getattr__(name: str):
    """Lazy access to the runner (it imports torch)."""
    if name == "EvalRow":
        from kdeval.evals.rows import EvalRow

        return EvalRow
    if name in ("run_task", "aggregate", "build_prompts"):
        from kdeval.evals import runner

        return getattr(runner, name)
    raise AttributeError(name)
