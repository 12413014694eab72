"""Synthetic stored results for the report tests: runs and cells written through the storage API."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kdeval.evals.task_run.budget import budget_share, budget_tokens
from kdeval.jobs.grid.cells import TaskRef
from kdeval.storage import AttemptState, CellRecord, RunIndex, RunState, write_cell_rows


@dataclass
class FakeCell:
    """One cell to store: ``rows`` None with ``error`` = a failed cell; ``pending`` = never run."""

    policy: str
    budget: int | str | None  # N, a share of the prompt ("25%"), None for full
    task: str = "needle"
    length: int | None = 1024
    seed: int = 0
    chunk: int = 64
    model: str = "m"
    rows: list[dict[str, Any]] | None = None
    error: str | None = None
    pending: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] | None = None   # recorded with the done cell (None: as older code did)
    identity: bool = True                      # rows carry run_id/cell_id (False: as older code wrote them)
    summary: dict[str, Any] | None = None      # the cell's summary in the index (default {"score": 0.0})
    protocol: dict[str, str] | None = None     # {"compress": "context"} ... (None: not in the spec, the default)
    conversation: dict[str, str] | None = None  # {"mode": "multi-request", ...} (None: a one-question task)

    @property
    def label(self) -> str:
        """The label the index stores for this cell's task (data version and sample count do not enter it)."""
        return TaskRef(name=self.task, data_version="1", length=self.length, samples=1, seed=self.seed).label

    def spec(self, version: str) -> dict[str, Any]:
        spec = {"model": {"id": self.model}, "policy": self.policy, "policy_params": self.params,
                "budget": self.budget, "chunk_size": self.chunk,
                "task": {"name": self.task, "length": self.length, "seed": self.seed}, "kdeval_version": version}
        spec = spec if self.protocol is None else {**spec, "protocol": self.protocol}
        return spec if self.conversation is None else {**spec, "conversation": self.conversation}

    def cell_id(self, version: str) -> str:
        canon = json.dumps(self.spec(version), sort_keys=True)
        return hashlib.sha256(canon.encode()).hexdigest()[:24]


def rows(scores: list[float], *, prefix: str = "s", task: str = "needle", length: int | None = 1024,
         depths: list[float] | None = None, extra: Callable[[int], dict[str, Any]] | None = None,
         ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Per-sample rows with the given scores (ids ``s0, s1, ...`` unless given)."""
    out = []
    for i, score in enumerate(scores):
        row = {"task": task, "id": ids[i] if ids else f"{prefix}{i}", "prompt_hash": f"{i:016x}",
               "prompt_tokens": length or 100, "truncated": False, "prediction": "p", "references": ["r"],
               "score": float(score), "ttft_s": 0.5, "timing_batch": i, "decode_s": 2.0, "generated_tokens": 10,
               "peak_memory_bytes": 1000, "memory_kind": "process_rss", "peak_kv_tokens": 256,
               "peak_kv_bytes": 256 * 1024, "kept_tokens": 256,
               "length": length, "depth": depths[i % len(depths)] if depths else None, "meta_json": "{}"}
        if extra:
            row.update(extra(i))
        out.append(row)
    return out


def record_done(idx: RunIndex, run_id: str, cell_id: str, results: str | Path, cell_rows: list[dict[str, Any]],
                *, provenance: dict[str, Any] | None = None, identity: bool = True,
                summary: dict[str, Any] | None = None) -> None:
    """One successful attempt at a cell: its Parquet file written (rows naming their run and cell unless
    ``identity`` is False), then the cell marked done with ``provenance``."""
    att = idx.start_attempt(run_id, cell_id, "w0", "node0")
    stored = [{"run_id": run_id, "cell_id": cell_id, **r} for r in cell_rows] if identity else cell_rows
    rel = write_cell_rows(results, cell_id, stored)
    idx.finish_attempt_done(att, results_dir=str(results), result_path=rel, n_rows=len(cell_rows),
                            summary=summary or {"score": 0.0}, duration_s=1.0, peak_memory_bytes=1000,
                            worker="w0", node="node0", provenance=provenance)


def provenance(device: str = "cpu", source_hash: str = "abc123", **over: Any) -> dict[str, Any]:
    """A cell's provenance as the worker records it."""
    return {"kdeval_version": f"0.1.0+{source_hash}", "source_hash": source_hash, "torch": "2.13.0",
            "transformers": "4.57.0", "cuda": None, "device": device, "dtype": "float32",
            "attn_implementation": "sdpa", "host": "node0", **over}


def store_run(idx: RunIndex, results: Path, run_id: str, cells: list[FakeCell], *, version: str = "v1",
              grid_hash: str = "grid-hash", name: str = "grid", state: RunState = RunState.DONE) -> str:
    """Record a run with ``cells`` (done/failed/pending as described) and write their Parquet files."""
    records = [CellRecord(id=c.cell_id(version), spec=c.spec(version), model=c.model, policy=c.policy,
                          budget=budget_tokens(c.budget), chunk_size=c.chunk, task=c.label,
                          budget_share=budget_share(c.budget)) for c in cells]
    idx.create_run(run_id, name=name, grid_yaml="name: grid\n", grid_hash=grid_hash, results_dir=str(results),
                   kdeval_version=version, cells=records)
    for c, rec in zip(cells, records):
        if c.pending or idx.get_cell(rec.id).state == "done":
            continue
        if c.rows is None:
            att = idx.start_attempt(run_id, rec.id, "w0", "node0")
            idx.finish_attempt_failed(att, state=AttemptState.FAILED, error=c.error or "boom", final=True)
        else:
            record_done(idx, run_id, rec.id, results, c.rows, provenance=c.provenance, identity=c.identity,
                        summary=c.summary)
    idx.set_run_state(run_id, state)
    return run_id
