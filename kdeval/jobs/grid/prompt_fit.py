"""A grid's task instances checked against each model's tokenizer at submit: one prompt of every (model, task,
length, seed) of a task with target lengths is built as a worker builds it, so a length too short for the task's template (``needle`` at 256
tokens), a conversation whose turns do not fit its length (``turns.kv`` with ``turns: 1000``) or a length beyond
the model's context is refused before the run, one line naming ``tasks[i]``, instead of failing (and being
retried) in every cell of it.

Unlike grid validation this imports transformers (for the tokenizers); models whose tokenizer cannot be had
offline (a hub id not cached, ``stub:`` models) are checked when they load.
"""
from __future__ import annotations

import contextlib
import logging
from itertools import product
from typing import Iterator

from kdeval.cluster import catalog
from kdeval.cluster.execute import build_eval_task
from kdeval.evals.task_run.runner import build_prompts
from kdeval.evals.tasks.base import EvalError
from kdeval.evals.tasks.prompting import PromptBuilder
from kdeval.jobs.grid.cells import generation_length
from kdeval.jobs.grid.errors import GridError, GridIssue
from kdeval.jobs.grid.schema import GridSpec


def prompt_issues(grid: GridSpec) -> list[GridIssue]:
    """The task instances of ``grid`` whose first prompt cannot be built for a model (at most one issue per task
    and model)."""
    issues: list[GridIssue] = []
    for m, model in enumerate(grid.models):
        shape = catalog.model_shape(model.id, model.revision)
        tokenizer = catalog.model_tokenizer(model.id, model.revision) if shape is not None else None
        if tokenizer is None:
            continue
        catalog.warn_char_level(tokenizer, model.id)  # a character-level tokenizer: one line on stderr
        builder = PromptBuilder(tokenizer, shape.context or None)
        for i, spec in enumerate(grid.tasks):
            if not spec.lengths:  # natural lengths (LongBench, MATH-500): truncated to fit, and maybe hub data
                continue
            max_new = generation_length(grid.generation, spec.name)
            for length, seed in product(spec.lengths, spec.seeds):
                try:
                    task = build_eval_task(spec.name, dict(spec.params), length=length, seed=seed,
                                           samples=spec.samples, max_new_tokens=max_new)
                    if shape.context:
                        task.check_context(shape.context)
                    with _quiet():
                        build_prompts(task, builder, None, 1, max_new)
                except (EvalError, ValueError) as e:
                    issues.append(GridIssue(f"tasks[{i}]", f"{spec.name} at length {length}: {e} (models[{m}] "
                                                           f"{model.id})"))
                    break
    return issues


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' own warnings (a probe prompt longer than the tokenizer's maximum) silenced: the issue says
    it. Entered once a tokenizer is loaded, so transformers has configured its logger already."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def check_prompts(grid: GridSpec) -> None:
    """Raise :class:`GridError` listing :func:`prompt_issues`."""
    issues = prompt_issues(grid)
    if issues:
        raise GridError(issues)
