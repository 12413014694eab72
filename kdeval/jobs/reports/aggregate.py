"""Aggregation: runs in the index -> a :class:`~kdeval.jobs.reports.report_rows.Report`.

``compare="full"``: every cell is compared with the ``full`` cell of the same model × chunk × task
instance in the same runs. ``compare=<run id>``: with the cell of the same slot (model, policy, budget,
chunk, task instance) in that run (before/after a change). Either way the delta is paired by sample id:
only samples present on both sides count, and each row says how many were left out.

    report = build_report(index, ["20261129-..."], ReportOptions(compare="full", resamples=2000))
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from kdeval.jobs.reports.broken import answer_length_rows, broken_rows
from kdeval.jobs.reports.contrasts import cost_of_chunking, query_dependence
from kdeval.jobs.reports.frontier import kv_frontier
from kdeval.jobs.reports.metrics import MetricDef, metric_defs
from kdeval.jobs.reports.report_rows import FULL, CellRow, MetricRow, PerfRow, Report, ReportMeta, State, stored
from kdeval.jobs.reports.perf import noisy_timing_warning, perf_row
from kdeval.jobs.reports.provenance import mismatch_warning, provenance_rows
from kdeval.jobs.reports.samples import Config, LoadedCell, Samples, Slot, config_order, load_run, paired_delta
from kdeval.jobs.reports.stats import stratified_mean
from kdeval.jobs.reports.turns import query_dependence_by_turn, turn_rows
from kdeval.storage import RunIndex


@dataclass(frozen=True)
class ReportOptions:
    """How to compare: the reference ("full" or a run id) and the bootstrap settings."""

    compare: str = FULL
    resamples: int = 2000
    seed: int = 0
    confidence: float = 0.95
    results_dir: str | Path | None = None  # where Parquet files are, when moved since the run

    def __post_init__(self) -> None:
        if self.resamples < 0:
            raise ValueError(f"--resamples must be >= 0, got {self.resamples}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"--confidence must be in (0, 1), got {self.confidence}")


def cell_state(cells: list[LoadedCell], expected: int | None = None) -> str:
    """State of a group of cells: ok (all done), partial, failed, pending, or missing (none at all).

    ``expected``: how many cells the group should have (more than present → the rest are missing)."""
    expected = len(cells) if expected is None else max(expected, len(cells))
    if not cells:
        return State.MISSING
    done = sum(c.done for c in cells)
    if done == expected:
        return State.OK
    if done:
        return State.PARTIAL
    if any(c.view.state in ("failed", "done") for c in cells):
        return State.FAILED  # "done" here: done in the index, but its file could not be read
    return State.PENDING


def _samples(cells: list[LoadedCell]) -> Samples:
    return Samples.concat([c.samples for c in cells if c.samples is not None])


def _resolve_runs(index: RunIndex, refs: list[str]) -> list[str]:
    out = []
    for ref in refs:
        run_id = index.resolve_run_id(ref)
        if run_id is None:
            raise ValueError(f"no run '{ref}' (or the prefix is ambiguous); see `kdeval ls`")
        out.append(run_id)
    return out


def _load(index: RunIndex, run_ids: list[str], results_dir, notes: list[str],
          cache: dict[str, LoadedCell]) -> dict[Slot, LoadedCell]:
    """Cells of the runs by slot (the first run listed wins when two runs hold the same slot).

    ``cache`` is shared by every load of one report: a cell in several runs is read once."""
    by_slot: dict[Slot, LoadedCell] = {}
    for run_id in run_ids:
        for cell in load_run(index, run_id, results_dir, cache):
            kept = by_slot.get(cell.slot)
            if kept is None:
                by_slot[cell.slot] = cell
            elif kept.view.id != cell.view.id:
                notes.append(f"{cell.slot.task} {cell.slot.policy}: run {run_id} has another cell for a slot "
                             f"of run {kept.run}; using {kept.run}'s")
    return by_slot


class _Comparer:
    """Builds the rows of one report from the cells and their reference cells."""

    def __init__(self, own: dict[Slot, LoadedCell], ref: dict[Slot, LoadedCell], by_full: bool,
                 options: ReportOptions) -> None:
        self.own, self.ref, self.by_full, self.opt = own, ref, by_full, options

    def ref_slot(self, slot: Slot) -> Slot:
        return Slot(slot.model, FULL, None, slot.chunk, slot.task) if self.by_full else slot

    def is_reference(self, config: Config) -> bool:
        return self.by_full and config[1] == FULL

    def ref_cell(self, slot: Slot) -> LoadedCell | None:
        """The reference cell of one of this run's slots (None when there is none)."""
        return self.ref.get(self.ref_slot(slot))

    def is_reference_slot(self, slot: Slot) -> bool:
        return self.is_reference(slot.config)

    # ---------------------------------------------------------------- grouping
    def configs(self) -> dict[Config, list[Slot]]:
        """Slots per configuration: this run's, plus (comparing runs) those only the reference has."""
        out: dict[Config, list[Slot]] = defaultdict(list)
        slots = set(self.own) | (set() if self.by_full else set(self.ref))
        for slot in sorted(slots):
            out[slot.config].append(slot)
        return out

    # ---------------------------------------------------------------- scores
    def metric_rows(self, config: Config, slots: list[Slot]) -> list[MetricRow]:
        own_cells = [self.own[s] for s in slots if s in self.own]
        ref_cells = {s: self.ref.get(self.ref_slot(s)) for s in slots}
        own = _samples(own_cells)
        ref = _samples([c for c in ref_cells.values() if c is not None])
        tasks = {c.task for c in own_cells} | {c.task for c in ref_cells.values() if c is not None}
        states: dict[frozenset[str], tuple[str, str]] = {}  # per d.tasks: (state, ref_state)
        rows = []
        for d in metric_defs(tasks, Samples.concat([own, ref])):
            if d.tasks not in states:
                states[d.tasks] = self._states(d.tasks, slots, ref_cells)
            rows.append(self._metric_row(config, d, own, ref, *states[d.tasks]))
        return rows

    def _states(self, tasks: frozenset[str], slots: list[Slot],
                ref_cells: dict[Slot, LoadedCell | None]) -> tuple[str, str]:
        """States of the own cells and of the reference cells of the ``slots`` that ran ``tasks``."""
        # Every slot is in own or (comparing runs, where ref_slot(s) == s) in ref: one of them has its cell.
        mine = [s for s in slots if (self.own.get(s) or ref_cells[s]).task in tasks]
        state = cell_state([self.own[s] for s in mine if s in self.own], expected=len(mine))
        ref_state = cell_state([ref_cells[s] for s in mine if ref_cells[s] is not None], expected=len(mine))
        return state, ref_state

    def _metric_row(self, config: Config, d: MetricDef, own: Samples, ref: Samples, state: str,
                    ref_state: str) -> MetricRow:
        model, policy, budget, chunk = config
        sel, value = _selected(own, d)
        base = dict(level=d.level, benchmark=d.benchmark, metric=d.metric, model=model, policy=policy,
                    budget=budget, chunk=chunk, length=d.length,
                    depth=stored(d.depth), subset=d.subset, state=state, n=len(sel),
                    value=stored(value))
        if self.is_reference(config):
            return MetricRow(**base, ref_state=State.REFERENCE, note="reference")
        rsel, ref_value = _selected(ref, d)
        delta = paired_delta(sel, rsel, d.stratified, resamples=self.opt.resamples, seed=self.opt.seed,
                          confidence=self.opt.confidence)
        row = dict(base, ref_state=ref_state, ref_value=stored(ref_value),
                   n_paired=delta.paired.n, n_dropped=delta.dropped)
        if delta.ci is None:
            why = "no reference cell" if ref_state == State.MISSING else "no paired samples"
            return MetricRow(**row, note=why if (len(sel) or len(rsel)) else "")
        return MetricRow(**row, delta=stored(delta.ci.estimate), ci_low=stored(delta.ci.low),
                         ci_high=stored(delta.ci.high), note=delta.note)

    # ---------------------------------------------------------------- perf and cell states
    def perf_row(self, slot: Slot) -> PerfRow:
        """Speed and memory of the cell of one of this run's slots, and their ratios to its reference cell."""
        cell = self.own[slot]
        ref = None if (self.by_full and slot.policy == FULL) else self.ref.get(self.ref_slot(slot))
        return perf_row(slot, cell, ref, resamples=self.opt.resamples, seed=self.opt.seed,
                        confidence=self.opt.confidence, state=cell_state([cell]))

    def cell_rows(self, compare_run: str) -> list[CellRow]:
        """Cells not done, and cells missing; ``run`` is the run that holds (or lacks) the cell."""
        rows: list[CellRow] = []
        missing: dict[Slot, CellRow] = {}  # reference slots lacking a cell (listed after the cells not done)
        for slot, cell in sorted(self.own.items()):
            if not cell.done:
                rows.append(_cell_row(cell.run, cell, slot, _not_done_state(cell)))
            rs = self.ref_slot(slot)
            if rs not in self.ref and rs not in missing:
                lacking = cell.run if self.by_full else compare_run
                why = "no full-cache cell to compare with" if self.by_full else "not in the reference run"
                missing[rs] = _cell_row(lacking, None, rs, State.MISSING, why)
        rows += missing.values()
        if not self.by_full:
            first = next(iter(self.own.values())).run if self.own else ""
            for slot, cell in sorted(self.ref.items()):
                if slot not in self.own:
                    rows.append(_cell_row(first, None, slot, State.MISSING, f"only in reference run {cell.run}"))
                elif not cell.done:
                    rows.append(_cell_row(cell.run, cell, slot, _not_done_state(cell)))
        return rows


def _not_done_state(cell: LoadedCell) -> str:
    """The state shown for a cell without samples: "done" in the index but its file unreadable is a failure."""
    return State.FAILED if cell.view.state == "done" else cell.view.state


def _selected(samples: Samples, d: MetricDef) -> tuple[Samples, float | None]:
    """The samples behind metric ``d`` and its value in points (None without samples)."""
    sel = samples.take(d.select(samples)) if len(samples) else samples
    value = stratified_mean(sel.score, sel.task if d.stratified else None) * 100 if len(sel) else None
    return sel, value


def _cell_row(run: str, cell: LoadedCell | None, slot: Slot, state: str, error: str = "") -> CellRow:
    return CellRow(run=run, cell=cell.view.id if cell else "", model=slot.model, policy=slot.policy,
                   budget=slot.budget, chunk=slot.chunk, task=slot.task, state=state,
                   error=error or (cell.error if cell else ""))


def external_notes(index: RunIndex, run_id: str, scores: list[MetricRow]) -> list[str]:
    """For a reference run imported from another tool: what computed it and how many task scores pair by
    sample (the others compare aggregates only); nothing for a kdeval run."""
    import yaml

    run = index.get_run(run_id)
    try:
        grid = yaml.safe_load(run.grid_yaml) if run is not None and run.grid_yaml else None
    except yaml.YAMLError:
        grid = None
    external = grid.get("external") if isinstance(grid, dict) else None
    if not isinstance(external, dict):
        return []
    tasks = [r for r in scores if r.level == "task" and r.value is not None and r.ref_value is not None]
    paired = [r for r in tasks if r.n_paired]
    return [f"run {run_id} is external, computed by {external.get('computed_by', 'another tool')}: "
            f"{len(paired)} of {len(tasks)} task scores paired by sample id "
            f"({sum(r.n_paired for r in paired)} samples); "
            + ("the others compare aggregates only (their samples differ)" if len(paired) < len(tasks)
               else "every compared score is paired")]


def build_report(index: RunIndex, runs: list[str], options: ReportOptions = ReportOptions(),
                 cache: dict[str, LoadedCell] | None = None) -> Report:
    """The report of ``runs`` (ids or unique prefixes) against ``options.compare``. ``cache`` (cell id ->
    loaded cell): pass the same dict to several reports of the same runs so each cell is read once.

    Raises ``ValueError`` for an unknown run or bad options."""
    if not runs:
        raise ValueError("no run given and the index has no runs")
    run_ids = _resolve_runs(index, runs)
    notes: list[str] = []
    cache = {} if cache is None else cache
    own = _load(index, run_ids, options.results_dir, notes, cache)
    by_full = options.compare == FULL
    if by_full:
        ref, compare = own, FULL
    else:
        compare = _resolve_runs(index, [options.compare])[0]
        if compare in run_ids:
            raise ValueError(f"--compare {compare}: the reference run is also one of the runs reported")
        ref = _load(index, [compare], options.results_dir, notes, cache)
    cmp = _Comparer(own, ref, by_full, options)
    scores: list[MetricRow] = []
    for config, slots in sorted(cmp.configs().items(), key=lambda item: config_order(item[0])):
        scores.extend(cmp.metric_rows(config, slots))
    perf = [cmp.perf_row(slot) for slot in sorted(own)]
    cells = cmp.cell_rows(compare)
    dropped = sum(r.n_dropped for r in scores if r.level == "task")
    if dropped:
        notes.append(f"pairing by sample id left out {dropped} sample(s) present on one side only "
                     f"(see n_dropped per row)")
    if not by_full:
        notes += external_notes(index, compare, scores)
    provenance = provenance_rows(list(own.values()) + ([] if by_full else list(ref.values())))
    warnings = [w for w in (mismatch_warning(provenance), noisy_timing_warning(perf, options.confidence)) if w]
    boot = dict(resamples=options.resamples, seed=options.seed, confidence=options.confidence)
    chunking, query = cost_of_chunking(own.values(), **boot), query_dependence(own.values(), **boot)
    pairing = (own, cmp.ref_cell, cmp.is_reference_slot)
    meta = ReportMeta(runs=run_ids, compare=compare, resamples=options.resamples, seed=options.seed,
                      confidence=options.confidence,
                      created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), notes=notes,
                      warnings=warnings, layer_kinds={c.slot.model: c.layer_kinds for c in own.values()
                                                      if c.layer_kinds})
    return Report(meta=meta, scores=scores, perf=perf, cells=cells, provenance=provenance,
                  cost_of_chunking=chunking, query_dependence=query, turns=turn_rows(*pairing, **boot),
                  query_dependence_by_turn=query_dependence_by_turn(own.values(), **boot),
                  broken=broken_rows(*pairing), answer_length=answer_length_rows(*pairing, **boot),
                  kv_frontier=kv_frontier(own.values(), **boot))
