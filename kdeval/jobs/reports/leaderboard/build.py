"""The leaderboard: every done cell the index knows for some models and tasks, one row per cell id, ranked.

Each row is one computation (a cell id, gathered once whatever runs list it: :mod:`.leaderboard_cells`) with
its score, and its Δ against the full cache of the same model, task instance (task, length, seed) and chunk size,
paired by sample id with a bootstrap CI (:func:`kdeval.jobs.reports.samples.paired_delta`, as ``kdeval report``
pairs), its peak KV-cache bytes and their ratio to the full cache's, TTFT and decode speed where timed
(:func:`kdeval.jobs.reports.perf.perf_row`), its protocol, KV store and code version.

The full-cache cell a row is paired with may come from another run. When the index holds several (computed by
other code, or with other settings), the row is paired with one that shares a run with it (a run reuses a cell
only when the code that computes it is unchanged, so cells of one run belong together), else one computed by
the same checkout (provenance source hash), else the newest; the row's ``ref_note`` says so whenever that
choice was not obvious or the reference ran other code. Two cells of the same configuration (model, policy,
budget, chunk, task instance) computed by different code or settings are never merged: each is its own row,
flagged with what differs (``variant``).

    board = build_leaderboard(index, Filters(tasks=("ruler",)), LeaderboardOptions(order="delta"))
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kdeval.evals.task_run.budget import Budget, budget_order
from kdeval.jobs.reports.leaderboard.cells import (Filters, Gathered, gather, is_reference, kv_quant_label,
                                                   protocol_label)
from kdeval.jobs.reports.report_rows import State, stored
from kdeval.jobs.reports.perf import perf_row
from kdeval.jobs.reports.samples import LoadedCell, paired_delta, task_name

ORDERS = ("score", "delta")
#: How a row's ``ref_note`` starts when its full cache ran in another run by other (or unrecorded) code.
OTHER_CODE = "paired with the full cache of another run computed by other code"


@dataclass(frozen=True)
class LeaderboardOptions:
    """How rows are ranked (``score`` or ``delta``, best first, within each model × task instance) and the
    bootstrap of the Δ CIs."""

    order: str = "score"
    resamples: int = 2000
    seed: int = 0
    confidence: float = 0.95
    results_dir: str | Path | None = None  # where Parquet files are, when moved since their runs

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"--rank {self.order}: expected one of {', '.join(ORDERS)}")
        if self.resamples < 0:
            raise ValueError(f"--resamples must be >= 0, got {self.resamples}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"--confidence must be in (0, 1), got {self.confidence}")


@dataclass(frozen=True)
class LeaderboardRow:
    """One cell (one computation) and how it compares with the full cache."""

    rank: int                  # within its model × task instance (ties share a rank)
    model: str
    task: str                  # task instance: "ruler.niah_single_1@2048#s0"
    policy: str                # policy label, with its protocol and store tags
    budget: Budget
    chunk: int
    n: int = 0
    value: float | None = None  # points (mean per-sample score × 100)
    ref_value: float | None = None  # the paired full cache's score (all its samples)
    n_paired: int = 0
    delta: float | None = None  # this − full, paired by sample id (points)
    ci_low: float | None = None
    ci_high: float | None = None
    peak_kv_bytes: int | None = None
    kv_bytes_ratio: float | None = None  # peak KV bytes / the full cache's
    ttft_median_s: float | None = None
    decode_tok_s: float | None = None
    protocol: str = "prompt/evict"
    kv_quant: str = ""
    code: str = ""             # the cell's result code version (release + hash of the code that computed it)
    device: str = ""
    cell: str = ""
    ref_cell: str = ""
    runs: str = ""             # the runs that list this cell, newest first, space-separated
    variant: str = ""          # "1 of 2 cells of this configuration; they differ in kdeval_version"
    ref_note: str = ""         # how the reference was chosen, when it was not obvious
    state: str = State.OK


@dataclass(frozen=True)
class LeaderboardMeta:
    """What the leaderboard holds and how it was computed."""

    filters: dict[str, list[str]]
    order: str
    runs: int                  # runs read
    cells: int                 # rows
    resamples: int
    seed: int
    confidence: float
    created: str
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def method(self) -> str:
        """How Δ and its CI are computed (one line of the Markdown and HTML headers)."""
        return (f"Δ = this − the full cache of the same model, task instance and chunk size, in points, paired by "
                f"sample id across runs; {int(self.confidence * 100)}% CI by paired bootstrap ({self.resamples} "
                f"resamples, seed {self.seed})")


@dataclass(frozen=True)
class Leaderboard:
    """Everything ``kdeval leaderboard`` prints or writes."""

    meta: LeaderboardMeta
    rows: list[LeaderboardRow]


def code_of(cell: LoadedCell) -> str:
    """The code version that computed a cell: its spec's ``kdeval_version`` (release + result-code hash)."""
    return str((cell.view.spec or {}).get("kdeval_version") or "")


def _source(cell: LoadedCell) -> str:
    prov = cell.view.provenance if isinstance(cell.view.provenance, dict) else {}
    return str(prov.get("source_hash") or "")


def _flat(spec: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(spec, dict):
        return {prefix: spec}
    out: dict[str, Any] = {}
    for k, v in spec.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def variant_notes(cells: list[LoadedCell]) -> dict[str, str]:
    """Cell id -> what sets it apart from the other cells of its configuration (only for configurations with
    several cells: other code, other sample counts, another nightly's salt ...)."""
    by_slot: dict[Any, list[LoadedCell]] = defaultdict(list)
    for c in cells:
        by_slot[c.slot].append(c)
    out = {}
    for group in by_slot.values():
        if len(group) < 2:
            continue
        flats = [_flat(c.view.spec or {}) for c in group]
        keys = sorted({k for f in flats for k in f if len({repr(g.get(k)) for g in flats}) > 1})
        what = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
        for i, c in enumerate(group):
            out[c.view.id] = f"{i + 1} of {len(group)} cells of this configuration; they differ in {what or 'id'}"
    return out


def choose_reference(cell: LoadedCell, gathered: Gathered) -> tuple[LoadedCell | None, str]:
    """The full-cache cell ``cell`` is paired with, and a note when the choice was not obvious (see the module's
    docstring): one sharing a run, else one of the same checkout, else the newest."""
    s = cell.slot
    candidates = [c for c in gathered.references.get((s.model, s.chunk, s.task), []) if c.view.id != cell.view.id]
    if is_reference(cell):
        return cell, ""
    if not candidates:
        return None, "no full-cache cell of this model, task instance and chunk size"
    order = {r.id: i for i, r in enumerate(gathered.runs)}
    mine = set(gathered.runs_of.get(cell.view.id, []))
    shared = [(min(order.get(r, 1 << 30) for r in set(gathered.runs_of.get(c.view.id, [])) & mine), c)
              for c in candidates if set(gathered.runs_of.get(c.view.id, [])) & mine]
    several = f" (the index has {len(candidates)} full-cache cells here)" if len(candidates) > 1 else ""
    if shared:
        ref = min(shared, key=lambda pair: pair[0])[1]
        return ref, (f"paired with the full cache of a run that holds both{several}" if several else "")
    same = [c for c in candidates if _source(c) and _source(c) == _source(cell)]
    if same:
        return same[0], f"paired with the full cache of another run, same checkout{several}" if several else ""
    ref = max(candidates, key=lambda c: (c.view.finished_at is not None, c.view.finished_at or 0))
    if _source(ref) and _source(cell):
        return ref, f"{OTHER_CODE}: code {_source(ref)[:12]}, this cell {_source(cell)[:12]}{several}"
    return ref, f"{OTHER_CODE}: code not recorded{several}"


def _row(cell: LoadedCell, gathered: Gathered, options: LeaderboardOptions, variants: dict[str, str]) -> LeaderboardRow:
    ref, note = choose_reference(cell, gathered)
    boot = dict(resamples=options.resamples, seed=options.seed, confidence=options.confidence)
    own_ref = ref is cell
    perf = perf_row(cell.slot, cell, None if own_ref else ref, state=State.OK, **boot)
    score = stored(float(cell.samples.score.mean() * 100)) if len(cell.samples) else None
    base = dict(rank=0, model=cell.slot.model, task=cell.slot.task, policy=cell.slot.policy,
                budget=cell.slot.budget, chunk=cell.slot.chunk, n=len(cell.samples), value=score,
                peak_kv_bytes=perf.peak_kv_bytes, kv_bytes_ratio=1.0 if own_ref and perf.peak_kv_bytes else
                perf.kv_bytes_ratio, ttft_median_s=perf.ttft_median_s, decode_tok_s=perf.decode_tok_s,
                protocol=protocol_label(cell.view), kv_quant=kv_quant_label(cell.view), code=code_of(cell),
                device=str((cell.view.provenance or {}).get("device") or ""), cell=cell.view.id,
                runs=" ".join(gathered.runs_of.get(cell.view.id, [])), variant=variants.get(cell.view.id, ""),
                ref_note=note)
    if ref is None:
        return LeaderboardRow(**base, state=State.MISSING)
    ref_score = stored(float(ref.samples.score.mean() * 100)) if len(ref.samples) else None
    base.update(ref_cell=ref.view.id, ref_value=ref_score)
    if own_ref:
        return LeaderboardRow(**base, state=State.REFERENCE)
    d = paired_delta(cell.samples, ref.samples, False, **boot)
    if d.ci is None:
        return LeaderboardRow(**dict(base, ref_note=note or "no sample pairs with the full cache"))
    return LeaderboardRow(**base, n_paired=d.paired.n, delta=stored(d.ci.estimate), ci_low=stored(d.ci.low),
                          ci_high=stored(d.ci.high))


def _instance_key(row: LeaderboardRow, lengths: dict[str, tuple]) -> tuple:
    return (row.model, *lengths.get(row.task, (row.task, 0, 0)), row.task)


def rank_rows(rows: list[LeaderboardRow], order: str, instance_keys: dict[str, tuple]) -> list[LeaderboardRow]:
    """Rows grouped by model × task instance, best first by ``order`` (rows without that number last), each
    with its rank in its group (ties share one)."""
    def value(r: LeaderboardRow) -> float | None:
        return r.delta if order == "delta" and r.state != State.REFERENCE else \
            (0.0 if order == "delta" else r.value)

    groups: dict[tuple, list[LeaderboardRow]] = defaultdict(list)
    for r in rows:
        groups[_instance_key(r, instance_keys)].append(r)
    out = []
    for key in sorted(groups):
        members = sorted(groups[key], key=lambda r: (value(r) is None, -(value(r) or 0.0), r.policy,
                                                     budget_order(r.budget), r.chunk, r.cell))
        previous, rank = None, 0
        for i, r in enumerate(members, 1):
            v = value(r)
            if v is None or v != previous:
                rank, previous = i, v
            out.append(replace(r, rank=rank))
    return out


def build_leaderboard(index: Any, filters: Filters = Filters(),
                      options: LeaderboardOptions = LeaderboardOptions()) -> Leaderboard:
    """The leaderboard of ``index`` (a :class:`kdeval.storage.RunIndex`) for ``filters``.

    Raises :class:`~kdeval.jobs.reports.leaderboard.cells.LeaderboardInputError` (a ``ValueError``) on bad
    input; matching nothing is not an error (no rows)."""
    gathered = gather(index, filters, options.results_dir)
    variants = variant_notes(gathered.cells)
    rows = [_row(c, gathered, options, variants) for c in gathered.cells]
    keys = {}
    for c in gathered.cells:
        task = (c.view.spec or {}).get("task") or {}
        keys[c.slot.task] = (task_name(c.view), task.get("length") or 0, task.get("seed") or 0)
    rows = rank_rows(rows, options.order, keys)
    warnings = []
    if variants:
        warnings.append(f"{len(variants)} row(s) share their configuration with cells computed by other code or "
                        f"settings: each is its own row (never merged), its 'variant' says what differs")
    foreign = [r for r in rows if r.ref_note.startswith(OTHER_CODE)]
    if foreign:
        warnings.append(f"{len(foreign)} row(s) are paired with a full cache of another run whose code differs or "
                        f"was not recorded (see ref_note): their Δ may mix code versions")
    meta = LeaderboardMeta(
        filters={k: list(v) for k, v in vars(filters).items() if v}, order=options.order,
        runs=len(gathered.runs), cells=len(rows), resamples=options.resamples, seed=options.seed,
        confidence=options.confidence, created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        notes=gathered.notes, warnings=warnings)
    return Leaderboard(meta=meta, rows=rows)
