"""Cells: a grid expanded into model × policy × budget × chunk × task runs, with content-hash ids.

A cell's id is the sha256 of the canonical JSON of everything that changes its result — model (id,
revision, dtype, attention implementation), policy and params, budget, chunk size, task (name, data
version, length, sample count, seed, params), generation settings, engine options, and the kdeval
version — and nothing else (not the grid name, resources or retry limits). ``full`` keeps every token, so its
cells carry ``budget=None`` and the default engine options (which only matter to evicting policies), and one
cell serves every budget and engine setting.
"""
from __future__ import annotations

import hashlib
import json
from itertools import product
from typing import Any

from pydantic import BaseModel, ConfigDict

from kdeval.cluster.workload import CellTask, model_key
from kdeval.jobs.grid import BUDGET_FREE_POLICIES, EngineSpec, GenerationSpec, GridSpec, ModelSpec
from kdeval.jobs.registries import task_data_version
from kdeval.version import code_version
from kdeval.storage import CellRecord


def policy_label(name: str, params: dict[str, Any]) -> str:
    """``name``, or ``name(k=v,...)`` with the parameters in key order (cell descriptions, report rows)."""
    return f"{name}(" + ",".join(f"{k}={params[k]}" for k in sorted(params)) + ")" if params else name


def _content_hash(model: BaseModel) -> str:
    """sha256 (hex) of a model's canonical JSON: every field, keys sorted, no whitespace."""
    canon = json.dumps(model.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


class TaskRef(BaseModel):
    """One task instance of a cell: ``length`` is None for tasks with natural lengths."""

    model_config = ConfigDict(frozen=True)

    name: str
    data_version: str
    length: int | None
    samples: int
    seed: int
    params: dict[str, Any] = {}

    @property
    def label(self) -> str:
        """Short readable label, e.g. ``needle@1024#s0``."""
        length = f"@{self.length}" if self.length is not None else ""
        return f"{self.name}{length}#s{self.seed}"


class CellSpec(BaseModel):
    """Everything a worker needs to run one cell (JSON-able; this is what is hashed into the id)."""

    model_config = ConfigDict(frozen=True)

    model: ModelSpec
    policy: str
    policy_params: dict[str, Any] = {}
    budget: int | None
    chunk_size: int
    task: TaskRef
    generation: GenerationSpec
    engine: EngineSpec = EngineSpec()
    kdeval_version: str

    @property
    def id(self) -> str:
        """Content hash (24 hex digits) of the spec."""
        return _content_hash(self)[:24]

    @property
    def model_key(self) -> str:
        """What a worker must have loaded to run this cell (same key = no reload; = ``to_task().model_key``)."""
        m = self.model
        return model_key(m.id, m.revision, m.dtype, m.attn_implementation)

    def to_task(self) -> CellTask:
        """The worker-side description of this cell."""
        m, t = self.model, self.task
        return CellTask(
            cell_id=self.id, model_id=m.id, dtype=m.dtype, attn_implementation=m.attn_implementation,
            revision=m.revision, policy=self.policy, policy_params=dict(self.policy_params),
            budget=self.budget, chunk_size=self.chunk_size, task=t.name, length=t.length,
            samples=t.samples, seed=t.seed, task_params=dict(t.params),
            max_new_tokens=self.generation.max_new_tokens, temperature=self.generation.temperature,
            engine=self.engine.options(),
        )

    def record(self) -> CellRecord:
        """The row the index stores for this cell."""
        return CellRecord(id=self.id, spec=self.model_dump(mode="json"), model=self.model.id,
                          policy=self.policy, budget=self.budget, chunk_size=self.chunk_size,
                          task=self.task.label)

    def describe(self) -> str:
        """One line for dry runs and logs."""
        budget = "-" if self.budget is None else str(self.budget)
        pol = policy_label(self.policy, self.policy_params)
        engine = "".join(f" {k}={v}" for k, v in self.engine.options().items())
        return f"{self.model.id} {pol} N={budget} B={self.chunk_size} {self.task.label} n={self.task.samples}{engine}"


def kdeval_version() -> str:
    """The running code's version, release + source hash (part of every cell id; see ``kdeval.version``)."""
    return code_version()


def expand(grid: GridSpec, version: str | None = None) -> list[CellSpec]:
    """All distinct cells of a grid, in a stable order (model, chunk, task, policy, budget)."""
    version = version or kdeval_version()
    cells: dict[str, CellSpec] = {}
    for model, chunk, task in product(grid.models, grid.chunk_sizes, grid.tasks):
        dv = task_data_version(task.name)
        for length, seed in product(task.lengths or [None], task.seeds):
            ref = TaskRef(name=task.name, data_version=dv, length=length,
                          samples=task.samples, seed=seed, params=dict(task.params))
            for pol in grid.policies:
                free = pol.name in BUDGET_FREE_POLICIES  # never evicts: no budget, no engine options
                for budget in [None] if free else grid.budgets:
                    cell = CellSpec(model=model, policy=pol.name, policy_params=dict(pol.params),
                                    budget=budget, chunk_size=chunk, task=ref, generation=grid.generation,
                                    engine=EngineSpec() if free else grid.engine, kdeval_version=version)
                    cells.setdefault(cell.id, cell)
    return list(cells.values())


def grid_hash(grid: GridSpec) -> str:
    """Hash of the validated grid (all fields), to recognise resubmissions."""
    return _content_hash(grid)
