"""The contract between the scheduler and a worker: what a cell asks for and what it returns.

A *workload* is a picklable object with three methods, ``load(task) -> handle`` (load the model a cell
needs), ``run(handle, task) -> CellResult`` (run the task's shard of the cell: samples
``[sample_start, sample_stop)`` of its first ``samples``) and ``aggregate(task, rows) -> summary`` (the
cell's headline numbers from all its stored rows; the driver calls it once every shard is done). The worker
actor calls ``load`` only when the model changes, so a model is loaded once per (worker, model).
:class:`kdeval.cluster.execute.EvalWorkload` runs real evaluations; :class:`kdeval.cluster.stub.StubWorkload`
costs a known time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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
    chunk_size: int | str  # B tokens, or "whole" (one chunk of all that is compressed, kdeval.evals.chunking)
    task: str
    length: int | None
    samples: int
    seed: int
    task_params: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None  # the grid's generation.max_new_tokens (None: each sample's own length)
    batch_size: int | None = None  # samples through the engine at once (None: the worker's default)
    thinking: str = "keep"  # generation.thinking: "strip" scores what follows a reasoning model's thinking block
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig options (cuda_graphs, score_precision)
    compress: str = "prompt"  # protocol: "prompt" (paper) or "context" (kvpress)
    decode: str = "evict"  # protocol: "evict" or "keep" after the prompt
    shard: int = 0  # which shard of the cell this is (0 for a cell run whole)
    sample_start: int = 0  # first sample of the shard (index into the cell's samples)
    sample_stop: int | None = None  # one past its last sample (None: the cell's last)

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


@dataclass
class CellResult:
    """What a workload's ``run`` returns: flat per-sample rows and the cell's headline numbers."""

    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    peak_memory_bytes: int | None = None


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

    def aggregate(self, task: CellTask, rows: list[dict[str, Any]]) -> dict[str, Any]: ...
