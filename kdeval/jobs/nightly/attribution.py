"""What a failing night's gate blames: the cells that drive each regression, and what changed since the baseline.

For a regressed score (this night − baseline, paired by sample), each cell's contribution is its share of
that delta: the sum of its samples' paired differences over the samples behind the score (a benchmark
average weighs each task the same, so a cell's share is divided by the number of tasks). Contributions add
up to the delta; the most negative come first. The differences are those of the two nights' environments
(as ``kdeval nightly`` recorded them), of the provenance their cells recorded on the workers, of the grid
and of the data digests.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from kdeval.evals.task_run.chunking import chunk_text
from kdeval.jobs.reports import MetricRow
from kdeval.jobs.reports.samples import LoadedCell, benchmark_of

#: Provenance facts compared between the baseline's cells and tonight's (as the workers recorded them).
PROVENANCE_KEYS = ("kdeval_version", "source_hash", "torch", "transformers", "cuda", "device", "dtype",
                   "attn_implementation")
#: Night facts compared between the two nights' history entries.
NIGHT_KEYS = ("kdeval_version", "source_hash", "git_commit", "torch", "transformers", "cuda", "driver", "device",
              "python")


@dataclass(frozen=True)
class Contribution:
    """One cell's share of a regressed score's delta (points)."""

    model: str
    policy: str
    budget: Any
    chunk: int
    task: str          # task instance label, e.g. ``needle@256#s0``
    n: int             # paired samples of this cell
    points: float      # its contribution to the delta (negative: it pulls the score down)

    def describe(self) -> str:
        budget = "" if self.budget is None else f" N={self.budget}"
        return f"{self.policy}{budget} B={chunk_text(self.chunk)} {self.task} ({self.model}): {self.points:+.2f} points over {self.n} samples"


def _cells_of(row: MetricRow, cells: list[LoadedCell]) -> list[LoadedCell]:
    """The done cells behind ``row`` (its configuration; its task, or its benchmark's tasks; its length)."""
    out = []
    for c in cells:
        s = c.slot
        if c.samples is None or (s.model, s.policy, s.budget, s.chunk) != (row.model, row.policy, row.budget, row.chunk):
            continue
        if row.level == "benchmark" and benchmark_of(c.task) != row.benchmark:
            continue
        if row.level != "benchmark" and c.task != row.metric:
            continue
        if row.length is not None and f"@{row.length}" not in s.task:
            continue
        out.append(c)
    return out


def contributions(row: MetricRow, tonight: list[LoadedCell], baseline: list[LoadedCell]) -> list[Contribution]:
    """Each cell's share of ``row.delta``, most negative first (cells paired with the baseline by slot)."""
    ref = {c.slot: c for c in baseline if c.samples is not None}
    diffs: dict[Any, tuple[LoadedCell, np.ndarray]] = {}
    for c in _cells_of(row, tonight):
        r = ref.get(c.slot)
        if r is None:
            continue
        ref_score = dict(zip(r.samples.key, r.samples.score))
        d = np.array([s - ref_score[k] for k, s in zip(c.samples.key, c.samples.score) if k in ref_score])
        diffs[c.slot] = (c, d)
    per_task: dict[str, int] = defaultdict(int)
    for c, d in diffs.values():
        per_task[c.task] += d.size
    tasks = len(per_task) if row.level == "benchmark" else 1
    total = sum(per_task.values())
    out = []
    for c, d in diffs.values():
        n = per_task[c.task] if row.level == "benchmark" else total
        if n == 0:
            continue
        s = c.slot
        out.append(Contribution(s.model, s.policy, s.budget, s.chunk, s.task, int(d.size),
                                float(100.0 * d.sum() / n / tasks)))
    return sorted(out, key=lambda x: (x.points, x.task))


def _values(cells: list[LoadedCell], key: str) -> str:
    vals = sorted({str((c.view.provenance or {}).get(key)) for c in cells if c.view.provenance})
    return ", ".join(vals)


def night_changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, str | None, Any, Any]]:
    """What differs between two nights' history entries, as ``(kind, key, before, after)`` in this order:
    ``("env", fact, ...)`` per :data:`NIGHT_KEYS` fact, ``("grid", None, ...)`` for the grid hash, ``("data",
    task, ...)`` per task's data digest."""
    a, b = before.get("env") or {}, after.get("env") or {}
    out: list[tuple[str, str | None, Any, Any]] = [("env", k, a.get(k), b.get(k)) for k in NIGHT_KEYS
                                                   if a.get(k) != b.get(k)]
    if before.get("grid_hash") != after.get("grid_hash"):
        out.append(("grid", None, before.get("grid_hash"), after.get("grid_hash")))
    da, db = before.get("data") or {}, after.get("data") or {}
    out += [("data", t, da.get(t), db.get(t)) for t in sorted(set(da) | set(db)) if da.get(t) != db.get(t)]
    return out


def differences(base_entry: dict[str, Any] | None, night_entry: dict[str, Any], tonight: list[LoadedCell],
                baseline: list[LoadedCell]) -> list[dict[str, str]]:
    """What differs between the baseline night and this one: ``{"what", "baseline", "tonight"}`` each (the
    night facts only where the baseline recorded its environment)."""
    night = night_changes(base_entry, night_entry) if base_entry is not None else []
    what = {"env": "night {}", "grid": "grid hash", "data": "data {}"}
    rows = {kind: [{"what": what[kind].format(key), "baseline": str(a), "tonight": str(b)}
                   for k, key, a, b in night if k == kind] for kind in what}
    out = rows["env"] if (base_entry or {}).get("env") else []
    for k in PROVENANCE_KEYS:
        a, b = _values(baseline, k), _values(tonight, k)
        if a and b and a != b:
            out.append({"what": f"cells' {k}", "baseline": a, "tonight": b})
    return out + rows["grid"] + rows["data"]


def attribute(findings: list[Any], tonight: list[LoadedCell], baseline: list[LoadedCell],
              base_entry: dict[str, Any] | None, night_entry: dict[str, Any], top: int = 5) -> dict[str, Any]:
    """The attribution of a failing gate (JSON-able): per regressed score its delta, CI and driving cells,
    and the environment, code, grid and data differences between the two nights."""
    regressions = []
    for f in findings:
        r = f.row
        cells = contributions(r, tonight, baseline)
        regressions.append({"text": f.describe(), "metric": r.metric, "policy": r.policy, "budget": r.budget,
                            "chunk": r.chunk, "model": r.model, "delta": r.delta, "ci_low": r.ci_low,
                            "ci_high": r.ci_high, "max_drop": f.max_drop,
                            "cells": [dict(vars(c), text=c.describe()) for c in cells[:top]]})
    return {"regressions": regressions, "changes": differences(base_entry, night_entry, tonight, baseline)}


def attribution_text(attribution: dict[str, Any]) -> str:
    """Markdown lines of :func:`attribute`'s result (the report's and the terminal's)."""
    lines = ["## Attribution", ""]
    for r in attribution["regressions"]:
        lines.append(f"- **{r['text']}**")
        lines += [f"  - {c['text']}" for c in r["cells"]]
    changes = attribution["changes"]
    lines += ["", "Changed since the baseline night:" if changes else "Nothing recorded changed since the baseline night."]
    lines += [f"- {c['what']}: {c['baseline']} → {c['tonight']}" for c in changes]
    return "\n".join(lines) + "\n"


def attribution_notes(attribution: dict[str, Any]) -> list[str]:
    """:func:`attribute`'s result as plain report notes (one line each; every report format prints them)."""
    notes = []
    for r in attribution["regressions"]:
        notes.append(f"regression: {r['text']}")
        notes += [f"driven by: {c['text']}" for c in r["cells"]]
    notes += [f"changed since the baseline night: {c['what']}: {c['baseline']} → {c['tonight']}"
              for c in attribution["changes"]]
    return notes or ["no tracked score regressed and nothing recorded changed since the baseline night"]

