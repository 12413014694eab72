"""A grid's settings checked against each model's shape, read without its weights
(:func:`kdeval.cluster.catalog.model_shape`: ``head_dim`` and the context), so that a setting the model cannot
take is refused at submit (``--dry-run`` included), one line naming the field, instead of failing every attempt
of its cells at run time:

- ``kv_quant[j].group_size`` must divide the head_dim (an unset one is derived from it: :func:`resolved_quant`);
- ``budgets``, ``chunk_sizes`` and each task's ``lengths`` must fit the context (``max_position_embeddings``);
- each policy must run on the model's layers: not one the engine refuses beside windowed layers (a hybrid model)
  or on a multi-head latent attention cache (:func:`kdeval.cluster.catalog.policy_model_error`).

These run with the grid's validation (no transformers); what needs a tokenizer (a length too short for a task's
template) is :mod:`kdeval.jobs.grid.prompt_fit`'s.

A model whose shape cannot be known offline (a hub id not in the local cache) is checked when it loads.
"""
from __future__ import annotations

from typing import Any

from kdeval.cluster import catalog
from kdeval.jobs.grid.errors import GridIssue
from kdeval.jobs.grid.quant import KVQuantSpec, default_group
from kdeval.jobs.grid.schema import GridSpec, ModelSpec


def shapes(grid: GridSpec) -> list[Any]:
    """Each model's shape (None where it cannot be known offline), in ``grid.models`` order."""
    return [catalog.model_shape(m.id, m.revision) for m in grid.models]


def resolved_quant(quant: KVQuantSpec | None, shape: Any) -> KVQuantSpec | None:
    """``quant`` with its group set for a model of ``shape`` (:func:`kdeval.jobs.grid.quant.default_group`)."""
    return None if quant is None else quant.for_head_dim(shape.head_dim if shape is not None else None)


def quant_notes(grid: GridSpec, model_shapes: list[Any]) -> list[str]:
    """What an unset ``group_size`` became where it is not KIVI's 32 (said at submit)."""
    notes = []
    for j, q in enumerate(grid.kv_quant):
        if q is None or q.group_size is not None:
            continue
        for m, shape in zip(grid.models, model_shapes):
            if shape is not None and default_group(shape.head_dim) != default_group(None):
                notes.append(f"kv_quant[{j}].group_size: unset, so {default_group(shape.head_dim)} for {m.id} (its "
                             f"head_dim {shape.head_dim} does not take KIVI's {default_group(None)})")
    return notes


def _name(m: int, model: ModelSpec) -> str:
    return f"models[{m}] ({model.id})"


def _over_context(field: str, values: list[Any], context: int, who: str, what: str) -> list[GridIssue]:
    return [GridIssue(f"{field}[{k}]", f"{v} {what} is more than {who}'s context of {context} tokens "
                                       f"(max_position_embeddings)")
            for k, v in enumerate(values) if isinstance(v, int) and not isinstance(v, bool) and v > context]


def fit_issues(grid: GridSpec, model_shapes: list[Any]) -> list[GridIssue]:
    """Every setting of ``grid`` that a model of ``model_shapes`` cannot take (each at its path)."""
    issues: list[GridIssue] = []
    for m, (model, shape) in enumerate(zip(grid.models, model_shapes)):
        if shape is None:
            continue
        who = _name(m, model)
        for i, p in enumerate(grid.policies):
            why = catalog.policy_model_error(p.name, dict(p.params), shape)
            if why is not None:
                issues.append(GridIssue(f"policies[{i}]", f"'{p.name}' {why} (models[{m}] {model.id})"))
        for j, q in enumerate(grid.kv_quant):
            if q is not None and q.group_size is not None and shape.head_dim % q.group_size:
                issues.append(GridIssue(f"kv_quant[{j}].group_size", f"expected a divisor of {who}'s head_dim "
                                        f"{shape.head_dim}, got {q.group_size}"))
        if not shape.context:
            continue
        issues += _over_context("budgets", grid.budgets, shape.context, who, "tokens kept")
        issues += _over_context("chunk_sizes", grid.chunk_sizes, shape.context, who, "tokens per chunk")
        for i, task in enumerate(grid.tasks):
            issues += _over_context(f"tasks[{i}].lengths", task.lengths or [], shape.context, who, "tokens")
    return issues
