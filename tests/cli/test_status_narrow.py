"""`kdeval status` in a narrow terminal: the runs table keeps the run id and its time whole and gives the name what
is left (whole where it fits), and a failed cell's long error is said whole under the cells table instead of
folded one word a line in its column."""
from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()
RUN = "20261207-124039-0072f3"  # as long as the ids kdeval makes
ERROR = ("ValueError: policy: 'ada-keydiff' shares a layer's slots among its KV heads; not supported on a model "
         "with windowed (sliding or chunked) attention layers")


def _store(tmp_path, name: str) -> str:
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", RUN, [
        FakeCell("full", None, model="random:gemma3-tiny", rows=rows([1, 0, 1])),
        FakeCell("keydiff", 64, model="random:gemma3-tiny", rows=rows([1, 0, 0])),
        FakeCell("ada-keydiff", 64, model="random:gemma3-tiny", rows=None, error=ERROR),
    ], name=name)
    db = str(idx.engine.url)
    idx.close()
    return db


@pytest.fixture
def index(tmp_path) -> str:
    return _store(tmp_path, "paper-claims-gemma3-2k")


@pytest.mark.parametrize("name, columns, whole", [("one-cache-check", 80, True), ("paper-claims-gemma3-2k", 90, True),
                                                  ("paper-claims-gemma3-2k", 80, False)])
def test_the_runs_table_keeps_the_id_and_time_whole_and_the_name_where_it_fits(tmp_path, name, columns, whole):
    out = runner.invoke(kdeval_app, ["status", "--db", _store(tmp_path, name)], env={"COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= columns, out.output
    row = next(i for i, line in enumerate(lines) if line.startswith(RUN + " "))
    assert re.search(r"\d\d-\d\d \d\d:\d\d$", lines[row].rstrip()), out.output  # the time, whole
    assert (name in lines[row]) == whole, out.output
    folded = "".join(line[len(RUN) + 2 :].split(" ")[0] for line in lines[row:])
    assert folded.startswith(name), out.output  # folded or not, the whole name in order


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


def test_the_demos_cells_fit_one_line_each_at_80_columns(tmp_path):
    """`make demo`'s grid (four policies at N=256, B=128, on needle and ruler.niah_single_1, every cell done
    in a group): each cell is one line at 80 columns, its task whole and its headline value in the score
    column; the metric names and the one chunk size are said once under the table."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    cells = [FakeCell(pol, budget, task=task, chunk=128, model="smollm2-135m", params=params,
                      rows=rows([1, 1]), summary={metric: 100.0 if pol != "sink" else 50.0, "n": 2,
                                                  "shared_rows": 1})
             for task, metric in (("needle", "score"), ("ruler.niah_single_1", "contains"))
             for pol, budget, params in (("full", None, {}), ("keydiff", 256, {}), ("sink", 256, {}),
                                         ("snapkv", 256, {"window": 32}))]
    store_run(idx, tmp_path / "results", RUN, cells, name="demo")
    db = str(idx.engine.url)
    idx.close()
    out = runner.invoke(kdeval_app, ["status", RUN, "--db", db], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert max(len(line) for line in lines) <= 80, out.output
    rows_ = [line for line in lines if re.match(r"^[0-9a-f]{8} ", line)]
    assert len(rows_) == 8, out.output
    one_line = r" (needle|ruler\.niah_single_1) +done shared +\d+\.\d +(100|50)\.00$"
    assert all(re.search(one_line, line.rstrip()) for line in rows_), out.output
    head = next(i for i, line in enumerate(lines) if line.startswith("cell "))
    assert lines[head].split() == ["cell", "policy", "N", "task", "state", "s", "score"], out.output
    assert lines[head + 2 + 8:] == ["every task: 1024 tokens, seed 0",
                                    "scores: score (needle), contains (ruler.niah_single_1)",
                                    "every cell: chunks of B=128"], out.output


def test_a_large_run_shows_its_failed_cells_first_and_says_how_to_see_all(tmp_path, monkeypatch):
    from kdeval.cli import service_cmds

    idx = RunIndex.open(tmp_path / "index.sqlite")
    cells = [FakeCell("keydiff", 32 * (i + 1), rows=rows([1, 0])) for i in range(5)]
    cells.insert(3, FakeCell("snapkv", 64, rows=None, error="OSError: disk full"))
    store_run(idx, tmp_path / "results", RUN, cells)
    db = str(idx.engine.url)
    idx.close()
    monkeypatch.setattr(service_cmds, "MAX_ROWS", 3)
    out = runner.invoke(kdeval_app, ["status", RUN, "--db", db], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    shown_rows = [line for line in out.output.splitlines() if re.match(r"^[0-9a-f]{8} ", line)]
    assert len(shown_rows) == 3 and "disk full" in shown_rows[2], out.output  # grid order: the failure is 4th
    assert (f"3 of 6 cells shown (failed, running and pending ones first); `kdeval status {RUN} --all` lists "
            "every one, `--json` as JSON") in out.output
    every = runner.invoke(kdeval_app, ["status", RUN, "--db", db, "--all"], env={"COLUMNS": "200"})
    assert len([line for line in every.output.splitlines() if re.match(r"^[0-9a-f]{8} ", line)]) == 6
    assert "cells shown" not in every.output
