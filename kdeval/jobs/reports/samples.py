"""Reading a run's cells and their per-sample rows into typed, column-oriented sample tables.

A cell is placed by its :class:`Slot` (model, policy label, budget, chunk, task instance); the
sample key that pairs two cells is ``"<task instance>|<sample id>"`` (``"...|<sample id>|t<turn>"`` for a
turn of a conversation), so samples of different lengths or seeds never pair with each other. A cell of a
multi-request or own-answers conversation has its task instance marked (``turns.kv@2048#s0 [multi-request]``):
it pairs with the full cache's cell of the same conversation, never with another conversation's.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import total_ordering
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kdeval.evals.task_run.budget import Budget, budget_order
from kdeval.jobs.grid.cells import conversation_tag, policy_label, protocol_tag
from kdeval.jobs.reports.stats import Interval, paired_bootstrap
from kdeval.storage import CELL_ID_COLUMN, CellState, CellView, RunIndex, read_cell_table, verify_cell_file


#: (model, policy label, budget, chunk): one line of a plot or table.
Config = tuple[str, str, Budget, int]


def config_order(config: Config) -> tuple:
    """Sort key of a :data:`Config`: budgets by :func:`kdeval.evals.task_run.budget.budget_order` (no budget, then
    tokens, then shares of the prompt)."""
    model, policy, budget, chunk = config
    return (model, policy, budget_order(budget), chunk)


@total_ordering
@dataclass(frozen=True)
class Slot:
    """Where a cell sits in a grid, independent of run and code version (ordered by :func:`config_order`,
    then task)."""

    model: str
    policy: str          # policy label (name plus params)
    budget: Budget       # N, a share of the prompt ("25%"), None for budget-free policies (sorts first)
    chunk: int
    task: str            # task instance label: "needle@1024#s0"

    @property
    def config(self) -> Config:
        """(model, policy, budget, chunk): one line of a plot or table."""
        return (self.model, self.policy, self.budget, self.chunk)

    def __lt__(self, other: "Slot") -> bool:
        return (config_order(self.config), self.task) < (config_order(other.config), other.task)


def task_of_label(label: str) -> str:
    """The task name of a task instance label: ``needle`` from ``needle@1024#s0``."""
    return label.split("@")[0].split("#")[0]


def task_name(view: CellView) -> str:
    """Registry task name of a cell (from its label when the spec lacks it)."""
    task = (view.spec or {}).get("task") or {}
    if isinstance(task, dict) and task.get("name"):
        return str(task["name"])
    return task_of_label(view.task)


def slot_of(view: CellView) -> Slot:
    """The slot of a cell (the policy label carries a protocol other than the default: :func:`protocol_tag`; the
    task instance a conversation other than the default: :func:`conversation_tag`)."""
    return Slot(view.model, policy_label(view.policy, (view.spec or {}).get("policy_params") or {})
                + protocol_tag(view.spec, conversation=False), view.grid_budget, int(view.chunk_size),
                view.task + conversation_tag(view.spec))


def benchmark_of(task: str) -> str:
    """The benchmark a task belongs to (from the evals registry; the task name when unknown)."""
    from kdeval.evals import REGISTRY

    spec = REGISTRY.get(task.split(" [")[0])  # a conversation's tag, " [multi-request]", is not the task's name
    return spec.benchmark if spec is not None else task


@dataclass
class Samples:
    """Per-sample columns of one or more cells (same length arrays)."""

    key: np.ndarray        # "<task instance>|<sample id>" (str)
    task: np.ndarray       # registry task name (str)
    score: np.ndarray      # per-sample score in [0, 1] (float)
    length: np.ndarray     # target length (float, NaN when none)
    depth: np.ndarray      # needle depth (float, NaN when none)
    subset: np.ndarray     # "level 3" / "" (str)
    turn: np.ndarray       # turn of a conversation, 1-based (int; 0 for a one-question sample)
    prediction: np.ndarray  # the generated text (str)
    gold: np.ndarray       # the first reference answer (str)
    generated: np.ndarray  # generated tokens (float, NaN when not recorded)
    capped: np.ndarray     # the generation stopped at max_new_tokens: 1.0 / 0.0 (float, NaN: not recorded)

    def __len__(self) -> int:
        return int(self.key.size)

    def take(self, idx: np.ndarray) -> "Samples":
        """The samples at ``idx`` (indices or a boolean mask)."""
        return Samples(**{name: getattr(self, name)[idx] for name in self.__dataclass_fields__})

    @staticmethod
    def concat(parts: list["Samples"]) -> "Samples":
        """All samples of ``parts`` (an empty table for none)."""
        if not parts:
            kinds = (object, object, float, float, float, object, int, object, object, float, float)
            return Samples(*(np.array([], dtype=d) for d in kinds))
        return Samples(**{name: np.concatenate([getattr(p, name) for p in parts])
                          for name in Samples.__dataclass_fields__})


@dataclass(frozen=True)
class Paired:
    """Samples present on both sides: how many, how many on one side only, and the differences own − ref."""

    n: int
    dropped: int
    diffs: np.ndarray
    strata: np.ndarray     # the task of each pair
    own: np.ndarray        # indices of the pairs in ``own``
    ref: np.ndarray        # and in ``ref``


def pair_samples(own: Samples, ref: Samples) -> Paired:
    """Differences own − ref of the samples present on both sides (matched by key)."""
    ref_at = {k: i for i, k in enumerate(ref.key)}
    own_at = {k: i for i, k in enumerate(own.key)}
    common = sorted(set(own_at) & set(ref_at))
    dropped = len(set(own_at) ^ set(ref_at))
    oi = np.array([own_at[k] for k in common], dtype=int)
    ri = np.array([ref_at[k] for k in common], dtype=int)
    diffs = own.score[oi] - ref.score[ri] if common else np.array([], dtype=float)
    return Paired(len(common), dropped, diffs, own.task[oi] if common else np.array([], dtype=object), oi, ri)



@dataclass(frozen=True)
class PairedDelta:
    """``own − ref`` paired by sample: the pairs, the unpaired samples left out, the delta's interval in points
    (None without pairs) and the note on what was left out."""

    paired: Paired
    dropped: int
    ci: Interval | None
    note: str


def paired_delta(own: Samples, ref: Samples, stratified: bool, *, resamples: int, seed: int,
                 confidence: float) -> PairedDelta:
    """:func:`pair_samples`, then the paired bootstrap of the differences in points (by task when
    ``stratified``)."""
    paired = pair_samples(own, ref)
    # Unpaired samples are only "dropped" when both sides have some (a failed side pairs nothing).
    dropped = paired.dropped if len(own) and len(ref) else 0
    if paired.n == 0:
        return PairedDelta(paired, dropped, None, "")
    ci = paired_bootstrap(paired.diffs * 100, paired.strata if stratified else None, resamples=resamples, seed=seed,
                          confidence=confidence)
    return PairedDelta(paired, dropped, ci, f"{dropped} unpaired sample(s) left out" if dropped else "")

@dataclass
class LoadedCell:
    """A cell of a run: where it sits, its index view, and (when done) its samples and perf columns."""

    run: str
    slot: Slot
    view: CellView
    task: str                           # registry task name (with a conversation's tag: conversation_tag)
    samples: Samples | None = None      # None unless done, readable and intact
    perf: dict[str, np.ndarray] | None = None
    memory_kind: str = ""               # what the rows' peak_memory_bytes measures ("" when unrecorded)
    layer_kinds: str = ""               # the model's layers by kind when some are windowed ("" when all full)
    error: str = ""

    @property
    def done(self) -> bool:
        return self.samples is not None


def _column(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as floats (NaN where null or absent; may be a read-only view of the table)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan, dtype=float)
    # safe=False: integers beyond 2**53 round as float() does instead of raising.
    return pc.cast(table.column(name), pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _metas(table: pa.Table) -> list[dict[str, Any]]:
    """Each row's ``meta_json`` parsed (``{}`` where absent or not a JSON object)."""
    if "meta_json" not in table.column_names:
        return [{}] * table.num_rows
    out = []
    for text in table.column("meta_json").to_pylist():
        try:
            meta = json.loads(text) if text else {}
        except (TypeError, ValueError):
            meta = {}
        out.append(meta if isinstance(meta, dict) else {})
    return out


def samples_of(table: pa.Table, task: str, instance: str) -> Samples:
    """The sample columns of one cell's rows."""
    n = table.num_rows
    ids = [str(x) for x in table.column("id").to_pylist()] if "id" in table.column_names else [str(i) for i in range(n)]
    length = _column(table, "length")
    need_length = bool(np.isnan(length).all())
    has_level = "level" in table.column_names
    metas = _metas(table) if need_length or not has_level else []  # parsed once, only when needed
    if need_length:
        length = np.array([np.nan if m.get("length") is None else float(m["length"]) for m in metas], dtype=float)
    levels = table.column("level").to_pylist() if has_level else [m.get("level") for m in metas]
    turns = [0 if t is None else int(t) for t in table.column("turn").to_pylist()] if "turn" in table.column_names \
        else [0] * n
    return Samples(
        key=np.array([f"{instance}|{i}" + (f"|t{t}" if t else "") for i, t in zip(ids, turns)], dtype=object),
        task=np.array([task] * n, dtype=object),
        score=_column(table, "score"),
        length=length,
        depth=_column(table, "depth"),
        subset=np.array(["" if v is None else f"level {v}" for v in levels], dtype=object),
        turn=np.array(turns, dtype=int),
        prediction=np.array(_texts(table, "prediction"), dtype=object),
        gold=np.array([(refs or [""])[0] if isinstance(refs, list) else "" for refs in
                       (table.column("references").to_pylist() if "references" in table.column_names else [None] * n)],
                      dtype=object),
        generated=_column(table, "generated_tokens"),
        capped=_column(table, "hit_max_new_tokens"),
    )


def _texts(table: pa.Table, name: str) -> list[str]:
    """A text column ("" where null or absent)."""
    if name not in table.column_names:
        return [""] * table.num_rows
    return ["" if v is None else str(v) for v in table.column(name).to_pylist()]


PERF_COLUMNS = ("ttft_s", "decode_s", "generated_tokens", "peak_memory_bytes", "peak_kv_tokens", "peak_kv_bytes",
                "prompt_tokens", "timing_batch", "extra_forward_tokens", "state_bytes")


def first_recorded(table: pa.Table, name: str) -> str:
    """The rows' first non-empty ``name`` (``memory_kind``, ``layer_kinds``); "" when the column is absent or
    empty."""
    if name not in table.column_names:
        return ""
    return next((str(k) for k in table.column(name).to_pylist() if k), "")


def integrity_problem(view: CellView, results_dir: str | Path, table: pa.Table) -> str | None:
    """Why a done cell's file cannot be trusted as its result, or None when it is intact.

    Files whose rows name their cell (``cell_id``) go through storage's ``verify_cell_file`` (foreign rows,
    fewer or more rows than the index recorded). Older files, written before rows named their cell, cannot be
    checked for foreign rows: only their row count is compared with the index."""
    if view.n_rows is None:
        return None  # nothing recorded to check against
    if CELL_ID_COLUMN in table.column_names:
        return verify_cell_file(results_dir, view.result_path, view.id, view.n_rows)
    if table.num_rows != view.n_rows:
        return f"{table.num_rows} rows, index says {view.n_rows}"
    return None


def read_table(view: CellView, results_dir: str | Path | None) -> pa.Table:
    """A done cell's rows; ``results_dir`` overrides where the index says its Parquet file lives."""
    if not view.result_path:
        raise LookupError(f"cell {view.id} has no result file")
    return read_cell_table(results_dir or view.results_dir, view.result_path)


def _read_done(cell: LoadedCell, results_dir: str | Path | None) -> None:
    """Fill a done cell's samples and perf columns, or its error when the file is unreadable or not intact."""
    view = cell.view
    try:
        table = read_table(view, results_dir)
        problem = integrity_problem(view, results_dir or view.results_dir, table)
    except (OSError, LookupError, pa.ArrowException) as e:
        cell.error = f"result file unreadable: {e}"
        return
    if problem:
        cell.error = f"result file fails its integrity check: {problem}"
        return
    cell.samples = samples_of(table, cell.task, cell.slot.task)
    cell.perf = {c: _column(table, c) for c in PERF_COLUMNS}
    cell.memory_kind = first_recorded(table, "memory_kind")
    cell.layer_kinds = first_recorded(table, "layer_kinds")


def load_cell(view: CellView, run_id: str, results_dir: str | Path | None = None) -> LoadedCell:
    """One cell of run ``run_id`` placed by its slot, with its samples when it is done, readable and intact."""
    cell = LoadedCell(run=run_id, slot=slot_of(view), view=view, task=task_name(view) + conversation_tag(view.spec),
                      error=view.error_line or "")
    if view.state == CellState.DONE.value:
        _read_done(cell, results_dir)
    return cell


def load_run(index: RunIndex, run_id: str, results_dir: str | Path | None = None,
             cache: dict[str, LoadedCell] | None = None) -> list[LoadedCell]:
    """Every cell of a run, in grid order, with the samples of the done ones.

    A done cell whose Parquet file cannot be read or fails its integrity check (:func:`integrity_problem`)
    is treated as failed, with the reason, never as done with fewer samples. ``cache``
    (cell id -> loaded cell) is filled and reused, so a cell shared by several runs is read once."""
    cells = []
    for view in index.run_cells(run_id):
        hit = cache.get(view.id) if cache is not None else None
        if hit is not None:
            cells.append(dataclasses.replace(hit, run=run_id))
            continue
        cell = load_cell(view, run_id, results_dir)
        if cache is not None:
            cache[view.id] = cell
        cells.append(cell)
    return cells
