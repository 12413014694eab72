"""The nightly gate: which tracked scores of a night regressed against its baseline (CI-aware), and which cells
fail the night (see :mod:`kdeval.jobs.nightly.run` for the rule; the speed and memory gates are
:mod:`kdeval.jobs.nightly.speed`, the drift rule :mod:`kdeval.jobs.nightly.drift`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.nightly.drift import DriftFinding
from kdeval.jobs.nightly.spec import NightlySpec, TrackedMetric
from kdeval.jobs.nightly.speed import SpeedFinding
from kdeval.jobs.reports import CellRow, MetricRow, Report


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
    speed: list[SpeedFinding] = field(default_factory=list)   # opt-in speed and memory gates
    drifts: list[DriftFinding] = field(default_factory=list)  # the change-point rule over the history
    drift_fails: bool = False                                 # nightly.drift.fail

    @property
    def passed(self) -> bool:
        return not (self.regressions or self.failed_cells or self.speed or (self.drift_fails and self.drifts))


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
