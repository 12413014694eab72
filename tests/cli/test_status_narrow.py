"""`kdeval status` in an 80-column terminal: a run's name stays whole in the runs table, and a failed cell's long
error is said whole under the cells table instead of folded one word a line in its column."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()
RUN = "20261207-124039-0072f3"  # as long as the ids kdeval makes
ERROR = ("ValueError: policy: 'ada-keydiff' shares a layer's slots among its KV heads; not supported on a model "
         "with windowed (sliding or chunked) attention layers")


@pytest.fixture
def index(tmp_path) -> str:
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", RUN, [
        FakeCell("full", None, model="random:gemma3-tiny", rows=rows([1, 0, 1])),
        FakeCell("keydiff", 64, model="random:gemma3-tiny", rows=rows([1, 0, 0])),
        FakeCell("ada-keydiff", 64, model="random:gemma3-tiny", rows=None, error=ERROR),
    ], name="paper-claims-gemma3-2k")
    db = str(idx.engine.url)
    idx.close()
    return db


def test_the_runs_table_keeps_a_run_name_whole_at_80_columns(index):
    out = runner.invoke(kdeval_app, ["status", "--db", index], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert "paper-claims-gemma3-2k" in out.output, out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80


def test_a_long_error_is_said_whole_under_the_cells_table_at_80_columns(index):
    out = runner.invoke(kdeval_app, ["status", RUN, "--db", index], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    failed = next(line for line in lines if "ada-keydiff" in line)
    assert failed.rstrip().endswith("error below"), out.output
    cell = failed.split()[0]
    below = " ".join(lines[next(i for i, line in enumerate(lines) if line.startswith(f"cell {cell}: ")):]).split()
    assert " ".join(below).startswith(f"cell {cell}: {' '.join(ERROR.split())}"), out.output


def test_a_short_error_stays_in_its_column(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("keydiff", 64, rows=None, error="OSError: disk full")])
    db = str(idx.engine.url)
    idx.close()
    out = runner.invoke(kdeval_app, ["status", "r1", "--db", db], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert "OSError: disk full" in out.output and "error below" not in out.output, out.output
