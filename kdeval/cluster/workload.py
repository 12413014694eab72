"""The contract between the scheduler and a worker: what a cell asks for and what it returns.

A *workload* is a picklable object with four methods, ``load(task) -> handle`` (load the model a cell
needs), ``run(handle, task) -> CellResult`` (run the task's shard of the cell: samples
``[sample_start, sample_stop)`` of its first ``samples``), ``run_group(handle, tasks, on_samples, on_result) ->
[CellResult]`` (the same consecutive shards of several cells that can share, :func:`check_group`: same model, task
instance and generation length, any policy, budget, chunk size, engine options and protocol; one result per task,
in order, each with the seconds spent on that cell's own runs; raising fails the whole group; ``on_samples(i,
n)``, when given, is called as task ``i`` finishes ``n`` more samples, and ``on_result(i, result)`` as soon as
task ``i`` is finished, with the result it will return for it, so the driver can store it while the group goes on) and ``aggregate(task, rows) -> summary`` (the
cell's headline numbers from all its stored rows; the driver calls it once every shard is done). The worker
actor calls ``load`` only when the model changes, so a model is loaded once per (worker, model).
:class:`kdeval.cluster.execute.EvalWorkload` runs real evaluations; :class:`kdeval.cluster.stub.StubWorkload`
costs a known time.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


def model_key(model_id: str, revision: str | None, dtype: str, attn_implementation: str) -> str:
    """What a worker must have loaded to run a cell: cells with the same key share a loaded model."""
    return f"{model_id}|{revision}|{dtype}|{attn_implementation}"


@dataclass(frozen=True)
class CellTask:
    """One cell, or one sample shard of it, as the worker sees it (built by ``kdeval.jobs`` from a cell spec).

    The worker takes the cell's first ``samples`` samples, then runs those in ``[sample_start, sample_stop)``
    (``sample_stop`` None: to the end); ``shard`` numbers that slice within the cell."""

    cell_id: str
    model_id: str
    dtype: str
    attn_implementation: str
    revision: str | None
    policy: str
    policy_params: dict[str, Any]
    budget: int | str | None  # N tokens, a share of each prompt ("25%", resolved per sample), None: no eviction
    chunk_size: int | str  # B tokens, or "whole" (one chunk of all that is compressed, kdeval.evals.task_run.chunking)
    task: str
    length: int | None
    samples: int
    seed: int
    task_params: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None  # the grid's generation.max_new_tokens (None: each sample's own length)
    batch_size: int | None = None  # samples through the engine at once (None: the worker's default)
    thinking: str = "keep"  # generation.thinking: "strip" scores what follows a reasoning model's thinking block
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig options (cuda_graphs, score_precision)
    compress: str = "prompt"  # protocol: "prompt" (paper), "context" (kvpress) or "generated" (prompt kept)
    decode: str = "evict"  # protocol: "evict" or "keep" after the prompt
    conversation: dict[str, Any] | None = None  # {mode, answers} of a multi-question task (kdeval.evals.task_run.settings.Conversation)
    shard: int = 0  # which shard of the cell this is (0 for a cell run whole)
    sample_start: int = 0  # first sample of the shard (index into the cell's samples)
    sample_stop: int | None = None  # one past its last sample (None: the cell's last)
    time_first: bool = True  # in a group, the cell's first context group runs alone, timed (False: shared too)

    def __post_init__(self) -> None:
        stop = self.samples if self.sample_stop is None else self.sample_stop
        if not 0 <= self.sample_start <= stop <= self.samples:
            raise ValueError(f"sample_start/sample_stop: expected 0 <= {self.sample_start} <= {stop} <= "
                             f"samples={self.samples}")

    @property
    def shard_slice(self) -> slice:
        """The shard's samples as a slice of the cell's samples."""
        return slice(self.sample_start, self.samples if self.sample_stop is None else self.sample_stop)

    @property
    def model_key(self) -> str:
        """See :func:`model_key`."""
        return model_key(self.model_id, self.revision, self.dtype, self.attn_implementation)


def group_key(task: CellTask) -> str:
    """What the tasks of one group (``Workload.run_group``) have alike: the loaded model, the task instance
    (name, length, seed, samples, parameters) and the generation length. Policy, budget, chunk size, engine
    options, protocol, thinking and batch size may differ; the sample ranges are :func:`check_group`'s."""
    return json.dumps([task.model_key, task.task, task.length, task.seed, task.samples, task.task_params,
                       task.max_new_tokens], sort_keys=True, default=repr)


def task_range(task: CellTask) -> tuple[int, int]:
    """The task's samples ``(start, stop)``."""
    return task.sample_start, task.shard_slice.stop


def group_span(tasks: list[CellTask]) -> tuple[list[str], list[tuple[int, int]]]:
    """The cells of a group (ids, in order of first task) and the sample ranges each of them runs (in order):
    a group is every cell on the same consecutive shards, so it runs the samples from the first range's start to
    the last one's stop once for all of them. Raises ``ValueError`` for any other list of tasks."""
    if not tasks:
        raise ValueError("run_group: expected at least one task")
    odd = [t.cell_id for t in tasks if group_key(t) != group_key(tasks[0])]
    if odd:
        raise ValueError(f"run_group: cell {odd[0]} cannot share with cell {tasks[0].cell_id} (another model, "
                         f"task instance or generation length)")
    ranges: dict[str, list[tuple[int, int]]] = {}
    for t in tasks:
        ranges.setdefault(t.cell_id, []).append(task_range(t))
    cells = list(ranges)
    span = sorted(ranges[cells[0]])
    for cid in cells:
        if sorted(ranges[cid]) != span:
            raise ValueError(f"run_group: cell {cid} cannot share with cell {cells[0]}: another sample range")
    if any(a[1] != b[0] for a, b in zip(span, span[1:])) or len(set(span)) != len(span):
        raise ValueError(f"run_group: the sample ranges {span} are not consecutive shards")
    return cells, span


def check_group(tasks: list[CellTask]) -> None:
    """Raise ``ValueError`` unless ``tasks`` is a group: the same consecutive shards of cells that can share
    (:func:`group_span`)."""
    group_span(tasks)


def shared_rows(rows: list[dict[str, Any]]) -> dict[str, int]:
    """``{"shared_rows": k}``: how many of a cell's rows were computed in a group of cells (their ``execution``
    column says ``shared``), for the cell's summary; ``{}`` when no row has that column (rows of older runs)."""
    if not any("execution" in r for r in rows):
        return {}
    return {"shared_rows": sum(1 for r in rows if r.get("execution") == "shared")}


@dataclass
class CellResult:
    """What a workload's ``run`` returns: flat per-sample rows and the cell's headline numbers."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    peak_memory_bytes: int | None = None
    #: the seconds spent on this cell's own runs within a group (``run_group``); None: the whole call's time
    seconds: float | None = None


@dataclass
class CellOutcome:
    """What the worker actor returns for one cell's shard (never raises for the cell's own errors)."""

    cell_id: str
    ok: bool
    worker: str
    node: str
    duration_s: float
    model_loads: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    error: str | None = None
    out_of_memory: bool = False
    #: the error was raised by a group of cells (``run_group``), so it is every member's, not this cell's own
    group_error: bool = False
    #: how a done cell's result was computed (``kdeval.cluster.provenance.collect_provenance``); {} if failed
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerInfo:
    """Where a worker lives (also the 'ready' answer the scheduler waits on)."""

    name: str
    node_id: str


class Workload(Protocol):
    """See the module docstring."""

    def load(self, task: CellTask) -> Any: ...

    def run(self, handle: Any, task: CellTask) -> CellResult: ...

    def run_group(self, handle: Any, tasks: list[CellTask],
                  on_samples: Callable[[int, int], None] | None = None,
                  on_result: Callable[[int, "CellResult"], None] | None = None) -> list[CellResult]: ...

    def aggregate(self, task: CellTask, rows: list[dict[str, Any]]) -> dict[str, Any]: ...
