"""A model-free workload of known cost: scheduler tests, the scheduler benchmark, cluster smoke runs.

Grids reach it through model ids ``stub:<seconds per cell>``; tests construct it directly to inject
faults (a policy whose cells raise, or raise an out-of-memory error) or to give a cost per sample (a
large cell split in shards). Its rows depend only on the cell and the sample, never on the shard that
computed them, so a cell's rows are the same whatever its shard size; only their ``execution`` column says
whether the cell ran in a group (``run_group`` of several: ``shared``) or alone (``alone``), as real rows do.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Callable

from kdeval.cluster.workload import CellResult, CellTask, check_group, shared_rows
from kdeval.evals.task_run.budget import resolve_budget

STUB_PREFIX = "stub:"


def stub_seconds(model_id: str) -> float | None:
    """The seconds per cell of a ``stub:<s>`` model id; None for any other model id.

    Raises ``ValueError`` when the part after ``stub:`` is not a number.
    """
    if not model_id.startswith(STUB_PREFIX):
        return None
    return float(model_id[len(STUB_PREFIX):])


class StubOutOfMemoryError(RuntimeError):
    """Stands in for ``torch.OutOfMemoryError`` in fault-injection tests."""


@dataclass(frozen=True)
class StubModel:
    """What a stub 'load' returns."""

    key: str


@dataclass(frozen=True)
class StubWorkload:
    """Sleep ``cost_s`` per task (default: the number in ``stub:<s>``, else 0) plus ``cost_per_sample_s`` per
    sample of the task's shard, and emit one row per sample of the shard.

    ``fail_policies`` raise ``RuntimeError``; ``oom_policies`` raise :class:`StubOutOfMemoryError`;
    ``crash_policies`` kill the worker process (``os._exit``) — every time, or only on a cell's first
    attempt when ``crash_marker_dir`` is set (a marker file per cell remembers the crash);
    ``load_cost_s`` is paid per model load.
    """

    cost_s: float | None = None
    cost_per_sample_s: float = 0.0
    load_cost_s: float = 0.0
    fail_policies: tuple[str, ...] = ()
    oom_policies: tuple[str, ...] = ()
    crash_policies: tuple[str, ...] = ()
    crash_marker_dir: str | None = None
    peak_memory_bytes: int = 1 << 20

    def load(self, task: CellTask) -> StubModel:
        if self.load_cost_s:
            time.sleep(self.load_cost_s)
        return StubModel(key=task.model_key)

    def _cost(self, task: CellTask) -> float:
        if self.cost_s is not None:
            return self.cost_s
        seconds = stub_seconds(task.model_id)
        return 0.0 if seconds is None else seconds

    def _maybe_crash(self, task: CellTask) -> None:
        if self.crash_marker_dir is not None:
            marker = os.path.join(self.crash_marker_dir, f"crashed-{task.cell_id}")
            if os.path.exists(marker):
                return
            open(marker, "w").close()
        os._exit(1)

    def run_group(self, handle: StubModel, tasks: list[CellTask],
                  on_samples: Callable[[int, int], None] | None = None,
                  on_result: Callable[[int, CellResult], None] | None = None) -> list[CellResult]:
        """Each task through :meth:`run` in turn (the stub has nothing to share), each result with its own
        seconds and, in a group of several, its rows' ``execution`` set to ``shared``; a task that raises (or
        crashes) fails the whole group, as a real group's error does. ``on_samples(i, n)`` and ``on_result(i,
        result)`` as each task ends."""
        check_group(tasks)
        out = []
        for task in tasks:
            t0 = time.perf_counter()
            res = self.run(handle, task)
            res.seconds = time.perf_counter() - t0
            if len(tasks) > 1:
                res.rows = [{**r, "execution": "shared"} for r in res.rows]
            out.append(res)
            if on_samples is not None:
                on_samples(len(out) - 1, len(res.rows))
            if on_result is not None:
                on_result(len(out) - 1, res)
        return out

    def run(self, handle: StubModel, task: CellTask) -> CellResult:
        assert handle.key == task.model_key, "worker handed a cell of another model"
        if task.policy in self.fail_policies:
            raise RuntimeError(f"stub failure injected for policy '{task.policy}'")
        if task.policy in self.crash_policies:
            self._maybe_crash(task)
        if task.policy in self.oom_policies:
            raise StubOutOfMemoryError("CUDA out of memory (stub): tried to allocate 2.00 GiB")
        shard = range(task.samples)[task.shard_slice]
        time.sleep(self._cost(task) + self.cost_per_sample_s * len(shard))
        rows = []
        n = resolve_budget(task.budget, task.length or 0)  # the stub's prompts are ``length`` tokens
        for i in shard:
            sid = f"{task.task}/{task.length}/{task.seed}/{i}"
            h = int(hashlib.sha256(f"{task.cell_id}/{sid}".encode()).hexdigest()[:8], 16)
            rows.append({
                "id": sid, "prompt_hash": f"{h:016x}", "prompt_tokens": task.length or 0,
                "truncated": False, "prediction": f"answer-{h % 7}", "references": [f"answer-{i % 7}"],
                "score": float(h % 7 == i % 7), "ttft_s": 0.0, "decode_s": 0.0,
                "peak_memory_bytes": self.peak_memory_bytes, "peak_kv_tokens": n or 0,
                "kept_tokens": n or 0, "resolved_budget": n, "execution": "alone",
            })
        return CellResult(rows=rows, summary=self.aggregate(task, rows), peak_memory_bytes=self.peak_memory_bytes)

    def aggregate(self, task: CellTask, rows: list[dict]) -> dict:
        """Mean score (percent), row count and the rows computed in a group (``shared_rows``)."""
        score = 100.0 * sum(float(r["score"]) for r in rows) / max(len(rows), 1)
        return {"score": round(score, 2), "n": len(rows), **shared_rows(rows)}
