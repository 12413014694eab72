"""Bad places fail fast: a ``--db`` that is not an index, unreachable, or read-only for a command that writes,
and a ``--results-dir`` that cannot be written, exit 2 with one line naming the flag and the cause, before a
run is created; ``status``, ``ls`` and ``report`` read a read-only index.

Tests run as root, for whom every file is writable: read-only is simulated by making ``os.access`` say so
(beside real 0444/0555 modes), and checked for real as the ``nobody`` user where that is possible.
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kdeval.cli import index_access
from kdeval.cli.app import app as cli
from kdeval.storage import RunIndex
from kdeval.storage import db as storage_db
from tests.jobs.reports.helpers import FakeCell, rows, store_run
from tests.user_env import user_env

from tests.support.helpers import stub_grid

runner = CliRunner()
ENV = {"COLUMNS": "300"}


def _one_error_line(res) -> str:
    """The command exited 2 printing exactly one line, which it returns."""
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def grid(tmp_path: Path) -> Path:
    g = tmp_path / "grid.yaml"
    g.write_text(stub_grid())
    return g


def _every_command(db: str, grid: Path, results: Path) -> dict[str, list[str]]:
    return {
        "submit": ["submit", str(grid), "--db", db, "--results-dir", str(results)],
        "status": ["status", "--db", db], "status-run": ["status", "r1", "--db", db], "ls": ["ls", "--db", db],
        "report": ["report", "r1", "--db", db], "resume": ["resume", "r1", "--db", db],
        "cancel": ["cancel", "r1", "--db", db],
    }


def test_a_file_that_is_not_an_index(tmp_path, grid, monkeypatch):
    monkeypatch.chdir(tmp_path)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(os.urandom(8192))
    foreign = tmp_path / "other.sqlite"
    import sqlite3
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    before = _snapshot(tmp_path)
    for db, cause in ((garbage, "is not a kdeval index (not an SQLite database)"),
                      (foreign, "is not a kdeval index (an SQLite database without a runs table)")):
        for name, args in _every_command(str(db), grid, tmp_path / "results").items():
            line = _one_error_line(runner.invoke(cli, args, env=ENV))
            assert line == f"error: --db: {db} {cause}", (name, line)
    assert _snapshot(tmp_path) == before  # nothing written: no tables added, no results dir, no journal


def test_an_unreachable_database(tmp_path, grid):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://kdeval:s3cret@127.0.0.1:{port}/kdeval"
    for name, args in _every_command(url, grid, tmp_path / "results").items():
        line = _one_error_line(runner.invoke(cli, args, env=ENV))
        assert line.startswith(f"error: --db: cannot "), (name, line)
        assert f"postgresql://kdeval:***@127.0.0.1:{port}/kdeval" in line and "s3cret" not in line
        if name == "submit":
            try:
                import psycopg  # noqa: F401
            except ImportError:
                assert "pip install" in line
            else:
                assert "cannot connect to" in line and "Connection refused" in line, line
    assert not (tmp_path / "results").exists()


def test_an_index_directory_that_cannot_be_created(tmp_path, grid):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    db = blocker / "sub" / "index.sqlite"
    line = _one_error_line(runner.invoke(cli, ["submit", str(grid), "--db", str(db), "--results-dir",
                                               str(tmp_path / "results")], env=ENV))
    assert line.startswith(f"error: --db: cannot create the directory of {db}: "), line
    assert not (tmp_path / "results").exists()


def test_results_dir_that_cannot_be_written(tmp_path, grid, monkeypatch):
    db = tmp_path / "index.sqlite"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [(blocker / "results", f"cannot create {blocker / 'results'}: {blocker} is not a directory"),
             (blocker, f"{blocker} is not a directory")]
    for results, cause in cases:
        line = _one_error_line(runner.invoke(cli, ["submit", str(grid), "--db", str(db), "--results-dir",
                                                   str(results)], env=ENV))
        assert line == f"error: --results-dir: {cause}"
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access  # root may write anywhere: say ro is not writable, as a user would find it
    monkeypatch.setattr(index_access.os, "access",
                        lambda path, mode: real_access(path, mode) and not (mode & os.W_OK and Path(path) == ro))
    line = _one_error_line(runner.invoke(cli, ["submit", str(grid), "--db", str(db), "--results-dir", str(ro)],
                                         env=ENV))
    assert line == f"error: --results-dir: {ro} is not writable"
    line = _one_error_line(runner.invoke(cli, ["submit", str(grid), "--db", str(db), "--results-dir",
                                               str(ro / "a" / "b")], env=ENV))
    assert line == f"error: --results-dir: cannot create {ro / 'a' / 'b'}: {ro} is not writable"
    assert not db.exists()  # checked before the index is even created


def _done_index(folder: Path, results: Path) -> Path:
    """An index holding run r1 (full and keydiff, both done) under ``folder``."""
    db = folder / "index.sqlite"
    idx = RunIndex.open(db)
    store_run(idx, results, "r1", [FakeCell("full", None, rows=rows([1.0, 0.0, 1.0])),
                                   FakeCell("keydiff", 64, rows=rows([1.0, 0.0, 0.0]))])
    idx.close()
    return db


def _make_read_only(folder: Path, db: Path) -> None:
    db.chmod(0o444)
    folder.chmod(0o555)


def _restore(folder: Path) -> None:
    folder.chmod(0o755)
    for p in folder.iterdir():
        p.chmod(0o644)


def test_read_only_index_refused_for_writers_read_by_readers(tmp_path, grid, monkeypatch):
    folder, results = tmp_path / "ro", tmp_path / "results"
    folder.mkdir()
    db = _done_index(folder, results)
    _make_read_only(folder, db)
    real_access = os.access

    def access(p, mode) -> bool:  # as a non-root user sees it
        return real_access(p, mode) and not (mode & os.W_OK and folder in (Path(p), *Path(p).parents))

    monkeypatch.setattr(storage_db.os, "access", access)
    try:
        before = _snapshot(folder)
        for name in ("submit", "resume", "cancel"):
            line = _one_error_line(runner.invoke(cli, _every_command(str(db), grid, results)[name], env=ENV))
            assert line == f"error: --db: {db} is read-only (this command writes to the index)", (name, line)
        res = runner.invoke(cli, ["status", "--db", str(db)], env=ENV)
        assert res.exit_code == 0 and "r1" in res.output, res.output
        res = runner.invoke(cli, ["ls", "--db", str(db)], env=ENV)
        assert res.exit_code == 0 and "r1" in res.output, res.output
        res = runner.invoke(cli, ["status", "r1", "--db", str(db), "--json"], env=ENV)
        assert res.exit_code == 0 and '"done"' in res.output, res.output
        res = runner.invoke(cli, ["report", "r1", "--db", str(db)], env=ENV)
        assert res.exit_code == 0 and "keydiff" in res.output, res.output
        assert _snapshot(folder) == before  # no journal, no -wal/-shm, no schema change
        assert sorted(p.name for p in folder.iterdir()) == ["index.sqlite"]
    finally:
        _restore(folder)


def test_read_only_index_of_an_older_schema_says_so(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    db = _done_index(folder, tmp_path / "results")
    import sqlite3
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE cells DROP COLUMN provenance")
    real_access = os.access
    monkeypatch.setattr(storage_db.os, "access", lambda p, mode: real_access(p, mode) and not mode & os.W_OK)
    line = _one_error_line(runner.invoke(cli, ["status", "--db", str(db)], env=ENV))
    assert line == (f"error: --db: {db} is read-only and lacks cells.provenance (made by an older kdeval); "
                    "open it once where it is writable to bring it up to date")


def _nobody_can_run_kdeval(cwd: Path) -> str | None:
    """Why the real read-only check cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "not root: the read-only paths are real for this user already (the simulated test covers them)"
    try:
        import pwd
        pwd.getpwnam("nobody")
    except KeyError:
        return "no 'nobody' user"
    try:
        probe = subprocess.run([sys.executable, "-c", "import kdeval.cli.service_cmds"], user="nobody", cwd=cwd,
                               capture_output=True, text=True, timeout=120,
                               env=user_env())
    except OSError as e:
        return f"'nobody' cannot run this Python ({e})"
    if probe.returncode != 0:
        return f"'nobody' cannot import kdeval here: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def test_read_only_index_for_real_as_another_user(grid):
    """As ``nobody``: a 0444 index in a 0555 directory is read by ``status`` and refused by ``submit``."""
    base = Path(tempfile.mkdtemp(prefix="kdeval-ro-"))
    try:
        base.chmod(0o755)
        why = _nobody_can_run_kdeval(base)
        if why:
            pytest.skip(why)
        folder, results = base / "ro", base / "results"
        folder.mkdir()
        db = _done_index(folder, results)
        _make_read_only(folder, db)
        (base / "grid.yaml").write_text(grid.read_text())
        (base / "out").mkdir(mode=0o777)
        (base / "out").chmod(0o777)
        before = _snapshot(folder)
        env = user_env(COLUMNS="300", HOME=str(base / "out"))

        def as_nobody(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "kdeval.cli.service_cmds", *args], user="nobody",
                                  cwd=base / "out", capture_output=True, text=True, timeout=120, env=env)

        res = as_nobody("status", "r1", "--db", str(db))
        assert res.returncode == 0 and "keydiff" in res.stdout, res.stdout + res.stderr
        res = as_nobody("ls", "--db", str(db))
        assert res.returncode == 0 and "r1" in res.stdout, res.stdout + res.stderr
        res = as_nobody("submit", str(base / "grid.yaml"), "--db", str(db), "--results-dir", str(base / "out" / "r"))
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.strip() == f"error: --db: {db} is read-only (this command writes to the index)"
        assert _snapshot(folder) == before
    finally:
        for p in base.rglob("*"):
            if p.is_dir():
                p.chmod(stat.S_IRWXU)
        shutil.rmtree(base, ignore_errors=True)


def test_db_from_a_file_or_the_environment(tmp_path, grid, monkeypatch):
    """``--db @FILE`` reads the URL from FILE and ``$KDEVAL_DB`` stands for a missing ``--db`` (both keep a
    password out of ``ps``); an unreadable FILE is one line, exit 2, for every command."""
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1.0]))], name="from-file")
    idx.close()
    url_file = tmp_path / "db-url"
    url_file.write_text(f"sqlite:///{tmp_path / 'index.sqlite'}\n")
    assert "from-file" in runner.invoke(cli, ["ls", "--db", f"@{url_file}"], env=ENV).output
    monkeypatch.setenv("KDEVAL_DB", f"@{url_file}")
    assert "from-file" in runner.invoke(cli, ["ls"], env=ENV).output
    monkeypatch.delenv("KDEVAL_DB")
    for name, args in _every_command(f"@{tmp_path / 'nope'}", grid, tmp_path / "res").items():
        line = _one_error_line(runner.invoke(cli, args, env=ENV))
        assert line == f"error: --db: cannot read the index URL from {tmp_path / 'nope'}: No such file or directory", \
            (name, line)
    assert not (tmp_path / "res").exists()
