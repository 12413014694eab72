"""Accuracy per KV byte (kdeval/jobs/reports/frontier.py): on a hand-built run, the frontier, the dominated
configurations and each frontier point's margin over the next best within its bytes are the ones worked out by
hand; the HTML draws them, JSON carries them, and a run without a quantized store has no frontier."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.formats import from_json, to_json, to_markdown
from kdeval.jobs.reports.render.output import write_report
from tests.jobs.reports.helpers import FakeCell, rows, store_run

KIVI4 = {"bits": 4, "group_size": 32, "window": 128, "scheme": "kivi"}
KIVI2 = dict(KIVI4, bits=2)


@dataclass
class QuantCell(FakeCell):
    kv_quant: dict[str, Any] | None = None

    def spec(self, version: str) -> dict[str, Any]:
        spec = super().spec(version)
        return spec if self.kv_quant is None else {**spec, "kv_quant": self.kv_quant}


def cell(policy, budget, scores, kib, quant=None, **kw):
    extra = lambda i: {"peak_kv_bytes": kib * 1024}  # noqa: E731
    return QuantCell(policy, budget, rows=rows(scores, extra=extra), kv_quant=quant, **kw)


def test_frontier_dominated_and_margins_by_hand(store, tmp_path):
    idx, res = store
    cells = [
        cell("full", None, [1, 1, 1, 1], 1000),                 # 100 points at 1000 KiB: dominated by full 4-bit
        cell("full", None, [1, 1, 1, 1], 300, KIVI4),           # 100 at 300: frontier, next best within: keydiff 256
        cell("keydiff", 256, [1, 0, 1, 0], 256),                # 50 at 256: frontier, next within: snapkv 2-bit
        cell("keydiff", 256, [1, 0, 0, 0], 260, KIVI4),         # 25 at 260: dominated (snapkv 2-bit, keydiff 256)
        cell("snapkv", 256, [0, 0, 1, 0], 80, KIVI2),           # 25 at 80: frontier, fewest bytes
        cell("snapkv", 512, [1, 0, 1, 0], 400),                 # 50 at 400: dominated (keydiff 256, full 4-bit)
    ]
    store_run(idx, res, "r1", cells)
    report = build_report(idx, ["r1"], ReportOptions(resamples=200))
    by = {r.config: r for r in report.kv_frontier}
    full4, key, key4 = "full [kivi-4b-g32-w128] B=64", "keydiff N=256 B=64", "keydiff [kivi-4b-g32-w128] N=256 B=64"
    snap2, snap512 = "snapkv [kivi-2b-g32-w128] N=256 B=64", "snapkv N=512 B=64"
    assert [r.config for r in report.kv_frontier] == [snap2, key, key4, full4, snap512, "full B=64"]  # by bytes
    assert {c for c, r in by.items() if r.position == "frontier"} == {snap2, key, full4}
    assert by["full B=64"].dominated_by == full4
    assert by[snap512].dominated_by == key  # the dominating configuration with the fewest bytes (50 at 256)
    assert by[key4].dominated_by == snap2  # 25 points at 80 KiB (and keydiff 256: 50 at 256)
    assert by[snap2].note == "fewest bytes" and by[snap2].runner_up == ""
    assert by[key].runner_up == snap2 and by[key].delta == 25.0  # per sample: +1, 0, 0, 0 -> mean +25 points
    assert by[full4].runner_up == key and by[full4].delta == 50.0 and by[full4].n_paired == 4  # 0, +1, 0, +1
    assert by[full4].ci_low <= 50.0 <= by[full4].ci_high
    assert by[full4].kv_bits == 4 and by[snap2].kv_bits == 2 and by[key].kv_bits is None
    assert by[full4].kv_bytes == 300 * 1024 and by[full4].value == 100.0
    assert from_json(to_json(report)).kv_frontier == report.kv_frontier
    assert "## Accuracy per KV byte" in to_markdown(report)
    page = write_report(report, tmp_path / "out", ["html"])["html"].read_text(encoding="utf-8")
    section = page[page.index('<h2 id="kv_frontier">'):]
    assert section.index("<img") < section.index('data-table="kv_frontier"')
    assert (tmp_path / "out" / "plots" / "kv_frontier-m-needle.png").stat().st_size > 1000


def test_no_quantized_cell_no_frontier(store):
    idx, res = store
    store_run(idx, res, "r1", [cell("full", None, [1, 1], 1000), cell("keydiff", 256, [1, 0], 256)])
    report = build_report(idx, ["r1"], ReportOptions(resamples=50))
    assert report.kv_frontier == [] and "Accuracy per KV byte" not in to_markdown(report)


def test_cells_not_done_are_pending_or_failed(store):
    idx, res = store
    store_run(idx, res, "r1", [cell("full", None, [1, 1], 1000), cell("full", None, [1, 1], 300, KIVI4),
                               QuantCell("keydiff", 256, pending=True, kv_quant=KIVI4),
                               QuantCell("snapkv", 256, error="boom", kv_quant=KIVI4)])
    by = {r.policy: r for r in build_report(idx, ["r1"], ReportOptions(resamples=50)).kv_frontier}
    assert by["keydiff [kivi-4b-g32-w128]"].state == "pending" and by["snapkv [kivi-4b-g32-w128]"].state == "failed"
    assert by["keydiff [kivi-4b-g32-w128]"].position == "" and by["full"].dominated_by == "full [kivi-4b-g32-w128] B=64"
