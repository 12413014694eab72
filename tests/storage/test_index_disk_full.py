"""The index's disk fills up during a run: the driver says so in one line naming the index and the cause,
exits 1, and leaves the run resumable (its driver gone); `resume` on the still-full disk says the same; once
there is room, `resume` finishes the run.

The index lives on a 1 MiB tmpfs the test mounts (root only; skipped, saying why, where it cannot mount).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from typer.testing import CliRunner

from kdeval.cli.app import app as kdeval_app
from kdeval.storage import IndexAccessError, RunIndex
from tests.user_env import user_env

from tests.support.helpers import tmpfs, wait_until

runner = CliRunner()

GRID = """
name: full-disk
models: ["stub:0.3"]
policies: [full, keydiff]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 4}]
resources: {workers: 1, shard_size: 1}
"""


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs mounted for the test (unmounted at the end, whatever happens)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with tmpfs(mnt, "1m"):
        yield mnt


@pytest.fixture
def wide(monkeypatch):
    """Messages on one line whatever their length (the CLI's consoles, made per call, 400 cells wide)."""
    monkeypatch.setenv("COLUMNS", "400")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kdeval.cli.app", *args]


def _env() -> dict[str, str]:
    return user_env(COLUMNS="300")


def _fill(folder: Path) -> Path:
    """Write a file into ``folder`` until its filesystem has no byte left."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: every byte that fits is written
        for block in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    fh.write(b"\0" * block)
            except OSError:
                pass
    return filler


def _attempts(db: Path) -> int:
    """How many attempts the index records (0 while it is not made yet)."""
    try:
        idx = RunIndex.open(db, write=False)
    except IndexAccessError:
        return 0
    try:
        runs = idx.list_runs()
        return len(idx.run_attempts(runs[0].id)) if runs else 0
    finally:
        idx.close()


def _stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return [ln for ln in proc.stderr.splitlines() if ln.strip()]


def test_a_full_index_disk_is_one_line_and_the_run_resumes_once_there_is_room(small_disk, tmp_path, local_ray, wide):
    db = small_disk / "index.sqlite"
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    driver = subprocess.Popen(_cli("submit", str(grid), "--db", str(db), "--results-dir", str(tmp_path / "res")),
                              env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        wait_until(lambda: _attempts(db), 120, "the run's first attempt")
        filler = _fill(small_disk)
        stdout, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
    run_id = RunIndex.open(db, write=False).list_runs()[0].id
    assert driver.returncode == 1, stdout + stderr
    last = _stderr_lines(subprocess.CompletedProcess([], 1, stdout, stderr))[-1]
    assert last == (f"error: the index at {db} failed: its disk is full (database or disk is full); the run could "
                    f"not be marked failed either (its driver is gone): `kdeval resume {run_id}` continues it once "
                    "the index can be written"), stderr
    # the rest in this process, on the tests' Ray (the driver above was a process of its own, as a user's is)
    status = json.loads(runner.invoke(kdeval_app, ["status", run_id, "--db", str(db), "--json"]).stdout)
    assert status["run"]["driver_alive"] is False  # never a live-looking run whose driver exited
    ls = runner.invoke(kdeval_app, ["ls", "--db", str(db)])
    assert "running (driver gone)" in ls.stdout, ls.stdout

    still_full = runner.invoke(kdeval_app, ["resume", run_id, "--db", str(db)])
    assert still_full.exit_code == 1
    assert "Traceback" not in still_full.output and still_full.stderr == (
        f"error: the index at {db} failed: its disk is full (database or disk is full); `kdeval resume {run_id}` "
        "continues it once the index can be written\n")

    filler.unlink()
    resumed = runner.invoke(kdeval_app, ["resume", run_id, "--db", str(db)])
    assert resumed.exit_code == 0, resumed.output
    idx = RunIndex.open(db, write=False)
    assert idx.get_run(run_id).state == "done" and idx.get_run(run_id).counts == {"done": 3}
    idx.close()


def test_a_full_results_disk_records_no_run(small_disk, tmp_path, wide):
    _fill(small_disk)
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    res = small_disk / "res"
    r = runner.invoke(kdeval_app, ["submit", str(grid), "--db", str(tmp_path / "i.sqlite"), "--results-dir", str(res)])
    assert r.exit_code == 1
    assert r.stderr == f"error: no run recorded: --results-dir {res}: No space left on device\n"
    assert RunIndex.open(tmp_path / "i.sqlite", write=False).list_runs() == []
