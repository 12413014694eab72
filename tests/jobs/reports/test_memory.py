"""Memory in reports: "mem ×" is the ratio of peak KV-cache bytes (never of the process/GPU peak), the peak is
labelled by what it measures, old rows without KV bytes show "-", and the plot draws KV bytes per policy × task."""
from __future__ import annotations

import pytest
from rich.console import Console

from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render.plots import kv_memory_series, memory_figure, memory_vs_length
from kdeval.jobs.reports.render.terminal import memory_table
from kdeval.jobs.reports.render.views import memory_view
from tests.jobs.reports.helpers import FakeCell, rows, store_run

MIB = 2**20


def _mem(kv: list[int], peak: int, kind: str = "process_rss"):
    """Rows' memory columns: per-sample peak KV bytes, a process/GPU peak and its kind."""
    return lambda i: {"peak_kv_bytes": kv[i % len(kv)], "peak_memory_bytes": peak, "memory_kind": kind}


def _text(report) -> str:
    """The memory table as the terminal prints it."""
    console = Console(record=True, width=250)
    console.print(memory_table(report, console.width))
    return console.export_text()


def _cells(report, policy: str) -> dict[str, str]:
    """The printed cells of the memory table's row of ``policy``, by header."""
    view = memory_view(report)
    row = next(cells for cells, raw in zip(view.rows, view.raw) if raw.policy == policy)
    return dict(zip([c.header for c in view.columns], row))


def test_mem_ratio_is_peak_kv_bytes_not_process_peak(store):
    idx, res = store
    # full: KV peaks at 4 MiB (max over samples); keydiff holds 1 MiB, yet its process RSS is *higher*.
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1.0] * 3, extra=_mem([3 * MIB, 4 * MIB, 2 * MIB], 4_000_000_000))),
        FakeCell("keydiff", 256, rows=rows([1.0] * 3, extra=_mem([MIB], 5_000_000_000))),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    perf = {p.policy: p for p in rep.perf}
    kd, full = perf["keydiff"], perf["full"]
    assert (full.peak_kv_bytes, kd.peak_kv_bytes) == (4 * MIB, MIB)
    assert kd.kv_bytes_ratio == 0.25  # 1 MiB / 4 MiB, not 5e9 / 4e9
    assert kd.peak_memory_bytes == 5_000_000_000 and kd.memory_kind == "process_rss"
    assert full.kv_bytes_ratio is None  # the reference itself
    text = _text(rep)
    assert "process peak (RSS) GiB" in text and "mem ×" in text and "KV-cache MiB" in text
    kd, full_cells = _cells(rep, "keydiff"), _cells(rep, "full")
    assert kd["mem ×"] == "0.250" and kd["process peak (RSS) GiB"] == "4.66"  # 5e9 B in GiB, 3 digits
    assert kd["KV-cache MiB"] == "1.00" and full_cells["KV-cache MiB"] == "4.00"
    assert full_cells["mem ×"] == ""  # the reference has no ratio
    assert kd["prompt tokens"] == "1024" and kd["peak KV tokens"] == "256"  # token counts as integers


def test_gpu_peak_is_labelled_with_weights_and_mixed_kinds_per_value(store):
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=rows([1.0] * 2, extra=_mem([2 * MIB], 3 * 2**30, "cuda_max_allocated")),
                 summary={"score": 100.0, "model_weight_bytes": 2**30}),
        FakeCell("keydiff", 64, rows=rows([1.0] * 2, extra=_mem([MIB], 2**30, "cuda_max_allocated"))),
    ])
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    assert {p.policy: p.model_weight_bytes for p in rep.perf} == {"full": 2**30, "keydiff": None}
    assert "GPU peak incl. weights GiB" in _text(rep)
    store_run(idx, res, "r2", [
        FakeCell("full", None, chunk=32, rows=rows([1.0] * 2, extra=_mem([2 * MIB], 2**30, "cuda_max_allocated"))),
        FakeCell("keydiff", 64, chunk=32, rows=rows([1.0] * 2, extra=_mem([MIB], 2**30))),
    ], version="v2")
    rep2 = build_report(idx, ["r2"], ReportOptions(resamples=0))
    assert "process/GPU peak GiB" in _text(rep2)
    assert {c["process/GPU peak GiB"] for c in (_cells(rep2, "full"), _cells(rep2, "keydiff"))} == {
        "1.00 (GPU peak incl. weights)", "1.00 (process peak (RSS))"}


def _old_rows(scores: list[float]) -> list[dict]:
    """Rows as written before peak_kv_bytes and memory_kind existed."""
    out = rows(scores)
    for r in out:
        del r["peak_kv_bytes"], r["memory_kind"]
    return out


def test_old_rows_without_kv_bytes_show_dash_not_an_rss_ratio(store):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=_old_rows([1.0] * 3)),
                               FakeCell("keydiff", 256, rows=_old_rows([1.0] * 3)),
                               FakeCell("sink", 256, rows=rows([1.0] * 3))])  # new rows, old reference
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    perf = {p.policy: p for p in rep.perf}
    assert perf["keydiff"].peak_kv_bytes is None and perf["keydiff"].kv_bytes_ratio is None
    assert perf["keydiff"].peak_memory_bytes == 1000 and perf["keydiff"].memory_kind == ""
    assert perf["sink"].peak_kv_bytes == 256 * 1024 and perf["sink"].kv_bytes_ratio is None
    assert "process/GPU peak MiB" in _text(rep)  # an unknown kind beside process_rss: each value says its own
    assert _cells(rep, "keydiff")["process/GPU peak MiB"] == "0.000954 (peak memory)"  # 1000 B
    assert _cells(rep, "keydiff")["mem ×"] == "-" and _cells(rep, "sink")["mem ×"] == "-"


def test_kv_bytes_fall_back_to_the_cell_summary(store):
    idx, res = store
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=_old_rows([1.0] * 2), summary={"score": 1.0, "max_peak_kv_bytes": 8 * MIB}),
        FakeCell("keydiff", 128, rows=_old_rows([1.0] * 2), summary={"score": 1.0, "max_peak_kv_bytes": 2 * MIB}),
    ])
    kd = next(p for p in build_report(idx, ["r1"], ReportOptions(resamples=0)).perf if p.policy == "keydiff")
    assert kd.peak_kv_bytes == 2 * MIB and kd.kv_bytes_ratio == 0.25


def test_memory_plot_one_line_per_policy_and_task_from_zero(store):
    idx, res = store
    cells = []
    for length, kv_full in ((1024, 4 * MIB), (2048, 8 * MIB)):
        cells += [FakeCell("full", None, length=length, rows=rows([1.0] * 2, length=length, extra=_mem([kv_full], 1))),
                  FakeCell("keydiff", 256, length=length, rows=rows([1.0] * 2, length=length, extra=_mem([MIB], 1)))]
    cells += [FakeCell("keydiff", 256, task="ruler.vt", length=4096,
                       rows=rows([1.0] * 2, task="ruler.vt", length=4096, extra=_mem([MIB], 1))),
              FakeCell("sink", 256, rows=_old_rows([1.0] * 2))]  # no KV bytes: not drawn
    store_run(idx, res, "r1", cells)
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    series = kv_memory_series(rep)
    assert series == {("m", 64): {
        "full · needle": [(1024.0, 4.0), (2048.0, 8.0)],
        "keydiff N=256 · needle": [(1024.0, 1.0), (2048.0, 1.0)],
        "keydiff N=256 · ruler.vt": [(4096.0, 1.0)],  # another task: its own line, not joined to needle's
    }}
    fig = memory_figure("t", series[("m", 64)])
    [ax] = fig.axes
    assert ax.get_ylim()[0] == 0 and ax.get_xlim()[0] == 0 and len(ax.get_lines()) == 3
    assert "KV-cache MiB" in ax.get_ylabel()
    [plot] = memory_vs_length(rep)
    assert plot.kind == "memory_vs_length" and plot.png.startswith(b"\x89PNG")


@pytest.mark.parametrize("policy", ["full", "keydiff"])
def test_no_memory_plot_without_kv_bytes(store, policy):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell(policy, None if policy == "full" else 64, rows=_old_rows([1.0]))])
    assert memory_vs_length(build_report(idx, ["r1"], ReportOptions(resamples=0))) == []


def test_a_grouped_cell_never_shows_its_groups_process_peak(store):
    """Rows computed with shared steps carry no process peak; the cell's index record is then its group's peak
    (1000 B here), which the report must not show as the cell's; a cell run alone still falls back to it."""
    idx, res = store
    shared = [{**r, "peak_memory_bytes": None, "execution": "shared"} for r in rows([1.0] * 3)]
    alone = [{**r, "peak_memory_bytes": None} for r in rows([1.0] * 3)]
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 3)),
                               FakeCell("keydiff", 256, rows=shared, summary={"score": 1.0, "shared_rows": 3}),
                               FakeCell("sink", 256, rows=alone)])
    perf = {p.policy: p for p in build_report(idx, ["r1"], ReportOptions(resamples=0)).perf}
    assert perf["keydiff"].peak_memory_bytes is None
    assert perf["sink"].peak_memory_bytes == 1000
