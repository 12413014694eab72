"""The real workload: load a model with the engine, run one task through the evals runner.

This is the only module where the cluster layer touches the engine and the evaluations; the
scheduler only sees :class:`~kdeval.cluster.workload.Workload`. Model ids ``stub:<s>`` are delegated to
:class:`~kdeval.cluster.stub.StubWorkload` (no torch needed).

How a cell becomes a task: the grid's task ``params`` are passed to the task's constructor, plus
``lengths=[cell length]``, ``seed`` and ``num_samples`` when the task has those parameters, and
``max_new_tokens`` from the grid's generation settings when set and the task accepts it. The runner
then takes the first ``samples`` samples (``limit``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdeval.cluster.stub import STUB_PREFIX, StubWorkload
from kdeval.cluster.workload import CellResult, CellTask


def task_arguments(task: CellTask, allowed: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments for the cell's task, given the task's parameter names ``allowed``."""
    args = dict(task.task_params)
    if "lengths" in allowed and task.length is not None:
        args["lengths"] = [task.length]
    if "seed" in allowed:
        args["seed"] = task.seed
    if "num_samples" in allowed:
        args["num_samples"] = task.samples
    if "max_new_tokens" in allowed and task.max_new_tokens is not None:
        args["max_new_tokens"] = task.max_new_tokens
    return args


def build_task(task: CellTask) -> Any:
    """The evals task object of a cell."""
    from kdeval.evals.registry import get_spec

    spec = get_spec(task.task)
    return spec.build(**task_arguments(task, spec.params()))


@dataclass(frozen=True)
class EvalWorkload:
    """Runs cells for real. ``device`` None = CUDA when available, else CPU."""

    device: str | None = None

    def load(self, task: CellTask) -> Any:
        if task.model_id.startswith(STUB_PREFIX):
            return StubWorkload().load(task)
        from kdeval.keydiff.models import load_model

        return load_model(task.model_id, dtype=task.dtype, attn_implementation=task.attn_implementation,
                          revision=task.revision, device=self.device)

    def run(self, handle: Any, task: CellTask) -> CellResult:
        if task.model_id.startswith(STUB_PREFIX):
            return StubWorkload().run(handle, task)
        import kdeval.baselines  # noqa: F401 - importing it registers every policy with the engine
        from kdeval.evals import runner  # lazy: heavy imports only on workers that need them

        evals_task = build_task(task)
        rows = runner.run_task(handle, evals_task, policy=task.policy, policy_params=task.policy_params,
                               budget=task.budget, chunk_size=task.chunk_size, limit=task.samples,
                               engine=task.engine)
        summary = runner.aggregate(evals_task, rows)
        return CellResult(rows=rows, summary=summary, peak_memory_bytes=summary.get("max_peak_memory_bytes"))
