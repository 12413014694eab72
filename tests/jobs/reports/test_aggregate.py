"""Aggregation on synthetic stored results with known answers: deltas, CIs, pairing, states, headlines."""
from __future__ import annotations

import numpy as np
import pytest

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.stats import paired_bootstrap
from tests.jobs.reports.helpers import FakeCell, rows, store_run


def _row(report, policy, metric="needle", level="task", **slice_):
    found = [r for r in report.scores if r.policy == policy and r.metric == metric and r.level == level
             and all(getattr(r, k) == v for k, v in slice_.items())]
    assert len(found) == 1, found
    return found[0]


def test_constant_difference_gives_exact_delta_and_degenerate_ci(store):
    idx, res = store
    base = [0.2, 0.5, 0.3, 0.9, 0.0, 0.4]
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows(base)),
                               FakeCell("keydiff", 256, rows=rows([b + 0.01 for b in base]))])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=500, seed=3))
    r = _row(rep, "keydiff")
    assert r.delta == pytest.approx(1.0) and r.ci_low == pytest.approx(1.0) and r.ci_high == pytest.approx(1.0)
    assert (r.n, r.n_paired, r.n_dropped, r.state, r.ref_state) == (6, 6, 0, "ok", "ok")
    # unrounded: the row holds the mean itself (the outputs round when they print)
    assert r.value == pytest.approx(100 * np.mean(base) + 1, abs=1e-9)
    assert r.ref_value == pytest.approx(100 * np.mean(base), abs=1e-9) and r.ref_value != round(r.ref_value, 2)
    full = _row(rep, "full")
    assert full.delta is None and full.ref_state == "reference"


def test_pairing_drops_unmatched_samples_and_says_so(store):
    idx, res = store
    full_ids = [f"s{i}" for i in range(10)]
    kd_ids = [f"s{i}" for i in range(8)] + ["x0", "x1"]
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([0.0] * 10, ids=full_ids)),
                               FakeCell("keydiff", 256, rows=rows([1.0] * 8 + [0.0, 0.0], ids=kd_ids))])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=200))
    r = _row(rep, "keydiff")
    assert (r.n, r.n_paired, r.n_dropped) == (10, 8, 4)
    assert r.delta == pytest.approx(100.0)  # the unpaired zeros are not in the delta
    assert "4 unpaired" in r.note
    assert any("left out 4 sample" in n for n in rep.meta.notes)


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(0)
    d = rng.normal(2.0, 5.0, size=200)
    a = paired_bootstrap(d, resamples=1000, seed=1)
    b = paired_bootstrap(d, resamples=1000, seed=1)
    c = paired_bootstrap(d, resamples=1000, seed=2)
    assert a == b and a != c
    assert a.low < a.estimate < a.high and a.estimate == pytest.approx(d.mean())
    se = d.std(ddof=1) / np.sqrt(d.size)  # normal approximation: half-width ~ 1.96 se
    assert (a.high - a.low) / 2 == pytest.approx(1.96 * se, rel=0.15)
    z = paired_bootstrap(d, resamples=0)
    assert z.low == z.high == z.estimate


def test_stratified_benchmark_average_is_mean_of_task_means(store):
    idx, res = store
    vt = rows([1.0, 0.0, 1.0, 0.0], task="ruler.vt", length=4096)          # 50
    cwe = rows([1.0, 1.0], task="ruler.cwe", length=4096)                  # 100
    vt_kd = rows([0.0, 0.0, 1.0, 0.0], task="ruler.vt", length=4096)       # 25
    cwe_kd = rows([1.0, 1.0], task="ruler.cwe", length=4096)               # 100
    store_run(idx, res, "r1", [
        FakeCell("full", None, task="ruler.vt", length=4096, rows=vt),
        FakeCell("full", None, task="ruler.cwe", length=4096, rows=cwe),
        FakeCell("keydiff", 128, task="ruler.vt", length=4096, rows=vt_kd),
        FakeCell("keydiff", 128, task="ruler.cwe", length=4096, rows=cwe_kd),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=300))
    avg = _row(rep, "full", "ruler.avg", "benchmark")
    assert avg.value == pytest.approx(75.0)  # not the pooled 66.67
    kd = _row(rep, "keydiff", "ruler.avg", "benchmark")
    assert kd.value == pytest.approx(62.5) and kd.delta == pytest.approx(-12.5)
    # one length: its slice would only repeat the average (and each task's score), so there is none
    assert not [r for r in rep.scores if r.level == "detail"]
    # the task score is the evals package's own headline number
    from kdeval.evals.benchmarks.registry import get_scorer
    assert _row(rep, "full", "ruler.vt").value == get_scorer("ruler.vt").aggregate(vt)["score"]


def test_needle_grid_math_levels_and_longbench_buckets(store):
    idx, res = store
    needle = rows([1, 0, 1, 1], depths=[25.0, 75.0])
    math = rows([1, 0, 1, 1], task="math500", length=None, extra=lambda i: {"meta_json": f'{{"level": {1 + i % 2}}}'})
    lb = rows([1, 0, 0.5], task="longbench.hotpotqa", length=None,
              extra=lambda i: {"length": [1000, 5000, 9000][i]})
    store_run(idx, res, "r1", [FakeCell("full", None, rows=needle),
                               FakeCell("full", None, task="math500", length=None, rows=math),
                               FakeCell("full", None, task="longbench.hotpotqa", length=None, rows=lb)])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    assert _row(rep, "full", "needle", "detail", length=1024, depth=25.0).value == 100.0
    assert _row(rep, "full", "needle", "detail", length=1024, depth=75.0).value == 50.0
    assert _row(rep, "full", "math500", "detail", subset="level 1").value == 100.0
    assert _row(rep, "full", "math500", "detail", subset="level 2").value == 50.0
    assert _row(rep, "full", "longbench.hotpotqa", "detail", subset="8k+").value == 50.0
    assert _row(rep, "full", "longbench.hotpotqa").value == 50.0
    assert not [r for r in rep.scores if r.metric == "longbench.avg"]  # the average of one task is that task


def test_aggregates_that_equal_a_single_task_are_not_repeated(store):
    """One RULER task at one length: one row, not four (task, ruler.avg, ruler.avg @L, task @L); slices
    and averages appear once they differ from what they summarise."""
    idx, res = store
    one = rows([1.0, 0.0], task="ruler.vt", length=1024)
    store_run(idx, res, "r1", [FakeCell("full", None, task="ruler.vt", length=1024, rows=one)])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    assert [(r.level, r.metric, r.length) for r in rep.scores] == [("task", "ruler.vt", None)]
    two = [FakeCell("full", None, task=t, length=n, rows=rows([1.0, 0.0], task=t, length=n))
           for t in ("ruler.vt", "ruler.cwe") for n in (1024, 2048)]
    store_run(idx, res, "r2", two, version="v2")
    rep = build_report(idx, ["r2"], ReportOptions(resamples=0))
    got = sorted((r.level, r.metric, r.length) for r in rep.scores)
    assert got == sorted([("task", "ruler.cwe", None), ("task", "ruler.vt", None), ("benchmark", "ruler.avg", None)]
                         + [("detail", m, n) for m in ("ruler.cwe", "ruler.vt", "ruler.avg") for n in (1024, 2048)])


def test_failed_and_missing_cells_are_shown_not_dropped(store):
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1.0] * 3)),
        FakeCell("keydiff", 256, rows=None, error="Traceback ...\nRuntimeError: CUDA out of memory"),
        FakeCell("sink", 256, task="phonebook", length=512, rows=rows([1.0] * 3, task="phonebook", length=512)),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=100))
    kd = _row(rep, "keydiff")
    assert kd.state == "failed" and kd.value is None and kd.delta is None
    sink = _row(rep, "sink", "phonebook")
    assert sink.state == "ok" and sink.ref_state == "missing" and sink.delta is None
    states = {(c.policy, c.state) for c in rep.cells}
    assert states == {("keydiff", "failed"), ("full", "missing")}
    assert next(c for c in rep.cells if c.policy == "keydiff").error == "RuntimeError: CUDA out of memory"
    assert rep.n_incomplete_cells == 2
    perf = {p.policy: p for p in rep.perf}
    assert perf["keydiff"].state == "failed" and perf["sink"].kv_bytes_ratio is None


def test_compare_two_runs_pairs_the_same_slots(store):
    idx, res = store
    before = [0.8] * 5 + [0.6] * 5
    store_run(idx, res, "before", [FakeCell("full", None, rows=rows([1.0] * 10)),
                                   FakeCell("keydiff", 256, rows=rows(before)),
                                   FakeCell("sink", 256, rows=rows(before))], version="v1")
    store_run(idx, res, "after", [FakeCell("full", None, rows=rows([1.0] * 10)),
                                  FakeCell("keydiff", 256, rows=rows([b - 0.05 for b in before]))], version="v2")
    rep = build_report(idx, ["after"], ReportOptions(compare="before", resamples=200))
    assert rep.meta.compare == "before"
    kd = _row(rep, "keydiff")
    assert kd.delta == pytest.approx(-5.0) and kd.ci_low == pytest.approx(-5.0) and kd.ci_high == pytest.approx(-5.0)
    assert _row(rep, "full").delta == pytest.approx(0.0)
    sink = _row(rep, "sink")
    assert sink.state == "missing" and sink.ref_state == "ok"
    assert [(c.policy, c.state) for c in rep.cells] == [("sink", "missing")]
    perf = {p.policy: p for p in rep.perf}
    assert perf["keydiff"].ttft_ratio == 1.0 and perf["keydiff"].decode_tok_s == 5.0


def test_unreadable_reference_cell_shows_as_failed_not_done(store):
    idx, res = store
    base = [1.0] * 4
    store_run(idx, res, "before", [FakeCell("full", None, rows=rows(base)),
                                   FakeCell("keydiff", 256, rows=rows(base))], version="v1")
    store_run(idx, res, "after", [FakeCell("full", None, rows=rows(base)),
                                  FakeCell("keydiff", 256, rows=rows(base))], version="v2")
    lost = idx.get_cell(FakeCell("keydiff", 256).cell_id("v1"))
    assert lost.state == "done"
    (res / lost.result_path).unlink()
    rep = build_report(idx, ["after"], ReportOptions(compare="before", resamples=50))
    assert [(c.run, c.policy, c.state) for c in rep.cells] == [("before", "keydiff", "failed")]
    assert "result file unreadable" in rep.cells[0].error
    assert _row(rep, "keydiff").ref_state == "failed"


def test_unknown_run_is_bad_input(store):
    idx, _ = store
    with pytest.raises(ValueError, match="no run 'nope'"):
        build_report(idx, ["nope"])


def test_moved_results_dir_is_read_with_results_dir_else_shown_as_unreadable(store, tmp_path):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 3)),
                               FakeCell("keydiff", 64, rows=rows([0.0] * 3))])
    moved = tmp_path / "moved"
    res.rename(moved)
    rep = build_report(idx, ["r1"], ReportOptions(resamples=50))
    assert {(c.policy, c.state) for c in rep.cells} == {("full", "failed"), ("keydiff", "failed")}
    assert all("result file unreadable" in c.error for c in rep.cells)
    ok = build_report(idx, ["r1"], ReportOptions(resamples=50, results_dir=moved))
    assert ok.cells == [] and _row(ok, "keydiff").delta == pytest.approx(-100.0)
