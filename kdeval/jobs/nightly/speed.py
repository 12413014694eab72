"""Opt-in speed and memory gates: this night's cells against the baseline's same cells.

Per tracked entry (the first whose policy pattern matches a cell and which sets a speed threshold):

- ``max_ttft_ratio``: TTFT (median batch timing) / the baseline's; fails when the ratio's whole bootstrap CI
  is above the threshold;
- ``min_decode_ratio``: decode tokens/s / the baseline's; fails when the whole CI is below the threshold;
- ``max_kv_bytes_ratio``: peak KV-cache bytes / the baseline's; exact (no sampling noise), fails as soon as
  the ratio exceeds the threshold (``1.0``: any increase).

A ratio resting on one timing (one sample, one batch) never fails the gate: it cannot rank two cells.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports import PerfRow, Report


@dataclass(frozen=True)
class SpeedFinding:
    """A cell whose speed or memory ratio to the baseline's is beyond its threshold."""

    row: PerfRow
    what: str            # "TTFT", "decode tok/s", "peak KV bytes"
    ratio: float
    low: float
    high: float
    threshold: float

    def describe(self) -> str:
        r = self.row
        budget = "" if r.budget is None else f" N={r.budget}"
        ci = "exact" if self.low == self.high == self.ratio else f"95% CI {self.low:.3f}..{self.high:.3f}"
        side = "<" if self.what == "decode tok/s" else ">"
        return (f"{self.what} {r.policy}{budget} B={chunk_text(r.chunk)} {r.task} ({r.model}): × {self.ratio:.3f} of the "
                f"baseline ({ci}) {side} {self.threshold:g}")

    def to_json(self) -> dict[str, Any]:
        r = self.row
        return {"what": self.what, "model": r.model, "policy": r.policy, "budget": r.budget, "chunk": r.chunk,
                "task": r.task, "ratio": self.ratio, "ci_low": self.low, "ci_high": self.high,
                "threshold": self.threshold, "text": self.describe()}


def _entry(row: PerfRow, tracked: list[Any]) -> Any | None:
    return next((t for t in tracked if t.gates_speed and fnmatch.fnmatchcase(row.policy, t.policy)), None)


def _one_timing(row: PerfRow) -> bool:
    return "(1 sample)" in row.speed_note or "1 batch timing" in row.speed_note


def speed_gate(report: Report, tracked: list[Any]) -> tuple[int, list[SpeedFinding]]:
    """(ratios checked, findings) of a report against a baseline run."""
    checked, found = 0, []
    for r in report.perf:
        t = _entry(r, tracked)
        if t is None:
            continue
        if t.max_ttft_ratio is not None and r.ttft_ratio is not None and not _one_timing(r):
            checked += 1
            if r.ttft_ratio_low > t.max_ttft_ratio:
                found.append(SpeedFinding(r, "TTFT", r.ttft_ratio, r.ttft_ratio_low, r.ttft_ratio_high, t.max_ttft_ratio))
        if t.min_decode_ratio is not None and r.decode_ratio is not None and not _one_timing(r):
            checked += 1
            if r.decode_ratio_high < t.min_decode_ratio:
                found.append(SpeedFinding(r, "decode tok/s", r.decode_ratio, r.decode_ratio_low, r.decode_ratio_high,
                                          t.min_decode_ratio))
        if t.max_kv_bytes_ratio is not None and r.kv_bytes_ratio is not None:
            checked += 1
            if r.kv_bytes_ratio > t.max_kv_bytes_ratio:
                k = r.kv_bytes_ratio
                found.append(SpeedFinding(r, "peak KV bytes", k, k, k, t.max_kv_bytes_ratio))
    return checked, found
