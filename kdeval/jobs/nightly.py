"""``kdeval nightly nightly.yaml``: run (or resume) a grid, compare it with a baseline, gate on regressions.

The file is a grid file plus a ``nightly:`` section (the grid schema forbids unknown keys, so the section
is split off here and validated by :class:`NightlySpec`)::

    name: nightly
    models: [smollm2-135m]
    ...                                   # the grid, as for `kdeval submit`
    nightly:
      baseline: last                      # last passing nightly of this grid, or a pinned run id
      report_dir: .kdeval/nightly         # <report_dir>/<run id>/ + history.jsonl
      tracked:                            # first match wins; fnmatch patterns on metric and policy
        - {metric: needle, max_drop: 5.0}
        - {metric: "ruler.avg", policy: "keydiff*", max_drop: 2.0}
        - {metric: "*", max_drop: 3.0}

A tracked metric regresses when it drops (this run − baseline, paired by sample id) by more than
``max_drop`` points **and** the upper end of the delta's CI is below ``-max_drop``, i.e. even the
CI's lower bound of the drop exceeds the threshold; noise does not page anyone. Failed or missing cells
also fail the gate (``fail_on_failed_cells``). The report is written either way.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kdeval.evals.chunking import chunk_text
from kdeval.jobs import service
from kdeval.jobs.cells import grid_hash
from kdeval.jobs.errors import join_path
from kdeval.jobs.grid import GridSpec
from kdeval.jobs.reports import CellRow, MetricRow, Report, ReportOptions, build_report
from kdeval.jobs.reports.output import FORMATS, write_report
from kdeval.jobs.validate import load_mapping, validate_mapping
from kdeval.storage import RunIndex, RunState

HISTORY = "history.jsonl"


class TrackedMetric(BaseModel):
    """A metric the gate watches: fnmatch patterns on the metric name and the policy, and a threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(default="*", min_length=1)   # "needle", "ruler.avg", "longbench.*", "*"
    policy: str = Field(default="*", min_length=1)   # "keydiff", "snapkv*", "*"
    max_drop: float = Field(ge=0.0)                  # points (0-100 scale)

    def matches(self, row: MetricRow) -> bool:
        return fnmatch.fnmatchcase(row.metric, self.metric) and fnmatch.fnmatchcase(row.policy, self.policy)


class NightlySpec(BaseModel):
    """The ``nightly:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: str = Field(default="last", min_length=1)
    tracked: list[TrackedMetric] = Field(min_length=1)
    report_dir: str = ".kdeval/nightly"
    formats: list[str] = Field(default_factory=lambda: ["html", "json", "md"])
    resamples: int = Field(default=2000, ge=0)
    seed: int = 0
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0)
    fail_on_failed_cells: bool = True
    levels: list[str] = Field(default_factory=lambda: ["task", "benchmark"])  # which score rows are gated

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in FORMATS or x == "table"]
        if bad:
            raise ValueError(f"unknown format {bad[0]!r}; expected some of md, csv, json, html")
        return v

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in ("task", "benchmark", "detail")]
        if bad:
            raise ValueError(f"unknown level {bad[0]!r}; expected task, benchmark or detail")
        return v


@dataclass(frozen=True)
class NightlyFile:
    """A parsed nightly file: its grid (validated as for ``submit``), the grid's text, the settings."""

    grid: GridSpec
    grid_text: str
    spec: NightlySpec


def parse_nightly(text: str, source: str = "nightly.yaml") -> NightlyFile:
    """Validate a nightly file (``ValueError`` naming the field on any problem; grid errors — bad YAML
    included — as ``GridError``)."""
    raw = load_mapping(text, source)
    if "nightly" not in raw:
        raise ValueError(f"{source}: nightly: section is missing (it holds baseline and tracked metrics)")
    section = raw.pop("nightly")
    try:
        spec = NightlySpec.model_validate(section or {})
    except ValidationError as e:
        lines = [f"{join_path(['nightly', *err['loc']])}: {err['msg']}" for err in e.errors()]
        raise ValueError(f"{source}: " + "; ".join(lines)) from None
    grid = validate_mapping(raw, source)
    return NightlyFile(grid=grid, grid_text=yaml.safe_dump(raw, sort_keys=False), spec=spec)


def load_nightly(path: str | Path) -> NightlyFile:
    """Read and validate a nightly file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e}") from None
    return parse_nightly(text, str(p))


# ------------------------------------------------------------------ the gate
@dataclass(frozen=True)
class Finding:
    """A tracked metric that regressed: its row, the threshold and the drop with its CI."""

    row: MetricRow
    max_drop: float

    @property
    def drop(self) -> float:
        return -float(self.row.delta)

    @property
    def drop_ci(self) -> tuple[float, float]:
        return (-float(self.row.ci_high), -float(self.row.ci_low))

    def describe(self) -> str:
        r, (lo, hi) = self.row, self.drop_ci
        budget = "" if r.budget is None else f" N={r.budget}"
        return (f"{r.metric} {r.policy}{budget} B={chunk_text(r.chunk)} ({r.model}): dropped {self.drop:.2f} points "
                f"(95% CI {lo:.2f}..{hi:.2f}) > {self.max_drop:g}")


@dataclass(frozen=True)
class GateResult:
    """What the gate found."""

    checked: int                                  # tracked rows with a delta
    regressions: list[Finding] = field(default_factory=list)
    failed_cells: list[CellRow] = field(default_factory=list)
    baseline: str | None = None

    @property
    def passed(self) -> bool:
        return not self.regressions and not self.failed_cells


def threshold_for(row: MetricRow, tracked: list[TrackedMetric]) -> float | None:
    """``max_drop`` of the first tracked entry matching ``row`` (None: not tracked)."""
    for t in tracked:
        if t.matches(row):
            return t.max_drop
    return None


def gate(report: Report, spec: NightlySpec) -> GateResult:
    """Check a report against a baseline run (``report.meta.compare``) for tracked regressions."""
    checked, found = 0, []
    for row in report.scores:
        if row.level not in spec.levels:
            continue
        limit = threshold_for(row, spec.tracked)
        if limit is None or row.delta is None or row.ci_high is None:
            continue
        checked += 1
        if -row.delta > limit and -row.ci_high > limit:
            found.append(Finding(row, limit))
    return GateResult(checked=checked, regressions=found, failed_cells=bad_cells(report, spec),
                      baseline=report.meta.compare)


def bad_cells(report: Report, spec: NightlySpec) -> list[CellRow]:
    """Cells of the gated run that fail the gate: not done, or missing although the baseline has them.

    Against the full cache a missing ``full`` cell only means "no delta", not a failure of the run; the
    baseline's own failed cells are shown in the report but do not fail tonight's run."""
    if not spec.fail_on_failed_cells:
        return []
    by_full = report.meta.compare == "full"
    return [c for c in report.cells if c.run in report.meta.runs and not (by_full and c.state == "missing")]


# ------------------------------------------------------------------ history and baseline
def read_history(report_dir: Path) -> list[dict[str, Any]]:
    """Past nightlies, oldest first (``history.jsonl`` lines)."""
    path = report_dir / HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_history(report_dir: Path, entry: dict[str, Any]) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    with open(report_dir / HISTORY, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def choose_baseline(index: RunIndex, spec: NightlySpec, ghash: str, current: str,
                    history: list[dict[str, Any]]) -> str | None:
    """The pinned run, else the last passing nightly of this grid, else its newest other done run that
    did not fail a nightly gate (so a regression never becomes tomorrow's baseline).

    ``history`` is :func:`read_history` of the report directory."""
    if spec.baseline != "last":
        rid = index.resolve_run_id(spec.baseline)
        if rid is None:
            raise ValueError(f"nightly.baseline: no run '{spec.baseline}'")
        return rid
    runs = index.runs_of_grid(ghash)
    known = {rid for rid, _ in runs}
    for entry in reversed(history):
        if entry.get("passed") and entry.get("grid_hash") == ghash and entry["run"] != current and entry["run"] in known:
            return entry["run"]
    failed_gate = {e["run"] for e in history if not e.get("passed")}
    for rid, state in runs:
        if rid != current and state == RunState.DONE.value and rid not in failed_gate:
            return rid
    return None


def run_to_resume(index: RunIndex, ghash: str, history: list[dict[str, Any]]) -> str | None:
    """The newest run of this grid if it never finished and was never gated (a nightly that died).

    ``history`` is :func:`read_history` of the report directory."""
    gated = {e["run"] for e in history}
    runs = index.runs_of_grid(ghash)
    if not runs:
        return None
    rid, state = runs[0]
    if rid in gated or state == RunState.DONE.value:
        return None
    view = index.get_run(rid)
    return None if view is None or service.driver_alive(view) else rid


# ------------------------------------------------------------------ one nightly
@dataclass(frozen=True)
class NightlyOutcome:
    """What a nightly did."""

    run: str
    resumed: bool
    gate: GateResult
    report: Report
    files: dict[str, Path]
    report_dir: Path

    @property
    def exit_code(self) -> int:
        return 0 if self.gate.passed else 1


Executor = Callable[..., Any]


def run_nightly(
    index: RunIndex, nf: NightlyFile, *, results_dir: str | Path = service.DEFAULT_RESULTS_DIR,
    address: str | None = None, report_dir: str | Path | None = None, baseline: str | None = None,
    existing_run: str | None = None, execute: Executor = service.execute_run,
) -> NightlyOutcome:
    """Run or resume the grid (unless ``existing_run`` is given), gate it, write the reports and history.

    ``execute(index, run_id, address=...)`` runs a run's cells (the scheduler; tests pass a fake)."""
    spec = nf.spec if baseline is None else nf.spec.model_copy(update={"baseline": baseline})
    out_root = Path(report_dir or spec.report_dir)
    ghash = grid_hash(nf.grid)
    history = read_history(out_root)  # read once: this nightly appends to it only at the end
    resumed = False
    if existing_run is not None:
        run_id = index.resolve_run_id(existing_run)
        if run_id is None:
            raise ValueError(f"--run: no run '{existing_run}'")
    else:
        run_id = run_to_resume(index, ghash, history)
        resumed = run_id is not None
        if run_id is None:
            run_id, _ = service.create_run(index, nf.grid, nf.grid_text, results_dir)
        execute(index, run_id, address=address)
    base = choose_baseline(index, spec, ghash, run_id, history)
    has_base = base is not None and base != run_id
    opts = dict(resamples=spec.resamples, seed=spec.seed, confidence=spec.confidence)
    cells: dict = {}  # both reports read each cell's Parquet file once
    vs_full = build_report(index, [run_id], ReportOptions(**opts), cells)
    if has_base:
        rep = build_report(index, [run_id], ReportOptions(compare=base, **opts), cells)
        result = gate(rep, spec)
    else:
        rep = vs_full  # no baseline yet: only cells that are not done fail the gate
        result = GateResult(checked=0, failed_cells=bad_cells(vs_full, spec), baseline=None)
    run_dir = out_root / run_id
    files = write_report(rep, run_dir, spec.formats, title=f"kdeval nightly {nf.grid.name}: {run_id} vs "
                                                         f"{base or 'full (no baseline yet)'}")
    if has_base:
        files.update({f"{k}-vs-full": v for k, v in
                      write_report(vs_full, run_dir / "vs-full", spec.formats, title=f"{run_id} vs full").items()})
    summary = {"run": run_id, "grid_hash": ghash, "grid": nf.grid.name, "baseline": base,
               "passed": result.passed, "checked": result.checked,
               "regressions": [f.describe() for f in result.regressions],
               "failed_cells": len(result.failed_cells),
               "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    files["gate"] = run_dir / "gate.json"
    files["gate"].write_text(json.dumps(summary, indent=2), encoding="utf-8")
    append_history(out_root, summary)
    return NightlyOutcome(run=run_id, resumed=resumed, gate=result, report=rep, files=files, report_dir=run_dir)
