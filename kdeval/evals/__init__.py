"""Evaluation suites: needle-in-a-haystack, RULER, LongBench v1 and v2, InfiniteBench, LooGLE, MATH-500, AIME 2025,
phonebook, SCBench and multi-turn synthetic tasks.

Three rooms, each importing only the ones below it (README.md has the map):

- ``tasks/``: what a task is (``Task``, ``Sample``, errors), data files, prompt building, scoring.
- ``benchmarks/``: one file or folder per benchmark, and ``registry`` naming their tasks; ``metrics/`` holds
  the official metric code they score with.
- ``task_run/``: running a task on the engine: :class:`RunSettings`, :func:`run_task`, the loops it drives, rows,
  groups of cells.

Public API (what the service layer calls):

- :func:`get_task` / :func:`get_spec` / :data:`REGISTRY` / :func:`expand`: tasks by name.
- :func:`run_task` with a :class:`RunSettings`: one cell -> per-sample rows (:class:`EvalRow`); :func:`aggregate`:
  headline numbers.
- :func:`get_scorer`, :func:`score_records`: re-score stored predictions without a model.
- Errors: :class:`EvalError` (bad input), :class:`UnknownTaskError`, :class:`DataNotFoundError`,
  :class:`TaskUnavailableError` (skip: e.g. a hub dataset offline), :class:`ContextTooLongError`.

Importing this package does not import torch or the engine; :func:`run_task` does, lazily.
"""
from kdeval.evals.benchmarks.registry import (
    REGISTRY, SUITES, TaskSpec, expand, get_scorer, get_spec, get_task, task_names,
)
from kdeval.evals.tasks.base import (
    ContextTooLongError, DataNotFoundError, EvalError, Sample, ScoreResult, Task, TaskUnavailableError,
    UnknownTaskError,
)
from kdeval.evals.tasks.prompting import BuiltPrompt, PromptBuilder
from kdeval.evals.tasks.scoring import read_predictions, score_records

__all__ = [
    "ContextTooLongError", "DataNotFoundError", "EvalError", "Sample", "ScoreResult", "Task", "TaskUnavailableError",
    "UnknownTaskError", "BuiltPrompt", "PromptBuilder", "REGISTRY", "SUITES", "TaskSpec", "expand", "get_scorer",
    "get_spec", "get_task", "task_names", "read_predictions", "score_records", "run_task", "aggregate", "EvalRow",
    "RunSettings",
]


def __getattr__(name: str):
    """Lazy access to the run side (the runner imports torch)."""
    if name == "EvalRow":
        from kdeval.evals.task_run.rows import EvalRow

        return EvalRow
    if name == "RunSettings":
        from kdeval.evals.task_run.settings import RunSettings

        return RunSettings
    if name in ("run_task", "aggregate", "build_prompts"):
        from kdeval.evals.task_run import runner

        return getattr(runner, name)
    raise AttributeError(name)
