"""``kdeval nightly nightly.yaml``: run (or resume) a grid, compare it with a baseline, gate on regressions.

The file is a grid file plus a ``nightly:`` section (:mod:`kdeval.jobs.nightly.spec`)::

    name: nightly
    models: [smollm2-135m]
    ...                                   # the grid, as for `kdeval submit`
    nightly:
      baseline: last                      # last passing nightly of this grid, or a pinned run id
      report_dir: .kdeval/nightly         # <report_dir>/<run id>/ + history.jsonl + history.html
      reuse: never                        # or unchanged: reuse a cell only from the same environment
      drift: {nights: 3, max_drop: 2.0}   # the change-point rule over the history
      on_fail: "notify-team --channel ci" # run with the gate.json path appended (no shell)
      tracked:                            # first match wins; fnmatch patterns on metric and policy
        - {metric: needle, max_drop: 5.0}
        - {metric: "ruler.avg", policy: "keydiff*", max_drop: 2.0, max_ttft_ratio: 1.25, max_kv_bytes_ratio: 1.0}
        - {metric: "*", max_drop: 3.0}

The gate (:mod:`kdeval.jobs.nightly.gate`): a tracked metric regresses when it drops (this run − baseline, paired by sample id) by more than
``max_drop`` points **and** the upper end of the delta's CI is below ``-max_drop``, i.e. even the
CI's lower bound of the drop exceeds the threshold; noise does not page anyone. Failed or missing cells
also fail the gate (``fail_on_failed_cells``), and so do the opt-in speed and memory gates
(:mod:`kdeval.jobs.nightly.speed`). Each night computes its cells afresh (:mod:`kdeval.jobs.nightly.env`);
a failing night names the cells that drive each regression and what changed since the baseline
(:mod:`kdeval.jobs.nightly.attribution`); the change-point rule flags slow drifts
(:mod:`kdeval.jobs.nightly.drift`); the baseline comes from the history (:mod:`kdeval.jobs.nightly.history`),
whose page is rewritten every night (:mod:`kdeval.jobs.nightly.history_page`). The report is written either way.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from kdeval.jobs.grid.cells import grid_hash
from kdeval.jobs.nightly.attribution import attribute, attribution_notes, attribution_text
from kdeval.jobs.nightly.drift import DriftFinding, find_drifts
from kdeval.jobs.nightly.env import cell_salt, night_environment
from kdeval.jobs.nightly.gate import GateResult, bad_cells, gate, threshold_for
from kdeval.jobs.nightly.history import append_history, choose_baseline, read_history, run_to_resume
from kdeval.jobs.nightly.history_page import write_history_page
from kdeval.jobs.nightly.leaderboard_page import write_leaderboard
from kdeval.jobs.nightly.notify import run_on_fail
from kdeval.jobs.nightly.record import data_digests, perf_points, series_key, tracked_points
from kdeval.jobs.nightly.spec import NightlyFile, NightlySpec
from kdeval.jobs.nightly.speed import speed_gate
from kdeval.jobs.reports import MetricRow, Report, ReportOptions, build_report
from kdeval.jobs.reports.render.output import write_report
from kdeval.jobs.reports.samples import LoadedCell, load_run
from kdeval.jobs.run import service
from kdeval.storage import RunIndex


@dataclass(frozen=True)
class NightlyOutcome:
    """What a nightly did."""

    run: str
    resumed: bool
    gate: GateResult
    report: Report
    files: dict[str, Path]
    report_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)  # what gate.json holds

    @property
    def exit_code(self) -> int:
        return 0 if self.gate.passed else 1


Executor = Callable[..., Any]


def _start_or_resume(index: RunIndex, nf: NightlyFile, spec: NightlySpec, ghash: str, history: list[dict[str, Any]],
                     env: dict[str, Any], results_dir: str | Path) -> tuple[str, bool]:
    """The unfinished night to resume, else a new run whose cells are salted for tonight (see nightly_env)."""
    run_id = run_to_resume(index, ghash, history)
    if run_id is not None:
        return run_id, True
    salt = cell_salt(spec.reuse, service.new_run_id(), env)
    run_id, _ = service.create_run(index, nf.grid, nf.grid_text, results_dir, salt=salt)
    return run_id, False


def _drifts(index: RunIndex, spec: NightlySpec, nf: NightlyFile, run_id: str, tonight: list[LoadedCell],
            history: list[dict[str, Any]], cache: dict) -> list[DriftFinding]:
    """The change-point rule over this grid's last 2K nights (this one the last)."""
    k = spec.drift.nights
    before: list[str] = []  # the 2K-1 nights before this one, newest first
    for e in reversed(history):
        if len(before) == 2 * k - 1:
            break
        r = e["run"]
        if e.get("grid") == nf.grid.name and r != run_id and r not in before and index.get_run(r) is not None:
            before.append(r)
    nights = [(r, load_run(index, r, cache=cache)) for r in reversed(before)] + [(run_id, tonight)]
    tracked = {(c.slot.model, c.slot.policy, c.slot.budget, c.slot.chunk, c.task) for c in tonight
               if threshold_for(MetricRow(level="task", benchmark="", metric=c.task, model=c.slot.model,
                                          policy=c.slot.policy, budget=c.slot.budget, chunk=c.slot.chunk),
                                spec.tracked) is not None}
    return find_drifts(nights, tracked, k, spec.drift.max_drop, resamples=spec.resamples, seed=spec.seed,
                       confidence=spec.confidence)


def run_nightly(
    index: RunIndex, nf: NightlyFile, *, results_dir: str | Path = service.DEFAULT_RESULTS_DIR,
    address: str | None = None, report_dir: str | Path | None = None, baseline: str | None = None,
    existing_run: str | None = None, execute: Executor | None = None,
) -> NightlyOutcome:
    """Run or resume the grid (unless ``existing_run`` is given), gate it, write the reports and history.

    ``execute(index, run_id, address=...)`` runs a run's cells (default: :func:`service.execute_run`)."""
    spec = nf.spec if baseline is None else nf.spec.model_copy(update={"baseline": baseline})
    out_root = Path(report_dir or spec.report_dir)
    ghash = grid_hash(nf.grid)
    history = read_history(out_root)  # read once: this nightly appends to it only at the end
    env = night_environment()
    resumed = False
    if existing_run is not None:
        run_id = index.resolve_run_id(existing_run)
        if run_id is None:
            raise ValueError(f"--run: no run '{existing_run}'")
    else:
        run_id, resumed = _start_or_resume(index, nf, spec, ghash, history, env, results_dir)
        (execute or service.execute_run)(index, run_id, address=address)
    base = choose_baseline(index, spec, ghash, run_id, history)
    has_base = base is not None and base != run_id
    opts = dict(resamples=spec.resamples, seed=spec.seed, confidence=spec.confidence)
    cells: dict = {}  # every report and history read reads each cell's Parquet file once
    vs_full = build_report(index, [run_id], ReportOptions(**opts), cells)
    tonight = load_run(index, run_id, cache=cells)
    drifts = _drifts(index, spec, nf, run_id, tonight, history, cells)
    if has_base:
        rep = build_report(index, [run_id], ReportOptions(compare=base, **opts), cells)
        result = gate(rep, spec)
        n_speed, speed = speed_gate(rep, spec.tracked)
        result = dataclasses.replace(result, checked=result.checked + n_speed, speed=speed)
    else:
        rep = vs_full  # no baseline yet: only cells that are not done fail the gate
        result = GateResult(checked=0, failed_cells=bad_cells(vs_full, spec), baseline=None)
    result = dataclasses.replace(result, drifts=drifts, drift_fails=spec.drift.fail)
    run_dir = out_root / run_id
    threshold = lambda row: threshold_for(row, spec.tracked)  # noqa: E731
    summary = {"run": run_id, "grid_hash": ghash, "grid": nf.grid.name, "baseline": base,
               "passed": result.passed, "checked": result.checked,
               "regressions": [f.describe() for f in result.regressions],
               "speed_regressions": [f.describe() for f in result.speed],
               "drift": [dict(d.to_json(), key=series_key(d.series[4], d.series[1], d.series[2], d.series[3],
                                                         d.series[0])) for d in drifts],
               "failed_cells": len(result.failed_cells),
               "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "reuse": spec.reuse, "env": env, "data": data_digests(index, run_id),
               "tracked": tracked_points(rep, spec.levels, threshold, {id(f.row) for f in result.regressions}),
               "perf": perf_points(vs_full)}
    if has_base and not result.passed:
        base_entry = next((e for e in reversed(history) if e["run"] == base), None)
        summary["attribution"] = attribute(result.regressions, tonight, load_run(index, base, cache=cells),
                                           base_entry, summary)
        rep = dataclasses.replace(rep, meta=dataclasses.replace(
            rep.meta, notes=rep.meta.notes + attribution_notes(summary["attribution"])))
    files = write_report(rep, run_dir, spec.formats, title=f"kdeval nightly {nf.grid.name}: {run_id} vs "
                                                         f"{base or 'full (no baseline yet)'}")
    if has_base:
        files.update({f"{k}-vs-full": v for k, v in
                      write_report(vs_full, run_dir / "vs-full", spec.formats, title=f"{run_id} vs full").items()})
    files["gate"] = run_dir / "gate.json"
    _write_json(files["gate"], summary)
    if "attribution" in summary:
        files["attribution"] = run_dir / "attribution.md"
        files["attribution"].write_text(attribution_text(summary["attribution"]), encoding="utf-8")
    if not result.passed and spec.on_fail:
        summary["on_fail"] = run_on_fail(spec.on_fail, files["gate"].resolve(), spec.on_fail_timeout_s)
        _write_json(files["gate"], summary)
    append_history(out_root, summary)
    mine = [e for e in read_history(out_root) if e.get("grid") == nf.grid.name]
    board = write_leaderboard(index, nf, out_root)
    if board is not None:
        files["leaderboard"] = board
    files["history"] = write_history_page(mine, out_root, f"kdeval nightly {nf.grid.name}: history", board)
    return NightlyOutcome(run=run_id, resumed=resumed, gate=result, report=rep, files=files, report_dir=run_dir,
                          summary=summary)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temp file (an on_fail command may be reading the previous version)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)
