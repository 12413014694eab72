"""A grid's entries checked against what exists: model and policy names and parameters (through
``kdeval.cluster.catalog``), task names and parameters (``kdeval.evals.benchmarks.registry``), budgets against what a
policy always keeps, and protocols against the tasks that can run them.
"""
from __future__ import annotations

from typing import Any

from kdeval.cluster import catalog
from kdeval.cluster.execute import GRID_OWNED_TASK_PARAMS
from kdeval.cluster.stub import stub_seconds
from kdeval.evals.benchmarks import registry as task_registry
from kdeval.evals.task_run.budget import is_share, resolve_budget
from kdeval.jobs.grid.errors import GridIssue
from kdeval.names import RANDOM_PREFIX, suggest  # the built-in tiny random models (``stub:<s>``: see :func:`stub_seconds`)


def check_policy(index: int, name: str, params: dict[str, Any]) -> list[GridIssue]:
    """Issues for ``policies[index]``: unknown name (with a suggestion) or bad parameters."""
    path = f"policies[{index}]"
    names = catalog.policy_names()
    if name not in names:
        return [GridIssue(f"{path}.name", f"unknown policy '{name}'{suggest(name, names)}; "
                                          f"expected one of {', '.join(sorted(names))}")]
    msg = catalog.policy_param_error(name, params)
    if msg is None:
        return []
    head, sep, rest = msg.partition(":")
    if sep and head.strip().split(".")[0] in params:  # a nested policy's field: inner.params.pooling
        return [GridIssue(f"{path}.params.{head.strip()}", rest.strip())]
    return [GridIssue(f"{path}.params", msg)]


def check_task(index: int, name: str, params: dict[str, Any] | None = None) -> list[GridIssue]:
    """Issues for ``tasks[index]``: an unknown task name (with a suggestion) or unknown parameters."""
    names = task_registry.task_names()
    if name not in names:
        return [GridIssue(f"tasks[{index}].name", f"unknown task '{name}'{suggest(name, names)}; "
                                                  "run `kdeval tasks` for the list")]
    if not params:
        return []
    allowed = dict(task_registry.get_spec(name).params())
    issues = []
    for key in params:
        path = f"tasks[{index}].params.{key}"
        if key in GRID_OWNED_TASK_PARAMS:
            issues.append(GridIssue(path, f"set it with {GRID_OWNED_TASK_PARAMS[key].replace('[i]', f'[{index}]')}"))
        elif key not in allowed:
            choices = [k for k in allowed if k not in GRID_OWNED_TASK_PARAMS]
            issues.append(GridIssue(path, f"unknown parameter for task '{name}'{suggest(key, choices)}; "
                                          f"expected one of {', '.join(choices) or 'none'}"))
    return issues


def check_budgets(index: int, name: str, params: dict[str, Any], budgets: list[int | str]) -> list[GridIssue]:
    """Issues for token budgets smaller than what ``policies[index]`` always keeps (sink and recent tokens).

    A share (``"25%"``) resolves per sample once its prompt is tokenized: the runner fails the cell, naming
    the sample, when a sample's N is below that minimum (``kdeval.evals.task_run.budget.budget_groups``);
    :func:`share_budget_notes` warns at submit when a task's target length already says so."""
    issues = []
    for budget in budgets:
        if is_share(budget):
            continue
        msg = catalog.policy_budget_error(name, params, budget)
        if msg is not None:
            issues.append(GridIssue("budgets", f"{msg.removeprefix('budget: ')} (policies[{index}])"))
    return issues


def share_budget_notes(index: int, name: str, params: dict[str, Any], budgets: list[int | str],
                       lengths: list[tuple[int, str, int]]) -> list[str]:
    """Warnings for shares that look too small for ``policies[index]``: at a task's target ``length`` (given
    as (task index, task name, longest length)) a share resolves to about ``N = int(length × share)`` (kvpress's count, :func:`resolve_budget`); below what
    the policy always keeps, its samples will fail. Prompts are only about their target length (shorter
    under ``compress: context``), hence a note, not a grid error."""
    notes = []
    for share in (b for b in budgets if is_share(b)):
        for i, task, length in lengths:
            n = resolve_budget(share, length)
            msg = catalog.policy_budget_error(name, params, n)
            if msg is not None:
                notes.append(f"budgets: {share} of tasks[{i}] ({task}) at length {length} is about N={n}; "
                             f"{msg.removeprefix('budget: ')} (policies[{index}]): its samples will fail")
    return notes


def check_protocol(compress: str, tasks: list[str], policies: list[tuple[str, dict[str, Any]]] = ()
                   ) -> list[GridIssue]:
    """``protocol.compress: context`` needs tasks whose question is separate from their context; ``generated``
    tasks of one question per context and policies that score generated tokens (``policies``: name and
    params)."""
    if compress == "generated":
        issues = [GridIssue("protocol.compress", f"generated: tasks[{i}] ({name}) asks several questions per "
                                                 "context; compress: generated runs one question per context")
                  for i, name in enumerate(tasks) if task_registry.get_spec(name).cls.multi_question]
        for i, (name, params) in enumerate(policies):
            why = catalog.policy_protocol_error(name, params, compress)
            if why is not None:
                issues.append(GridIssue("protocol.compress", f"generated: policies[{i}] '{name}' {why}"))
        return issues
    if compress != "context":
        return []
    return [GridIssue("protocol.compress", f"context: tasks[{i}] ({name}) has no question apart from its context; "
                                           "use compress: prompt for it")
            for i, name in enumerate(tasks) if not task_registry.get_spec(name).cls.separable_question]


def check_conversation(conversation: Any, tasks: list[str]) -> list[GridIssue]:
    """A grid's ``conversation`` (one ``ConversationSpec``, a list, or None) needs tasks with several questions
    per context (without it such tasks run multi-turn with golden answers), and own answers need multi-turn."""
    if conversation is None:
        return []
    listed = conversation if isinstance(conversation, list) else [conversation]
    issues = [GridIssue(f"conversation[{i}]" if isinstance(conversation, list) else "conversation",
                        "answers: 'own' needs mode 'multi-turn' (a multi-request turn feeds no answer back)")
              for i, c in enumerate(listed) if c.mode == "multi-request" and c.answers != "golden"]
    return issues + [GridIssue("conversation", f"tasks[{i}] ({name}) asks one question per context; multi-turn and "
                                      f"multi-request runs need a task with several (turns.*, scbench.*); drop it or the "
                                      f"conversation")
            for i, name in enumerate(tasks) if not task_registry.get_spec(name).cls.multi_question]


def check_model(index: int, model_id: str, revision: str | None = None) -> list[GridIssue]:
    """Issues for ``models[index].id``: unknown random/stub names, and ids that name no loadable model (a path
    without config.json, a URL, a malformed hub id, a config, tokenizer file or weights refused:
    :func:`kdeval.cluster.catalog.model_id_problem`)."""
    path = f"models[{index}].id"
    bad_stub = [GridIssue(path, f"expected 'stub:<seconds per cell>' such as 'stub:0.1', got '{model_id}'")]
    try:
        seconds = stub_seconds(model_id)
    except ValueError:
        return bad_stub
    if seconds is not None:
        return bad_stub if seconds < 0 else []
    if model_id.startswith(RANDOM_PREFIX):
        names = catalog.random_model_names()
        if model_id not in names:
            return [GridIssue(path, f"unknown random model '{model_id}'{suggest(model_id, names)}; "
                                    f"expected one of {', '.join(names)}")]
        return []
    # too long: the schema says it
    problem = catalog.model_id_problem(model_id, revision) if len(model_id) <= 300 else None
    return [] if problem is None else [GridIssue(path, problem)]
