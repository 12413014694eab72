"""What an export killed mid-write left staged beside its ``--out`` (a hidden file, or a hidden directory
beside or inside an empty ``--out``) is removed by the next export to the same place once the process that
staged it is gone; the staging of a live export is left alone."""
from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.jobs.interop.out_paths import staging_prefix
from kdeval.storage import RunIndex
from tests.jobs.reports.helpers import FakeCell, rows, store_run

runner = CliRunner()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _staged(out, pid: int) -> str:
    """The staging name an export by process ``pid`` would give (this host's)."""
    return staging_prefix(out).rsplit("-", 1)[0] + f"-{pid}."


@pytest.mark.parametrize("fmt", ["csv", "kvpress"])
def test_a_killed_exports_staging_is_cleaned_at_the_next_run(tmp_path, fmt):
    idx = RunIndex.open(tmp_path / "index.sqlite")
    store_run(idx, tmp_path / "results", "r1", [FakeCell("full", None, rows=rows([1, 0, 1]))])
    db = str(idx.engine.url)
    idx.close()
    out = tmp_path / ("all.csv" if fmt == "csv" else "kv")
    dead, live = _dead_pid(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if fmt == "csv":
            stale = tmp_path / f"{_staged(out, dead)}abc.tmp"
            stale.write_text("half a table")
            kept = tmp_path / f"{_staged(out, live.pid)}def.tmp"
            kept.write_text("being written")
        else:  # an empty --out holding a killed export's staging directory, and one beside it
            out.mkdir()
            stale = out / f"{_staged(out, dead)}abc"
            (stale / "sub").mkdir(parents=True)
            (tmp_path / f"{_staged(out, dead)}ghi").mkdir()
            kept = tmp_path / f"{_staged(out, live.pid)}def"
            kept.mkdir()
        r = runner.invoke(kdeval_app, ["export", "r1", "--format", fmt, "--out", str(out), "--db", db])
        assert r.exit_code == 0, r.output
        assert not stale.exists() and kept.exists()
        hidden = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{out.name}."))
        assert hidden == [kept.name]
        assert out.exists() and (fmt == "csv" or not [p for p in out.iterdir() if p.name.startswith(".")])
    finally:
        live.kill()
        live.wait()
