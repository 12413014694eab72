"""The worker actor: holds one loaded model and runs cells (or sample shards of them) with it, one at a time,
or one shard of a group of cells that share work (``run_group``).

A worker never touches the index: it returns a :class:`CellOutcome` (rows and, for a done cell, the
result's provenance included) to the driver. A group streams: each cell's outcome is kept as soon as the workload
says that cell is finished (``on_result``), and the driver takes the outcomes kept so far while the group runs
(:meth:`CellWorker.group_news`), so it stores them before the group returns; the group's return still holds every
outcome (the driver skips those it stored).
Errors raised by the cell's own code (including out-of-memory) come back as ``ok=False`` with the
traceback; only the death of the process or node surfaces as a Ray error.
"""
from __future__ import annotations

import dataclasses
import gc
import sys
import time
import traceback
from typing import Any

import ray

from kdeval.cluster.provenance import collect_provenance
from kdeval.cluster.workload import CellOutcome, CellResult, CellTask, WorkerInfo, Workload, check_group


def _is_oom(exc: BaseException) -> bool:
    name = type(exc).__name__
    return "OutOfMemory" in name or "out of memory" in str(exc).lower()


def _free_accelerator_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")  # only when the workload imported it
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class CellWorker:
    """Plain class wrapped by :func:`worker_actor_class`; testable without Ray."""

    def __init__(self, workload: Workload, name: str) -> None:
        self.workload = workload
        self.name = name
        self.loaded_key: str | None = None
        self.handle: Any = None
        self.model_loads = 0
        self.group_samples: list[int] = []  # samples each cell of the running group has finished
        self.group_tasks: list[CellTask] = []  # the running (or last) group's tasks
        self.group_finished: dict[int, CellOutcome] = {}  # task index -> outcome, finished, not taken yet
        self.node_id = "local"
        if ray.is_initialized():  # asking outside Ray would start one (cluster mode, token auth) by itself
            try:
                self.node_id = ray.get_runtime_context().get_node_id() or "local"
            except Exception:  # noqa: BLE001 - a driver, not an actor
                pass

    def info(self) -> WorkerInfo:
        """Identity (also the 'ready' probe the scheduler waits on)."""
        return WorkerInfo(name=self.name, node_id=self.node_id)

    def _ensure_model(self, task: CellTask) -> None:
        if self.loaded_key == task.model_key:
            return
        self.handle, self.loaded_key = None, None
        _free_accelerator_memory()
        self.handle = self.workload.load(task)
        # Warm-up: one short forward before anything is timed, so the first cell on a fresh worker (always
        # `full`, by expansion order) does not pay for kernel selection and allocator growth in its TTFT.
        model = getattr(self.handle, "model", None)  # a LoadedModel; stub handles have none
        torch = sys.modules.get("torch")  # imported by the workload that loaded a real model
        if torch is not None and isinstance(model, torch.nn.Module):
            device = next(model.parameters()).device
            with torch.inference_mode():
                model(input_ids=torch.zeros(1, 8, dtype=torch.long, device=device), use_cache=False)
        self.loaded_key = task.model_key
        self.model_loads += 1

    def run_cell(self, task: CellTask) -> CellOutcome:
        """Run one cell's shard (``task.shard_slice`` of its samples); never raises for the cell's own errors."""
        t0 = time.perf_counter()
        try:
            self._ensure_model(task)
            result = self.workload.run(self.handle, task)
        except Exception as exc:  # noqa: BLE001 - every cell error is reported, not raised
            return self._failed(task, exc, time.perf_counter() - t0)
        return self._done(task, result, time.perf_counter() - t0)

    def run_group(self, tasks: list[CellTask]) -> list[CellOutcome]:
        """Run the same shard of several cells that can share (``Workload.run_group``), the model loaded once;
        one outcome per task, in order. Each done cell's ``duration_s`` is the seconds of its own runs in the
        group (the model's load is in none of them). An error raised by the group (the workload computes the
        cells together, so one cell's error is the group's) fails every cell of it with that error and
        ``group_error`` set (each then runs alone, which tells whose it was); an error checking the group or
        loading the model is every member's own (alone, each would meet it again), so it is not a group error;
        never raises for the cells' own errors."""
        t0 = time.perf_counter()
        self.group_samples, self.group_tasks, self.group_finished = [0] * len(tasks), list(tasks), {}
        try:
            check_group(tasks)
        except Exception as exc:  # noqa: BLE001 - the group's own: each member can run alone
            return self._group_failed(tasks, exc, time.perf_counter() - t0)
        try:
            self._ensure_model(tasks[0])
        except Exception as exc:  # noqa: BLE001 - the model every member shares: each alone would fail the same way
            took = time.perf_counter() - t0
            return [self._failed(t, exc, took / max(len(tasks), 1)) for t in tasks]
        try:
            results = self.workload.run_group(self.handle, tasks, self._finished_samples, self._finished_result)
            if len(results) != len(tasks):
                raise RuntimeError(f"run_group: {len(results)} results for {len(tasks)} cells")
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return self._group_failed(tasks, exc, time.perf_counter() - t0)
        took = time.perf_counter() - t0
        return [self._done(t, r, r.seconds if r.seconds is not None else took / len(tasks))
                for t, r in zip(tasks, results)]

    def _group_failed(self, tasks: list[CellTask], exc: BaseException, took: float) -> list[CellOutcome]:
        """Every member failed by the group's error (``group_error``: each runs alone next)."""
        return [dataclasses.replace(self._failed(t, exc, took / max(len(tasks), 1)), group_error=True) for t in tasks]

    def _finished_samples(self, i: int, n: int) -> None:
        self.group_samples[i] += n

    def _finished_result(self, i: int, result: CellResult) -> None:
        """Task ``i`` of the running group is finished: keep its outcome for :meth:`group_news`."""
        seconds = result.seconds if result.seconds is not None else 0.0
        self.group_finished[i] = self._done(self.group_tasks[i], result, seconds)

    @ray.method(concurrency_group="probe")
    def samples_done_in_group(self) -> list[int]:
        """How many samples each cell of the running (or last) group has finished, in the group's task order:
        what the driver shows while a group runs. Answered on its own thread, beside the group."""
        return list(self.group_samples)

    @ray.method(concurrency_group="probe")
    def group_news(self) -> tuple[list[int], dict[int, CellOutcome]]:
        """What the running (or last) group has done since last asked: the samples each of its cells has
        finished (:meth:`samples_done_in_group`) and the outcomes of the cells finished since (task index ->
        outcome; each handed out once), for the driver to store while the group goes on. Answered on its own
        thread, beside the group."""
        news = {}
        for i in list(self.group_finished):
            news[i] = self.group_finished.pop(i)
        return list(self.group_samples), news

    def _failed(self, task: CellTask, exc: BaseException, seconds: float) -> CellOutcome:
        oom = _is_oom(exc)
        if oom:
            _free_accelerator_memory()
        return CellOutcome(
            cell_id=task.cell_id, ok=False, worker=self.name, node=self.node_id, duration_s=seconds,
            model_loads=self.model_loads, error="".join(traceback.format_exception(exc, limit=8)).strip(),
            out_of_memory=oom,
        )

    def _done(self, task: CellTask, result: CellResult, seconds: float) -> CellOutcome:
        return CellOutcome(
            cell_id=task.cell_id, ok=True, worker=self.name, node=self.node_id, duration_s=seconds,
            model_loads=self.model_loads, rows=result.rows, summary=result.summary,
            peak_memory_bytes=result.peak_memory_bytes, provenance=collect_provenance(task, self.handle),
        )


_ACTOR_CLASS = None


def worker_actor_class():
    """``CellWorker`` as a Ray actor class (created once, on first use)."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        # cells run one at a time on the default group; the progress probe has a thread of its own
        _ACTOR_CLASS = ray.remote(concurrency_groups={"probe": 1})(CellWorker)
    return _ACTOR_CLASS
