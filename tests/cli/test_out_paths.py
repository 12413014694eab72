"""``export`` and ``report`` write only where ``--out`` plainly says: a device, FIFO or socket is refused (never
replaced by a regular file), so is a target or directory that is a symbolic link (``<link to /etc>/passwd``);
what they write gets the modes the umask gives (not a temp file's 0600/0700), and a place that cannot be written
is one line naming ``--out``, exit 2, not a traceback."""
from __future__ import annotations

import errno
import os
import stat

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()
ENV = {"COLUMNS": "300"}


@pytest.fixture
def db(tmp_path):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1, 0])),
                                                 FakeCell("keydiff", 64, rows=rows([1, 1]))])
    url = str(idx.engine.url)
    idx.close()
    return url


def _one_line(r, start: str) -> None:
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith(start), r.output


@pytest.fixture
def umask():
    """Set the process umask for the test, restored after."""
    before = os.umask(0o022)
    yield lambda m: os.umask(m)
    os.umask(before)


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_special_file_is_refused_and_stays_what_it_is(db, tmp_path, command):
    """A FIFO stands for every special file (``/dev/full`` the battery used: a test must not risk the machine's
    device node); none is replaced by a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = (["export", "r1", "--format", "csv"] if command == "export" else ["report", "r1", "--format", "json"])
    r = runner.invoke(kdeval_app, args + ["--out", str(fifo), "--db", db], env=ENV)
    if command == "export":
        _one_line(r, f"error: --out: {fifo} is a FIFO, not a regular file")
    else:
        _one_line(r, f"error: --out: {fifo} exists and is not a directory")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("command", ["export-file", "export-link-file", "export-kvpress", "report"])
def test_a_symbolic_link_is_refused_and_nothing_lands_where_it_points(db, tmp_path, command):
    real = tmp_path / "real"
    real.mkdir()
    (real / "passwd").write_text("root:x:0:0\n")
    link = tmp_path / "link"
    link.symlink_to(real)
    before = sorted((p.name, p.read_bytes()) for p in real.iterdir())
    args = {"export-file": ["export", "r1", "--format", "csv", "--out", str(link / "passwd")],
            "export-link-file": ["export", "r1", "--out", str(real / "x.csv")],
            "export-kvpress": ["export", "r1", "--format", "kvpress", "--out", str(link)],
            "report": ["report", "r1", "--format", "csv", "--out", str(link)]}[command]
    if command == "export-link-file":  # the file itself a link to a file elsewhere
        (real / "x.csv").symlink_to(real / "passwd")
        before = sorted((p.name, p.read_bytes()) for p in real.iterdir())
        where = real / "x.csv"
    else:
        where = link
    r = runner.invoke(kdeval_app, args + ["--db", db], env=ENV)
    _one_line(r, f"error: --out: {where} is a symbolic link (to ")
    assert sorted((p.name, p.read_bytes()) for p in real.iterdir()) == before


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_exports_get_the_modes_the_umask_gives(db, tmp_path, umask, mask):
    umask(mask)
    out = tmp_path / "all.csv"
    r = runner.invoke(kdeval_app, ["export", "r1", "--out", str(out), "--db", db], env=ENV)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask
    tree = tmp_path / "kv"
    r = runner.invoke(kdeval_app, ["export", "r1", "--format", "kvpress", "--out", str(tree), "--db", db], env=ENV)
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(tree.stat().st_mode) == 0o777 & ~mask


def test_a_report_directory_that_cannot_be_written_is_one_line(db, tmp_path, monkeypatch):
    from kdeval.jobs.reports.render import output

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(output, "write_report", read_only)
    target = tmp_path / "ro" / "rep"
    r = runner.invoke(kdeval_app, ["report", "r1", "--format", "json", "--out", str(target), "--db", db], env=ENV)
    _one_line(r, f"error: --out: cannot write {target}: Read-only file system")
    assert not target.exists()  # nothing half-written
