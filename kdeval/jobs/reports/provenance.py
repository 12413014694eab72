"""Provenance of the compared cells: which code, libraries, device and host produced each one.

Every done cell's ``CellView.provenance`` (recorded by the worker: kdeval_version, source_hash, torch,
transformers, cuda, device, dtype, attn_implementation, host) becomes a :class:`ProvenanceRow`; cells
recorded before provenance existed get empty fields. When the cells a report compares ran on different
devices or different code (source hash), :func:`mismatch_warning` says so in one line: a delta or a speed
ratio between them mixes two setups.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from kdeval.jobs.reports.report_rows import ProvenanceRow
from kdeval.jobs.reports.samples import LoadedCell

#: The provenance keys a row carries (in this order).
PROVENANCE_KEYS = ("kdeval_version", "source_hash", "torch", "transformers", "cuda", "device", "dtype",
                   "attn_implementation", "host")
#: What makes two cells' setups "the same" in the HTML report's provenance section.
COMBINATION_KEYS = ("kdeval_version", "source_hash", "torch", "transformers", "cuda", "device", "dtype", "host")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def provenance_rows(cells: list[LoadedCell]) -> list[ProvenanceRow]:
    """One row per distinct done cell of ``cells`` (the first run listing it), in slot order."""
    seen: dict[str, LoadedCell] = {}
    for c in cells:
        if c.view.state == "done" and c.view.id not in seen:
            seen[c.view.id] = c
    rows = []
    for c in sorted(seen.values(), key=lambda c: (c.slot, c.run)):
        prov = c.view.provenance
        prov = prov if isinstance(prov, dict) else {}
        rows.append(ProvenanceRow(run=c.run, cell=c.view.id, model=c.slot.model, policy=c.slot.policy,
                                  budget=c.slot.budget, chunk=c.slot.chunk, task=c.slot.task,
                                  **{k: _text(prov.get(k)) for k in PROVENANCE_KEYS}))
    return rows


def code_version(row: ProvenanceRow) -> str:
    """The code a cell ran: its source hash (its release string where no hash was recorded)."""
    return row.source_hash or row.kdeval_version


def _spread(counts: Counter) -> str:
    """``4 cells cpu, 2 cuda:0`` (at most three values, most frequent first)."""
    items = counts.most_common()
    parts = [f"{n} cell{'s' if n != 1 else ''} {v}" if i == 0 else f"{n} {v}" for i, (v, n) in enumerate(items[:3])]
    return ", ".join(parts) + (f", {len(items) - 3} more" if len(items) > 3 else "")


def mismatch_warning(rows: list[ProvenanceRow]) -> str | None:
    """One line when the compared cells differ in device or code version (None when they agree, or when
    fewer than two values were recorded). Cells without provenance are not counted."""
    devices = Counter(r.device for r in rows if r.device)
    codes = Counter(code_version(r) for r in rows if code_version(r))
    parts = []
    if len(devices) > 1:
        parts.append(f"device ({_spread(devices)})")
    if len(codes) > 1:
        parts.append(f"code version ({_spread(codes)})")
    if not parts:
        return None
    return (f"the compared cells differ in {' and '.join(parts)}: deltas and ratios between them mix setups "
            f"(see provenance)")


def cell_label(row: ProvenanceRow) -> str:
    """``keydiff N=256 needle@1024#s0 (run r1)``."""
    policy = row.policy if row.budget is None else f"{row.policy} N={row.budget}"
    return f"{policy} {row.task} (run {row.run})"


def combinations(rows: list[ProvenanceRow]) -> list[tuple[dict[str, str], list[ProvenanceRow]]]:
    """The distinct setups (:data:`COMBINATION_KEYS` values) and the rows of each, most cells first."""
    groups: dict[tuple[str, ...], list[ProvenanceRow]] = {}
    for r in rows:
        groups.setdefault(tuple(getattr(r, k) for k in COMBINATION_KEYS), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [(dict(zip(COMBINATION_KEYS, key)), members) for key, members in ordered]
