"""Names the grid may use: policies and models (through ``kdeval.cluster.catalog``) and tasks
(``kdeval.evals.registry``, imported lazily; when it is missing task names are not checked).
"""
from __future__ import annotations

import importlib
from typing import Any

from kdeval.cluster import catalog
from kdeval.jobs.errors import GridIssue, did_you_mean

#: Model-name prefixes with special meaning.
RANDOM_PREFIX, STUB_PREFIX = "random:", "stub:"


def _try_import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def check_policy(index: int, name: str, params: dict[str, Any]) -> list[GridIssue]:
    """Issues for ``policies[index]``: unknown name (with a suggestion) or bad parameters."""
    path = f"policies[{index}]"
    names = catalog.policy_names()
    if name not in names:
        return [GridIssue(f"{path}.name", f"unknown policy '{name}'{did_you_mean(name, names)}; "
                                          f"expected one of {', '.join(sorted(names))}")]
    msg = catalog.policy_param_error(name, params)
    if msg is None:
        return []
    head, sep, rest = msg.partition(":")
    if sep and head.strip() in params:
        return [GridIssue(f"{path}.params.{head.strip()}", rest.strip())]
    return [GridIssue(f"{path}.params", msg)]


def _task_registry():
    return _try_import("kdeval.evals.registry")


def task_names() -> list[str] | None:
    """Registered task names, or None when the evals registry is not importable."""
    reg = _task_registry()
    if reg is None:
        return None
    for attr in ("list_tasks", "task_names"):
        fn = getattr(reg, attr, None)
        if callable(fn):
            return list(fn())
    return None


#: Task constructor parameters set by the grid's own fields, not through ``tasks[i].params``.
GRID_OWNED_TASK_PARAMS = {"lengths": "tasks[i].lengths", "seed": "tasks[i].seeds",
                          "num_samples": "tasks[i].samples", "max_new_tokens": "generation.max_new_tokens"}


def check_task(index: int, name: str, params: dict[str, Any] | None = None) -> list[GridIssue]:
    """Issues for ``tasks[index]``: an unknown task name (with a suggestion) or unknown parameters."""
    names = task_names()
    if names is None:
        return []
    if name not in names:
        return [GridIssue(f"tasks[{index}].name", f"unknown task '{name}'{did_you_mean(name, names)}; "
                                                  "run `kdeval tasks` for the list")]
    reg = _task_registry()
    get_spec = getattr(reg, "get_spec", None)
    if not params or not callable(get_spec):
        return []
    allowed = dict(get_spec(name).params())
    issues = []
    for key in params:
        path = f"tasks[{index}].params.{key}"
        if key in GRID_OWNED_TASK_PARAMS:
            issues.append(GridIssue(path, f"set it with {GRID_OWNED_TASK_PARAMS[key].replace('[i]', f'[{index}]')}"))
        elif key not in allowed:
            choices = [k for k in allowed if k not in GRID_OWNED_TASK_PARAMS]
            issues.append(GridIssue(path, f"unknown parameter for task '{name}'{did_you_mean(key, choices)}; "
                                          f"expected one of {', '.join(choices) or 'none'}"))
    return issues


def task_data_version(name: str) -> str:
    """The data version of a task (part of cell identity); "1" when the registry does not say."""
    reg = _task_registry()
    fn = getattr(reg, "data_version", None) if reg is not None else None
    if callable(fn):
        try:
            return str(fn(name))
        except Exception:  # noqa: BLE001 - unknown task names are reported by check_task
            return "1"
    return "1"


def check_model(index: int, model_id: str) -> list[GridIssue]:
    """Issues for ``models[index].id``: unknown random/stub names."""
    path = f"models[{index}].id"
    if model_id.startswith(STUB_PREFIX):
        try:
            if float(model_id[len(STUB_PREFIX):]) < 0:
                raise ValueError
        except ValueError:
            return [GridIssue(path, f"expected 'stub:<seconds per cell>' such as 'stub:0.1', got '{model_id}'")]
        return []
    if model_id.startswith(RANDOM_PREFIX):
        names = catalog.random_model_names()
        if model_id not in names:
            return [GridIssue(path, f"unknown random model '{model_id}'{did_you_mean(model_id, names)}; "
                                    f"expected one of {', '.join(names)}")]
    return []
