"""Reading a report: one formatter for every output (known answers), the few-samples mark, and terminal
tables that fit 80 to 150 columns without cutting a name, an id or a number."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.report_rows import stored
from kdeval.jobs.reports.render import formats, units
from kdeval.jobs.reports.render.html import render_html
from kdeval.jobs.reports.render.layout import Column, TableView, fit_widths, pack, render
from kdeval.jobs.reports.render.terminal import memory_table, scores_table, speed_table
from kdeval.jobs.reports.render.views import headline_views, memory_view, scores_view, speed_view
from tests.jobs.reports.helpers import FakeCell, rows, store_run

GIB, MIB = 2**30, 2**20


def test_units_known_answers():
    assert units.text(3.236149, "ttft_median_s") == "3.24" and units.text(3.24, "ttft_median_s") == "3.24"
    assert units.text(22.66, "decode_tok_s") == "22.7" and units.text(0.06251, "kv_bytes_ratio") == "0.0625"
    assert units.text(1234.5, "decode_tok_s") == "1234" and units.text(1234.0, "decode_tok_s") == "1234"
    assert units.text(1008.0, "prompt_tokens") == "1008" and units.text(1008, "prompt_tokens") == "1008"
    assert units.text(66.6666, "value") == "66.67" and units.text(-100.0, "delta") == "-100.00"
    # rows keep every digit (JSON and CSV carry them); numpy integers become ints
    assert stored(66.66666) == 66.66666 and stored(np.int64(1008)) == 1008
    assert type(stored(np.int64(1008))) is int and type(stored(np.float32(0.5))) is float
    assert units.points(1.5, signed=True) == "+1.50" and units.points(0.0, signed=True) == "0.00"
    assert units.bytes_unit([3 * MIB, None]) == ("MiB", MIB) and units.bytes_unit([5_000_000_000]) == ("GiB", GIB)
    assert units.text(45 * MIB, "peak_kv_bytes") == "45.0" and units.text(5_000_000_000, "peak_memory_bytes", GIB) == "4.66"
    assert stored(float("nan")) is None and units.text(None, "value") == ""
    assert units.interval(-100.0, -50.0, "ci_low", 2) == "[-100.00, -50.00]†"
    assert units.interval(-1.0, 2.0, "ci_low", 10) == "[-1.00, 2.00]" and units.interval(None, 1.0, "ci_low") == ""


@pytest.fixture
def report(store):
    """keydiff and a long-named snapkv against full on needle (2 samples) and ruler.niah_multikey_3 (12)."""
    idx, res = store
    needle = lambda s: rows(s, depths=[25.0, 75.0], extra=lambda i: {"ttft_s": 0.5 + 0.1 * i})  # noqa: E731
    ruler = lambda s: rows(s, task="ruler.niah_multikey_3", length=2048,  # noqa: E731
                           extra=lambda i: {"peak_memory_bytes": 3 * GIB, "peak_kv_bytes": (1 + i) * MIB})
    store_run(idx, res, "20261130-080642-5dfd91", [
        FakeCell("full", None, rows=needle([1, 1])),
        FakeCell("keydiff", 256, rows=needle([0, 1])),
        FakeCell("snapkv", 256, params={"window": 32, "kernel": 7}, rows=needle([0, 0])),
        FakeCell("full", None, task="ruler.niah_multikey_3", length=2048, rows=ruler([1] * 12)),
        FakeCell("keydiff", 256, task="ruler.niah_multikey_3", length=2048, rows=ruler([1] * 6 + [0] * 6)),
        FakeCell("snapkv", 256, params={"window": 32, "kernel": 7}, task="ruler.niah_multikey_3", length=2048,
                 rows=None, error="RuntimeError: " + "a long error message that must be read in full " * 3),
    ])
    return build_report(idx, ["20261130"], ReportOptions(resamples=200, seed=0))


def test_one_formatter_prints_the_same_text_in_terminal_markdown_and_html(report):
    kd = next(r for r in report.scores if r.policy == "keydiff" and r.metric == "ruler.niah_multikey_3")
    assert (kd.value, kd.n_paired) == (50.0, 12)
    console = Console(record=True, width=200)
    console.print(scores_table(report, console.width))
    terminal, md, page = console.export_text(), formats.to_markdown(report), render_html(report, [])
    delta = f"-50.00 {units.interval(kd.ci_low, kd.ci_high, 'ci_low', 12)}"
    assert "†" not in delta  # 12 paired samples: no mark
    for out in (terminal, md, page):
        assert delta in out and "50.00" in out
    perf = next(p for p in report.perf if p.policy == "keydiff" and p.task.startswith("ruler"))
    assert perf.prompt_tokens == 2048 and isinstance(perf.prompt_tokens, int)
    for out in (md, page):  # memory in the unit of its header, 3 significant digits
        assert "process peak (RSS) GiB" in out and "KV-cache MiB" in out
    data = json.loads(formats.to_json(report))  # JSON/CSV: raw numbers, the unit in the field name
    raw = next(p for p in data["perf"] if p["policy"] == "keydiff" and p["task"].startswith("ruler"))
    assert raw["peak_memory_bytes"] == 3 * GIB and raw["peak_kv_bytes"] == 12 * MIB
    assert "peak_kv_bytes" in formats.csv_text(report, "perf").splitlines()[0]


def test_a_ci_from_few_samples_is_marked_everywhere(report):
    kd = next(r for r in report.scores if r.policy == "keydiff" and r.metric == "needle" and r.level == "task")
    assert kd.n_paired == 2
    view = scores_view(report)
    row = view.rows[view.raw.index(kd)]
    assert row[view.columns.index(next(c for c in view.columns if c.header.startswith("Δ")))].endswith("]†")
    assert view.caption == "† CI from fewer than 10 paired samples: it says little"
    assert view.caption in formats.to_markdown(report) and "fewer than 10 paired samples" in render_html(report, [])
    [headline] = headline_views(report)
    cells = dict(headline.rows)["keydiff N=256"]
    assert cells[headline.metrics.index("needle")].ci.endswith("†")
    assert not cells[headline.metrics.index("ruler.niah_multikey_3")].ci.endswith("†")


def _lines(renderable, width: int) -> list[str]:
    console = Console(record=True, width=width)
    console.print(renderable)
    return console.export_text().splitlines()


@pytest.mark.parametrize("width", [80, 100, 150])
def test_terminal_tables_fit_and_cut_nothing(report, width):
    names = ["snapkv(kernel=7,window=32)", "ruler.niah_multikey_3@2048#s0", "ruler.niah_multikey_3",
             "needle@1024#s0", "20261130-080642-5dfd91"]
    headline = [r for r in report.scores if r.level != "detail"]
    for table, view in ((scores_table(report, width), scores_view(report, headline)),
                        (speed_table(report, width), speed_view(report)),
                        (memory_table(report, width), memory_view(report))):
        lines = _lines(table, width)
        text = "\n".join(lines)
        assert "…" not in text and max(len(ln.rstrip()) for ln in lines) <= width
        for name in names:
            if any(name in cell for row in view.rows for cell in row):
                assert any(name in ln for ln in lines), (view.name, width, name)  # whole, on one line
        numbers = {w for row in view.rows for cell in row for w in cell.split() if re.fullmatch(r"[-+\[]?[\d.]+[,\]†]*", w)}
        words = {w for ln in lines for w in ln.split()}
        assert numbers <= words, (view.name, width, sorted(numbers - words)[:5])  # no number split


def test_report_cli_follows_the_terminal_width_and_prints_errors_whole(store, report):
    idx, _ = store
    for width in (80, 150):
        res = CliRunner().invoke(app, ["report", "--db", str(idx.engine.url), "--resamples", "50"],
                                 env={"COLUMNS": str(width)})
        assert res.exit_code == 1, res.output  # the failed snapkv cell
        lines = res.output.splitlines()
        assert max(len(ln) for ln in lines if not ln.startswith("warning:")) <= width
        flat = " ".join(" ".join(ln.split()) for ln in lines)
        assert ("a long error message that must be read in full " * 3).strip() in flat


def test_layout_widths():
    assert pack("1.01 [0.913, 1.10]†", 15) == "1.01\n[0.913, 1.10]†"  # wraps before the interval, not in it
    assert pack("1.01 [0.913, 1.10]†", 8, whole_intervals=False) == "1.01\n[0.913,\n1.10]†"
    assert fit_widths([(5, 10), (3, 3)], 20) == [10, 3]  # natural widths fit
    # 16 cells for columns (two gaps of 2): the 4 spare ones shared 10:5 by what each still wants, then the rest
    assert fit_widths([(5, 15), (3, 3), (4, 9)], 20) == [8, 3, 5]
    assert fit_widths([(10, 10), (10, 10)], 20) is None  # even the narrowest do not fit (gap of 2)
    view = TableView("t", "title", [Column("name", key=True), Column("group", key=True), Column("v", numeric=True)],
                     [["alpha", "a-very-long-group-name-that-is-wide", "1.00"],
                      ["beta", "a-very-long-group-name-that-is-wide", "2.00"]])
    lines = [ln.rstrip() for ln in _lines(render(view, 42), 42)]
    assert "group a-very-long-group-name-that-is-wide" in lines  # grouped under a heading, not cut
    assert any(ln.split() == ["alpha", "1.00"] for ln in lines) and all(len(ln) <= 42 for ln in lines)
    two = TableView("t", "title", view.columns, view.rows + [["gamma", "another-group-name-also-wide-ish", "3.00"]])
    lines = [ln.rstrip() for ln in _lines(render(two, 42), 42)]
    headings = [i for i, ln in enumerate(lines) if ln.startswith("group ")]
    assert len(headings) == 2 and sum(ln.split() == ["name", "v"] for ln in lines) == 1  # one header, then rows
    assert any(ln.split() == ["gamma", "3.00"] for ln in lines[headings[1]:])
    wide = TableView("t", "title", view.columns + [Column("other", key=True)],
                     [row + ["another-long-name-of-26-ch"] for row in view.rows])
    records = [ln.rstrip() for ln in _lines(render(wide, 36), 36)]  # no grouping fits: one line per column
    assert "name   alpha" in records and "v      1.00" in records and "other  another-long-name-of-26-ch" in records
    assert all(len(ln) <= 36 for ln in records)


def test_tasks_listing_keeps_names_whole_at_80_columns():
    res = CliRunner().invoke(app, ["tasks"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    from kdeval.evals.benchmarks.registry import REGISTRY

    lines = res.output.splitlines()
    assert "…" not in res.output and max(len(ln) for ln in lines) <= 80
    for name in REGISTRY:
        assert any(ln.split() and ln.split()[0] == name for ln in lines), name
