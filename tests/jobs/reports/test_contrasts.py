"""Cost of chunking (chunked − one-shot) and query dependence (query-aware − query-agnostic): rows paired by
sample with their CIs and both sides' KV bytes and TTFT, in JSON, Markdown, the terminal and the HTML page."""
from __future__ import annotations

import json

import pytest
from rich.console import Console

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.formats import from_json, to_json, to_markdown
from kdeval.jobs.reports.render.terminal import contrast_tables, scores_table
from tests.jobs.reports.helpers import FakeCell, rows, store_run

CTX = {"compress": "context", "decode": "evict"}


def perf(kv: int, ttft: float):
    return lambda i: {"peak_kv_bytes": kv, "ttft_s": ttft + i * 0.01}


@pytest.fixture
def report(store):
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1, 1, 1, 1])),
        FakeCell("full", None, chunk=0, rows=rows([1, 1, 1, 1])),
        FakeCell("keydiff", 128, rows=rows([1, 0, 1, 1], extra=perf(2**20, 0.5))),
        FakeCell("keydiff", 128, chunk=0, rows=rows([1, 1, 1, 1], extra=perf(2**22, 0.25))),
        FakeCell("keydiff", 128, protocol=CTX, rows=rows([0, 0, 1, 1, 1], extra=perf(2**20, 0.4))),
        FakeCell("snapkv", 128, rows=rows([1, 1, 1, 1])),  # no one-shot, no query-agnostic cell: no rows
    ])
    return build_report(idx, ["r1"], ReportOptions(resamples=200))


def test_cost_of_chunking_rows(report):
    by = {(r.policy, r.a_label): r for r in report.cost_of_chunking}
    assert set(by) == {("full", "B=64"), ("keydiff", "B=64")}
    r = by[("keydiff", "B=64")]
    assert (r.budget, r.task, r.setting, r.b_label, r.n_paired, r.n_dropped) == (128, "needle", "query-aware",
                                                                                   "whole", 4, 0)
    assert (r.a_value, r.b_value, r.delta) == (75.0, 100.0, -25.0)
    assert r.ci_low <= -25.0 <= r.ci_high <= 0.0
    assert (r.a_kv_bytes, r.b_kv_bytes) == (2**20, 2**22)
    assert r.a_ttft_s == pytest.approx(0.515) and r.b_ttft_s == pytest.approx(0.265)
    assert by[("full", "B=64")].delta == 0.0
    # full holds no budget: no protocol changes it, and its row does not claim the default one
    assert by[("full", "B=64")].setting == "nothing evicted (any protocol)"


def test_query_dependence_rows(report):
    [r] = report.query_dependence
    assert (r.policy, r.budget, r.setting, r.a_label, r.b_label) == ("keydiff", 128, "B=64", "query-aware",
                                                                      "query-agnostic")
    # s0..s3 pair; the agnostic cell's s4 has no query-aware twin
    assert (r.n_paired, r.n_dropped, r.a_value, r.b_value, r.delta) == (4, 1, 75.0, 50.0, 25.0)
    assert r.note == "1 unpaired sample(s) left out"


def test_protocols_stay_apart_in_the_scores(report):
    labels = {(s.policy, s.chunk) for s in report.scores}
    assert {("keydiff", 64), ("keydiff", 0), ("keydiff [query-agnostic]", 64)} <= labels


def test_json_blocks_round_trip_and_markdown_sections(report):
    data = json.loads(to_json(report))
    assert [r["delta"] for r in data["cost_of_chunking"] if r["policy"] == "keydiff"] == [-25.0]
    assert data["query_dependence"][0]["b_label"] == "query-agnostic"
    assert from_json(to_json(report)) == report
    md = to_markdown(report)
    assert "## Cost of chunking" in md and "## Query dependence" in md
    assert "| keydiff | 128 | needle | query-aware | B=64 vs whole | 4 | 75.00 | 100.00 | -25.00 [" in md


def test_terminal_tables(report):
    console = Console(width=200, record=True)
    for t in contrast_tables(report, 200):
        console.print(t)
    console.print(scores_table(report, 200))
    out = console.export_text()
    assert "cost of chunking: Δ = chunked − one-shot" in out and "query dependence: Δ = query-aware − query-agnostic" in out
    assert "B=64 vs whole" in out and "query-aware vs query-agnostic" in out and "whole" in out


def test_a_run_without_both_sides_has_no_contrast(store):
    idx, res = store
    store_run(idx, res, "r2", [FakeCell("full", None, rows=rows([1, 1])), FakeCell("keydiff", 64, rows=rows([1, 0]))])
    rep = build_report(idx, ["r2"], ReportOptions(resamples=50))
    assert rep.cost_of_chunking == [] and rep.query_dependence == []
    assert contrast_tables(rep, 120) == [] and "Cost of chunking" not in to_markdown(rep)
