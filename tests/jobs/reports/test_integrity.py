"""Integrity in reports: a done cell whose Parquet file is truncated, foreign or short of rows is flagged as a
failed cell with the reason (exit 1), never shown as ok with fewer samples."""
from __future__ import annotations

import shutil

import pyarrow.parquet as pq
from typer.testing import CliRunner

from kdeval.cli.app import app
from kdeval.jobs.reports import ReportOptions, build_report
from tests.jobs.reports.helpers import FakeCell, rows, store_run

SCORES = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]


def _store(store, **kd):
    idx, res = store
    store_run(idx, res, "r1", [FakeCell("full", None, rows=rows([1.0] * 6)),
                               FakeCell("keydiff", 256, rows=rows(SCORES), **kd)])
    return idx, res, idx.get_cell(FakeCell("keydiff", 256).cell_id("v1"))


def _flagged(idx, why: str):
    """The report's keydiff rows: flagged as failed with ``why``, none shown as ok."""
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    [cell] = rep.cells
    assert (cell.policy, cell.state) == ("keydiff", "failed") and why in cell.error, cell.error
    score = next(r for r in rep.scores if r.policy == "keydiff" and r.level == "task")
    assert score.state == "failed" and score.n == 0 and score.value is None
    perf = next(p for p in rep.perf if p.policy == "keydiff")
    assert perf.state == "failed" and perf.n == 0
    assert rep.n_incomplete_cells == 1
    return cell


def test_truncated_file_is_flagged(store):
    idx, res, view = _store(store)
    path = res / view.result_path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _flagged(idx, "result file unreadable")
    out = CliRunner().invoke(app, ["report", "r1", "--db", str(idx.engine.url), "--resamples", "0"])
    assert out.exit_code == 1 and "cells not done or missing" in out.output, out.output


def test_half_rows_file_is_flagged(store):
    idx, res, view = _store(store)
    path = res / view.result_path
    pq.write_table(pq.read_table(path).slice(0, 3), path)
    cell = _flagged(idx, "fails its integrity check")
    assert "3 rows, index says 6" in cell.error


def test_foreign_file_is_flagged(store):
    idx, res, view = _store(store)
    full = idx.get_cell(FakeCell("full", None).cell_id("v1"))
    shutil.copyfile(res / full.result_path, res / view.result_path)  # same row count, another cell's rows
    cell = _flagged(idx, "fails its integrity check")
    assert f"holds cell {full.id}" in cell.error


def test_old_files_without_cell_ids_are_trusted_but_counted(store):
    idx, res, view = _store(store, identity=False)
    rep = build_report(idx, ["r1"], ReportOptions(resamples=0))
    assert rep.cells == [] and next(p for p in rep.perf if p.policy == "keydiff").n == 6
    path = res / view.result_path
    pq.write_table(pq.read_table(path).slice(0, 3), path)
    assert "3 rows, index says 6" in _flagged(idx, "fails its integrity check").error
