"""The real workload: load a model with the engine, run one task through the evals runner.

This is the only module where the cluster layer touches the engine and the evaluations; the
scheduler only sees :class:`~kdeval.cluster.workload.Workload`. Model ids ``stub:<s>`` are delegated to
:class:`~kdeval.cluster.stub.StubWorkload` (no torch needed).

How a cell becomes a task: the grid's task ``params`` are passed to the task's constructor, plus
``lengths=[cell length]``, ``seed`` and ``num_samples`` when the task has those parameters, and
``max_new_tokens`` from the grid's generation settings when set and the task accepts it. The cell's prompts
are those of the task's first ``samples`` samples (``limit``); a task runs its shard of them, samples
``[sample_start, sample_stop)`` (:func:`shard_prompts`), generating ``max_new_tokens`` tokens per sample when
the grid sets it (every task, whether its constructor takes the setting or not) under the cell's protocol.

Shards and shared contexts: the runner compresses a context once for consecutive samples that share it
(``context_shared`` rows). A shard boundary may split such a group; each side then compresses the context
itself. Results do not change (every question still gets the same compressed context: sharing only saves
computing it again), only the rows' ``context_shared`` / ``shared_prefill_s`` and the time spent
(``tests/jobs/run/test_real_shards.py``). The cell's summary is computed by the driver from all its stored
rows (:meth:`EvalWorkload.aggregate`).

Groups: :meth:`EvalWorkload.run_group` runs the same consecutive shards of several cells that can share (the same
task instance on the same model) through ``group_run.run_group``, which computes what the cells compute alike
once; each cell's rows are those it gets alone, timings aside (``tests/jobs/run/test_real_groups.py``), and each
(cell, shard) is handed over as soon as its rows are all in (:mod:`kdeval.cluster.group_streams`).
"""
from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from kdeval.cluster.group_streams import GroupStreams, shard_result
from kdeval.cluster.stub import STUB_PREFIX, StubWorkload
from kdeval.cluster.workload import CellResult, CellTask, group_span, shared_rows

if TYPE_CHECKING:
    from kdeval.evals.task_run.settings import RunSettings

#: Task constructor parameters a cell sets from the grid's own fields (named here for messages), never
#: from ``tasks[i].params``; see :func:`task_arguments`.
GRID_OWNED_TASK_PARAMS = {"lengths": "tasks[i].lengths", "seed": "tasks[i].seeds",
                          "num_samples": "tasks[i].samples", "max_new_tokens": "generation.max_new_tokens"}


def task_arguments(params: dict[str, Any], allowed: dict[str, Any], *, length: int | None, seed: int,
                   samples: int, max_new_tokens: int | None) -> dict[str, Any]:
    """Constructor arguments for a cell's task: its grid ``params`` plus the grid-owned settings the task
    takes (``allowed``: the task's parameter names)."""
    owned = {"lengths": None if length is None else [length], "seed": seed,
             "num_samples": samples, "max_new_tokens": max_new_tokens}
    args = dict(params)
    for name in GRID_OWNED_TASK_PARAMS:
        if name in allowed and owned[name] is not None:
            args[name] = owned[name]
    return args


def build_eval_task(name: str, params: dict[str, Any], *, length: int | None, seed: int, samples: int,
                    max_new_tokens: int | None) -> Any:
    """The evals task object of a cell (also built by the driver for cell identity)."""
    from kdeval.evals import get_spec

    spec = get_spec(name)
    return spec.build(**task_arguments(params, spec.params(), length=length, seed=seed, samples=samples,
                                       max_new_tokens=max_new_tokens))


def build_task(task: CellTask) -> Any:
    """The evals task object of a cell."""
    return build_eval_task(task.task, task.task_params, length=task.length, seed=task.seed, samples=task.samples,
                           max_new_tokens=task.max_new_tokens)


def prompt_key(task: CellTask) -> str:
    """What a cell's task object and prompts depend on: the model (tokenizer, context size) and the task
    instance, with its sample count (the runner's ``limit``); not the policy, budget, chunk size or engine."""
    return json.dumps([task.model_key, task.task, task.length, task.seed, task.samples, task.task_params,
                       task.max_new_tokens], sort_keys=True, default=repr)  # not the protocol: prompts are the same


#: The last few (task object, prompts) built in this worker process, by :func:`prompt_key`: cells of one task
#: instance come one after another (the grid expands model, chunk, task, then policy and budget), so they
#: tokenize the task once. Entries hold token ids, not the model.
_PROMPTS: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
_PROMPTS_KEPT = 2


def task_and_prompts(lm: Any, task: CellTask) -> tuple[Any, Any]:
    """The cell's evals task and ``runner.model_prompts`` for it on ``lm`` (reused from a recent cell)."""
    from kdeval.evals.task_run import runner

    def make() -> tuple[Any, Any]:
        evals_task = build_task(task)
        return evals_task, runner.model_prompts(lm, evals_task, limit=task.samples, max_new_tokens=task.max_new_tokens)

    return _recent(_PROMPTS, prompt_key(task), make, _PROMPTS_KEPT)


def _recent(cache: OrderedDict, key: str, make: Callable[[], Any], keep: int) -> Any:
    """``cache[key]``, made with ``make()`` when missing; the ``keep`` most recently used entries are kept."""
    hit = cache.pop(key, None)
    if hit is None:
        hit = make()
    cache[key] = hit
    while len(cache) > keep:
        cache.popitem(last=False)
    return hit


def shard_prompts(prompts: tuple[Any, Any], task: CellTask) -> tuple[list[Any], list[Any]]:
    """The task's shard of a cell's ``(samples, built prompts)`` (``runner.model_prompts`` of its first
    ``samples`` samples): the slice ``[sample_start, sample_stop)`` of both lists (shorter, or empty, when
    the task has fewer samples than the grid asked for)."""
    samples, built = prompts
    part = task.shard_slice
    return list(samples[part]), list(built[part])


#: Evals task objects the driver built to aggregate cells (:meth:`EvalWorkload.aggregate`), by prompt key.
_TASKS: OrderedDict[str, Any] = OrderedDict()
_TASKS_KEPT = 4


#: ``generation.batch_size`` when the grid leaves it unset: batches pay on a CPU (bench/throughput.py: 2.16x
#: samples/s at batch 8 on a decode-heavy task, 1.19x on a prefill-heavy one, never slower than batch 1), while on
#: CUDA batch 1 runs on captured graphs and batches do not, untimed on a GPU so far: 1 there.
CPU_BATCH_SIZE = 8


def default_batch_size(lm: Any, task: CellTask) -> int:
    """The batch size a cell runs at when its grid sets none: :data:`CPU_BATCH_SIZE` for an SDPA model on a
    CPU (batches need the engine's masked SDPA attention), else 1."""
    device = next(lm.model.parameters()).device
    return CPU_BATCH_SIZE if device.type == "cpu" and task.attn_implementation == "sdpa" else 1


def run_settings(lm: Any, task: CellTask, *, grouped: bool) -> RunSettings:
    """The cell's ``RunSettings`` for ``runner.run_task`` (also a member of
    ``group_run.run_group``). ``grouped``: the cell runs in a group, where a ``batch_size`` the grid left unset stays
    ``None`` for ``group_run.run_group`` to choose (a chunked cell forks then batches at
    :func:`default_batch_size`, a one-shot cell shares its whole steps at batch 1); a cell whose grid sets a batch
    size keeps it."""
    if task.batch_size is not None or grouped:
        batch = task.batch_size
    else:
        batch = default_batch_size(lm, task)
    from kdeval.evals.task_run.settings import RunSettings

    return RunSettings(policy=task.policy, policy_params=task.policy_params, budget=task.budget,
                       chunk_size=task.chunk_size, engine=task.engine, max_new_tokens=task.max_new_tokens,
                       compress=task.compress, decode=task.decode, thinking=task.thinking, batch_size=batch,
                       conversation=task.conversation)


@dataclass(frozen=True)
class EvalWorkload:
    """Runs cells for real. ``device`` None = CUDA when available, else CPU."""

    device: str | None = None

    def load(self, task: CellTask) -> Any:
        if task.model_id.startswith(STUB_PREFIX):
            return StubWorkload().load(task)
        from kdeval.zoo.loading import load_model

        return load_model(task.model_id, dtype=task.dtype, attn_implementation=task.attn_implementation,
                          revision=task.revision, device=self.device)

    def run(self, handle: Any, task: CellTask) -> CellResult:
        if task.model_id.startswith(STUB_PREFIX):
            return StubWorkload().run(handle, task)
        import kdeval.baselines  # noqa: F401 - importing it registers every policy with the engine
        from kdeval.evals.task_run import runner  # lazy: heavy imports only on workers that need them

        evals_task, prompts = task_and_prompts(handle, task)
        prompts = shard_prompts(prompts, task)
        if not prompts[0]:  # a shard past the task's last sample (it has fewer than the grid asked for)
            return CellResult(rows=[], summary={}, peak_memory_bytes=None)
        rows = runner.run_task(handle, evals_task, run_settings(handle, task, grouped=False), prompts=prompts)
        return shard_result(rows)

    def run_group(self, handle: Any, tasks: list[CellTask], on_samples: Callable[[int, int], None] | None = None,
                  on_result: Callable[[int, CellResult], None] | None = None) -> list[CellResult]:
        """The same consecutive shards of several cells that can share (:func:`kdeval.cluster.workload.group_span`)
        through one ``group_run.run_group`` over their samples: one result per task, in order, each with the
        seconds of that cell's own runs on it, handed to ``on_result`` as soon as its rows are all in
        (:class:`GroupStreams`). A group starting at the cells' first sample times its first context group of
        each cell alone (``time_first``), unless the tasks say not to (``CellTask.time_first``: accuracy only). An error raised by the group fails all of its cells not yet handed
        over (the driver then runs them alone)."""
        if tasks and tasks[0].model_id.startswith(STUB_PREFIX):
            return StubWorkload().run_group(handle, tasks, on_samples, on_result)
        cells, span = group_span(tasks)
        import kdeval.baselines  # noqa: F401 - importing it registers every policy with the engine
        from kdeval.evals.task_run import group_run

        first = tasks[0]
        whole = dataclasses.replace(first, sample_start=span[0][0], sample_stop=span[-1][1])
        evals_task, prompts = task_and_prompts(handle, first)
        prompts = shard_prompts(prompts, whole)
        if not prompts[0]:
            return [CellResult(rows=[], summary={}, peak_memory_bytes=None, seconds=0.0) for _ in tasks]
        by_cell = {t.cell_id: t for t in reversed(tasks)}  # each cell's first task
        members = [run_settings(handle, by_cell[c], grouped=True) for c in cells]
        streams = GroupStreams(tasks, cells, [s.id for s in prompts[0]], span[0][0], on_samples, on_result)
        timed = span[0][0] == 0 and first.time_first  # the cells' first samples, unless the grid says no timing
        group_run.run_group(handle, evals_task, members, prompts, share=True, time_first=timed,
                            batch_size=default_batch_size(handle, first), on_rows=streams.add)
        return streams.results()

    def aggregate(self, task: CellTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The cell's summary from all its rows: ``runner.aggregate`` with the cell's evals task (built here,
        on the driver; the stub's own for ``stub:`` models), and how many rows were computed in a group
        (:func:`kdeval.cluster.workload.shared_rows`)."""
        if task.model_id.startswith(STUB_PREFIX):
            return StubWorkload().aggregate(task, rows)
        from kdeval.evals.task_run import runner

        evals_task = _recent(_TASKS, prompt_key(task), lambda: build_task(task), _TASKS_KEPT)
        return {**runner.aggregate(evals_task, rows), **shared_rows(rows)}
