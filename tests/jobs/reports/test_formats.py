"""JSON, CSV and the HTML page carry every row exactly (round trip); Markdown and HTML print the terminal's
text; the CLI writes them."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports import ReportOptions, build_report
from kdeval.jobs.reports.render import formats, views
from kdeval.jobs.reports.render.output import write_report
from tests.jobs.reports import readers
from tests.jobs.reports.helpers import FakeCell, provenance, rows, store_run


def _sorted(rs):
    return sorted(rs, key=repr)


@pytest.fixture
def report(store):
    idx, res = store
    needle_full = rows([1, 1, 0, 1, 1, 0, 1, 1], depths=[10.0, 50.0, 90.0])
    needle_kd = rows([1, 0, 0, 1, 1, 0, 0, 1], depths=[10.0, 50.0, 90.0])
    store_run(idx, res, "r1", [
        FakeCell("full", None, rows=needle_full, provenance=provenance(cuda="12.8", host="a|b")),
        FakeCell("keydiff", 128, rows=needle_kd, provenance=provenance()),
        FakeCell("keydiff", 256, rows=needle_full[:-1]),
        FakeCell("sink", 128, params={"sink_tokens": 4}, rows=None, error="RuntimeError: x | y"),
        FakeCell("full", None, task="ruler.vt", length=2048, rows=rows([1, 0, 1], task="ruler.vt", length=2048)),
        FakeCell("keydiff", 128, task="ruler.vt", length=2048, rows=rows([0.3333, 0, 1], task="ruler.vt", length=2048)),
    ])
    return build_report(idx, ["r1"], ReportOptions(resamples=200, seed=1))


def test_json_round_trip(report):
    back = formats.from_json(formats.to_json(report))
    assert back == report


def test_every_format_round_trips_the_same_rows(report, tmp_path):
    paths = write_report(report, tmp_path, ["md", "csv", "json", "html"])
    assert set(paths) == {"md", "csv", "json", "html"}
    tables = {
        "csv": readers.read_csv(tmp_path),
        "json": {k: getattr(formats.from_json(paths["json"].read_text()), k)
                 for k in ("scores", "perf", "cells", "provenance")},
        "html": readers.read_html_tables(paths["html"].read_text()),
    }
    for fmt, got in tables.items():
        for name in ("scores", "perf", "cells", "provenance"):
            assert _sorted(got[name]) == _sorted(getattr(report, name)), (fmt, name)
    assert len(report.provenance) == 5 and {p.cuda for p in report.provenance} == {"12.8", ""}
    assert len(report.cells) == 1 and report.cells[0].policy == "sink(sink_tokens=4)"
    assert any(r.delta is not None and r.ci_low is not None for r in report.scores)
    assert (tmp_path / "plots").is_dir() and list((tmp_path / "plots").glob("*.png"))
    md = paths["md"].read_text()  # Markdown is for reading: the terminal's cells, one table row each
    for view in (views.scores_view(report, [r for r in report.scores if r.level != "detail"]),
                 views.speed_view(report), views.memory_view(report)):
        for cells in view.rows:
            assert "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" in md, (view.name, cells)


def test_cli_report_writes_files_and_exits_1_on_incomplete_cells(store, tmp_path, report):
    idx, _ = store
    db = str(idx.engine.url)
    res = CliRunner().invoke(app, ["report", "r1", "--db", db, "--format", "table,json,html",
                                   "--out", str(tmp_path / "out"), "--resamples", "200", "--seed", "1"])
    assert res.exit_code == 1, res.output  # the failed sink cell
    assert "cells not done or missing" in res.output and "keydiff" in res.output
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    back = formats.from_json(json.dumps(data))
    assert _sorted(back.scores) == _sorted(report.scores)
    assert (tmp_path / "out" / "report.html").stat().st_size > 1000


def test_cli_report_bad_input(store):
    idx, _ = store
    db = str(idx.engine.url)
    res = CliRunner().invoke(app, ["report", "nope", "--db", db])
    assert res.exit_code == 2 and "no run 'nope'" in res.output
    res = CliRunner().invoke(app, ["report", "--db", db, "--format", "pdf"])
    assert res.exit_code == 2 and "unknown format 'pdf'" in res.output


def test_cli_report_never_creates_an_index(tmp_path):
    db = tmp_path / "typo" / "index.sqlite"
    res = CliRunner().invoke(app, ["report", "--db", str(db)])
    assert res.exit_code == 2 and "no index at" in res.output, res.output
    assert not db.exists() and not db.parent.exists()


def test_cli_report_json_to_stdout(store, report):
    idx, _ = store
    res = CliRunner().invoke(app, ["report", "r1", "--db", str(idx.engine.url), "--format", "json",
                                   "--resamples", "200", "--seed", "1"])
    assert res.exit_code == 1
    assert _sorted(formats.from_json(res.stdout).scores) == _sorted(report.scores)


def test_cli_report_compare_run(store, tmp_path):
    idx, res = store
    store_run(idx, res, "before", [FakeCell("full", None, rows=rows([1.0] * 4)),
                                   FakeCell("keydiff", 64, rows=rows([1.0] * 4))], version="v1")
    store_run(idx, res, "after", [FakeCell("full", None, rows=rows([1.0] * 4)),
                                  FakeCell("keydiff", 64, rows=rows([0.0, 1.0, 1.0, 1.0]))], version="v2")
    out = CliRunner().invoke(app, ["report", "after", "--compare", "before", "--db", str(idx.engine.url),
                                   "--format", "csv"])
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.stdout.splitlines() if ",keydiff," in ln)
    assert ",-25.0," in line  # one of four needles lost: -25 points against the run before
