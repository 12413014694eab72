"""The index is never trusted blindly: a SQLite index another process holds locked is waited for with a line
that says so, then one line and exit 1 with nothing written; `status` on a corrupt index is one line; a run
whose index file was emptied while it ran never reports success (exit 1, its results kept, the index
rebuildable)."""
from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service
from kdeval.storage import IndexLockedError, RunIndex, db as index_db
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()
GRID = ("name: held\nmodels: ['stub:0.01']\npolicies: [full, keydiff]\nbudgets: [64]\nchunk_sizes: [32]\n"
        "tasks: [{name: needle, lengths: [256], samples: 2}]\nretries: {max_attempts: 1}\n")


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")


def _index(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1, 0, 1]))])
    idx.close()
    return tmp_path / "index.sqlite"


def _hold(path, seconds: float) -> threading.Thread:
    """Another process's ``BEGIN EXCLUSIVE`` on ``path``, held for ``seconds`` (a thread with its own
    connection)."""
    ready = threading.Event()

    def hold() -> None:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN EXCLUSIVE")
        ready.set()
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    ready.wait(5)
    return thread


def test_a_locked_index_is_waited_for_then_one_line_and_exit_1(tmp_path, wide, monkeypatch):
    db = _index(tmp_path)
    monkeypatch.setattr(index_db, "SQLITE_BUSY_TIMEOUT_MS", 1000)
    grid = tmp_path / "g.yaml"
    grid.write_text(GRID)
    before = db.read_bytes()
    holder = _hold(db, 4)
    start = time.perf_counter()
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--db", str(db),
                                   "--results-dir", str(tmp_path / "results")])
    took = time.perf_counter() - start
    holder.join()
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 1, r.output
    assert lines == [f"the index at {db} is locked by another process; waiting up to 1 s for it",
                     f"error: --db: the index at {db} stayed locked by another process for 1 s; nothing was "
                     "written: try again once it is free"], r.output
    assert took < 3.5
    assert db.read_bytes() == before


def test_a_lock_released_while_waiting_lets_the_writer_in(tmp_path, monkeypatch):
    db = _index(tmp_path)
    said: list[str] = []
    holder = _hold(db, 0.8)
    idx = RunIndex.open(db, on_wait=said.append)
    holder.join()
    assert said == [f"the index at {db} is locked by another process; waiting up to 30 s for it"]
    assert idx.get_run("r1") is not None
    idx.close()
    with pytest.raises(IndexLockedError):
        monkeypatch.setattr(index_db, "SQLITE_BUSY_TIMEOUT_MS", 300)
        holder = _hold(db, 2)
        try:
            RunIndex.open(db)
        finally:
            holder.join()


@pytest.mark.parametrize("where", ["tables", "header"])
def test_status_on_a_corrupt_index_is_one_line(tmp_path, wide, where):
    db = _index(tmp_path)
    data = bytearray(db.read_bytes())
    page = 4096
    if where == "header":
        data[:100] = b"\x07" * 100
    else:  # every page but the first (the schema): the tables' rows and indexes
        data[page:] = b"\xff" * (len(data) - page)
    db.write_bytes(bytes(data))
    for args in (["status"], ["status", "r1"], ["ls"]):
        r = runner.invoke(kdeval_app, args + ["--db", str(db)])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code in (1, 2) and len(lines) == 1, r.output
        assert lines[0].startswith("error: ") and str(db) in lines[0], r.output
        assert "Traceback" not in r.output, r.output


class EmptiesTheIndex(StubWorkload):
    """The stub workload whose first cell empties the index file and its WAL under the running driver."""

    def __init__(self, db: str) -> None:
        super().__init__()
        self.db = db

    def run(self, handle, task):
        for path in (self.db, self.db + "-wal"):
            if os.path.exists(path):
                os.truncate(path, 0)
        return super().run(handle, task)


def test_a_run_whose_index_was_emptied_never_reports_success(local_ray, paths, wide, monkeypatch):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(GRID)
    monkeypatch.setattr(service, "execute_run", functools.partial(
        service.execute_run, workload=EmptiesTheIndex(str(paths["db"])), num_cpus=2))
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--db", str(paths["db"]),
                                   "--results-dir", str(paths["results"])])
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output, r.output
    assert f"the index at {paths['db']}" in r.output, r.output
    assert list((paths["results"] / "runs").iterdir())  # the run's manifest stays: the index can be rebuilt
