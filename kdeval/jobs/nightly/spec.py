"""The ``nightly:`` section of a nightly file and the file itself (see :mod:`kdeval.jobs.nightly.run`)."""
from __future__ import annotations

import fnmatch
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kdeval.jobs.grid.errors import join_path
from kdeval.jobs.grid.load import load_mapping, validate_mapping
from kdeval.jobs.grid.schema import GridSpec
from kdeval.jobs.reports import MetricRow
from kdeval.jobs.reports.render.output import FORMATS


class TrackedMetric(BaseModel):
    """A metric the gate watches: fnmatch patterns on the metric name and the policy, and a threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(default="*", min_length=1, description="An fnmatch pattern on the score row's name: "
                        "`needle`, `ruler.avg`, `longbench.*`, `*`.")
    policy: str = Field(default="*", min_length=1, description="An fnmatch pattern on the policy: `keydiff`, "
                        "`snapkv*`, `*`.")
    max_drop: float = Field(ge=0.0, description="Points (0-100 scale): fail when the drop and its CI's bound "
                            "are both beyond it.")
    # opt-in speed and memory gates against the baseline's same cell (see kdeval.jobs.nightly.speed)
    max_ttft_ratio: float | None = Field(default=None, gt=0.0, description="Fail when the CI of TTFT's ratio "
                                         "to the baseline is all above it.")
    min_decode_ratio: float | None = Field(default=None, gt=0.0, description="Fail when the CI of decode "
                                           "tokens/s's ratio to the baseline is all below it.")
    max_kv_bytes_ratio: float | None = Field(default=None, gt=0.0, description="Fail when peak KV bytes grow "
                                             "beyond this ratio to the baseline (exact).")

    def matches(self, row: MetricRow) -> bool:
        return fnmatch.fnmatchcase(row.metric, self.metric) and fnmatch.fnmatchcase(row.policy, self.policy)

    @property
    def gates_speed(self) -> bool:
        return any(v is not None for v in (self.max_ttft_ratio, self.min_decode_ratio, self.max_kv_bytes_ratio))


class DriftSpec(BaseModel):
    """The change-point rule over the history (:mod:`kdeval.jobs.nightly.drift`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nights: int = Field(default=3, ge=1, description="K: the last K nights against the K before them.")
    max_drop: float = Field(default=2.0, ge=0.0, description="Points: the mean drop that, with its CI, flags "
                            "a drift.")
    fail: bool = Field(False, description="`true`: a flagged drift also fails the night.")


class NightlySpec(BaseModel):
    """The ``nightly:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    baseline: str = Field(default="last", min_length=1, description="`last`: the last nightly of the same "
                          "grid that passed; or a run id to pin.")
    tracked: list[TrackedMetric] = Field(min_length=1, description="The metrics the gate watches.")
    report_dir: str = Field(".kdeval/nightly", description="Where each night's reports, `gate.json` and the "
                            "history go.")
    formats: list[str] = Field(default_factory=lambda: ["html", "json", "md"], description="Report formats "
                               "written each night: some of md, csv, json, html.")
    resamples: int = Field(default=2000, ge=0, description="Bootstrap resamples of each CI.")
    seed: int = Field(0, description="The bootstrap's seed.")
    confidence: float = Field(default=0.95, gt=0.0, lt=1.0, description="The CIs' confidence level.")
    fail_on_failed_cells: bool = Field(True, description="A night with failed cells fails.")
    levels: list[str] = Field(default_factory=lambda: ["task", "benchmark"], description="Which score rows are "
                              "gated: some of task, benchmark, detail.")
    reuse: Literal["never", "unchanged"] = Field("never", description="`unchanged`: reuse a cell from a night "
                                                 "with the same source hash, library versions, device and "
                                                 "dtype; `never`: compute every night afresh.")
    drift: DriftSpec = Field(DriftSpec(), description="The slow-drift rule over the history.")
    on_fail: str | None = Field(default=None, min_length=1, description="A command (split like a shell, run "
                                "without one) run with the `gate.json` path appended when the night fails.")
    on_fail_timeout_s: float = Field(default=120.0, gt=0.0, description="Seconds `on_fail` may run.")

    @field_validator("formats")
    @classmethod
    def _known_formats(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in FORMATS or x == "table"]
        if bad:
            raise ValueError(f"unknown format {bad[0]!r}; expected some of md, csv, json, html")
        return v

    @field_validator("on_fail")
    @classmethod
    def _a_command(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            argv = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"expected a command with its arguments (split like a shell, run without one): {e}") from None
        if not argv:
            raise ValueError("expected a command with its arguments, got only spaces")
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
    timed = [i for i, t in enumerate(spec.tracked) if t.max_ttft_ratio is not None]
    if timed and grid.execution.share:
        # shared execution times only each cell's first samples alone: a TTFT gate would rest on one timing and
        # never fire (decode speed and KV bytes are every sample's own, so those gates work either way)
        raise ValueError(f"{source}: nightly.tracked[{timed[0]}].max_ttft_ratio: a TTFT gate needs every sample "
                         "timed alone; set execution: {share: false} in the grid")
    return NightlyFile(grid=grid, grid_text=yaml.safe_dump(raw, sort_keys=False), spec=spec)


def load_nightly(path: str | Path) -> NightlyFile:
    """Read and validate a nightly file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read {p}: {e}") from None
    return parse_nightly(text, str(p))
