"""The index on PostgreSQL whose server time zone is not UTC: timestamps are the same instants as in SQLite,
a driver killed mid-run is reported dead within seconds (not hours off), and ``resume`` finishes the run.

A throwaway server is started on loopback (``tests/support/pg_server.py``); the tests skip, saying why,
where PostgreSQL cannot start (``.ci/run`` installs it from Debian's packages).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kdeval.jobs.run.service import DRIVER_STALE_S
from kdeval.storage import RunIndex, age_seconds
from tests.user_env import user_env

from tests.support import pg_server
from tests.support.helpers import stub_grid
from tests.support.helpers import attempt_states, stop_background, wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg():
    server, why = pg_server.start()
    if server is None:
        pytest.skip(why)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg) -> str:
    """A fresh database on the module's server."""
    return pg.create_database(f"kdeval_{uuid.uuid4().hex[:10]}")


def _raw(url: str):
    """An engine on ``url`` without kdeval's session settings: the server's own time zone applies."""
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


def test_timestamps_are_utc_instants_whatever_the_server_time_zone(pg_url):
    idx = RunIndex.open(pg_url)
    idx.create_run("r1", name="g", grid_yaml="", grid_hash="h", results_dir="/r", kdeval_version="v", cells=[])
    idx.start_driver("r1", "host", 123)
    run = idx.get_run("r1")
    for ts in (run.created_at, run.started_at, run.heartbeat_at):
        assert ts.tzinfo is not None and ts.utcoffset().total_seconds() == 0
        assert abs((datetime.now(timezone.utc) - ts).total_seconds()) < 30
    assert 0 <= age_seconds(run.heartbeat_at) < 30
    idx.close()

    raw = _raw(pg_url)
    with raw.connect() as conn:
        assert conn.execute(text("SHOW TIME ZONE")).scalar() == pg_server.SERVER_TIMEZONE
        kinds = dict(conn.execute(text(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'runs'")).all())
        assert kinds["heartbeat_at"] == kinds["created_at"] == "timestamp with time zone"
        epoch = conn.execute(text("SELECT extract(epoch FROM heartbeat_at) FROM runs")).scalar()
    raw.dispose()
    assert abs(float(epoch) - time.time()) < 30  # the stored instant is now, not now shifted by the zone


def test_an_index_made_with_plain_timestamp_columns_stays_right(pg_url):
    """Columns of an index created before they were ``timestamptz`` hold naive UTC; kdeval's sessions are in
    UTC, so they are still written and read as UTC on a server whose zone is not."""
    RunIndex.open(pg_url).close()
    raw = _raw(pg_url)
    with raw.begin() as conn:
        for col in ("created_at", "started_at", "finished_at", "heartbeat_at"):
            conn.execute(text(f"ALTER TABLE runs ALTER COLUMN {col} TYPE timestamp without time zone "
                              f"USING {col} AT TIME ZONE 'UTC'"))
    idx = RunIndex.open(pg_url)
    idx.create_run("r1", name="g", grid_yaml="", grid_hash="h", results_dir="/r", kdeval_version="v", cells=[])
    idx.start_driver("r1", "host", 123)
    assert 0 <= age_seconds(idx.get_run("r1").heartbeat_at) < 30
    idx.close()
    with raw.connect() as conn:
        epoch = conn.execute(text("SELECT extract(epoch FROM heartbeat_at AT TIME ZONE 'UTC') FROM runs")).scalar()
    raw.dispose()
    assert abs(float(epoch) - time.time()) < 30


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "kdeval.cli.service_cmds", *args]


def _status(url: str, run_id: str) -> dict:
    res = subprocess.run(_cli("status", run_id, "--db", url, "--json"), capture_output=True, text=True,
                         timeout=120, env=_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _env() -> dict[str, str]:
    return user_env(COLUMNS="200")


def test_smoke_grid_driver_killed_then_resumed_on_postgres(pg_url, tmp_path):
    grid = tmp_path / "grid.yaml"
    # 5 cells, one at a time (alone: a group of the 5 would finish them all at once, leaving no moment with one
    # done and one running to kill the driver in)
    grid.write_text(stub_grid(cost=1.5, workers=1) + "execution: {share: false}\n")
    results = tmp_path / "results"
    log = open(tmp_path / "driver.log", "wb")
    driver = subprocess.Popen(_cli("submit", str(grid), "--db", pg_url, "--results-dir", str(results)),
                              env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    idx = RunIndex.open(pg_url)
    try:
        wait_until(lambda: idx.list_runs(), 60, "the run to be recorded")
        run_id = idx.list_runs()[0].id
        wait_until(lambda: idx.run_cells(run_id, states=["done"]) and idx.run_cells(run_id, states=["running"]),
                   120, "a cell done and one running")
        live = _status(pg_url, run_id)["run"]
        assert live["state"] == "running" and live["driver_alive"] is True, live
        assert 0 <= live["heartbeat_age_s"] < DRIVER_STALE_S
        beat = datetime.fromisoformat(live["heartbeat_at"])
        assert abs((datetime.now(timezone.utc) - beat).total_seconds()) < DRIVER_STALE_S
        # the status calls above can outlast a cell on a busy machine: kill while an attempt surely runs
        wait_until(lambda: "running" in attempt_states(idx, run_id), 60, "an attempt running")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        try:  # the local Ray it started, if anything of it outlived the driver
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()

    dead = _status(pg_url, run_id)["run"]
    assert dead["state"] == "running" and dead["driver_alive"] is False, dead
    assert 0 <= dead["heartbeat_age_s"] < 60  # seconds since it died, not the server's UTC offset
    table = subprocess.run(_cli("status", run_id, "--db", pg_url), capture_output=True, text=True, timeout=120,
                           env=_env(), cwd=REPO)
    assert table.returncode == 0, table.stderr
    seen = re.search(r"not seen for (\d+)s", table.stdout)
    assert seen and int(seen.group(1)) < 60, table.stdout

    res = subprocess.run(_cli("resume", run_id, "--db", pg_url), capture_output=True, text=True, timeout=300,
                         env=_env(), cwd=tmp_path, start_new_session=True)
    assert res.returncode == 0, res.stdout + res.stderr
    run = idx.get_run(run_id)
    assert run.state == "done" and run.counts == {"done": 5}, run
    states = attempt_states(idx, run_id)
    assert states["lost"] >= 1 and "running" not in states  # the killed driver's cell was requeued
    assert all(a.finished_at >= a.started_at for a in idx.run_attempts(run_id))
    idx.close()


def _command_lines() -> list[str]:
    """Every process's argument list on this machine, as ``ps -eo args`` shows them (from /proc)."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # ended meanwhile
            pass
    return lines


def test_a_detached_run_keeps_the_database_password_out_of_the_process_table(pg, tmp_path):
    from typer.testing import CliRunner

    from kdeval.cli.app import app

    password = f"Pw{uuid.uuid4().hex}"
    url = pg.create_database(f"kdeval_{uuid.uuid4().hex[:10]}").replace(
        "postgresql://postgres@", f"postgresql+psycopg://postgres:{password}@")  # the server trusts loopback
    grid = tmp_path / "grid.yaml"
    # 5 cells, one at a time (alone: a group would finish them all at once)
    grid.write_text(stub_grid(cost=1.0, workers=1) + "execution: {share: false}\n")
    r = CliRunner().invoke(app, ["submit", str(grid), "--db", url, "--results-dir", str(tmp_path / "res"),
                                 "--detach"], env=_env())
    assert r.exit_code == 0, r.output
    pid = int(re.search(r"pid (\d+)", r.output).group(1))
    idx = RunIndex.open(url)
    try:
        run_id = idx.list_runs()[0].id
        wait_until(lambda: idx.run_cells(run_id, states=["done"]) and idx.run_cells(run_id, states=["running"]),
                   120, "a cell done and one running")
        lines = _command_lines()
        driver = [ln for ln in lines if f"resume {run_id}" in ln]
        assert len(driver) == 1 and " --db" not in driver[0], driver  # the detached driver, its index elsewhere
        assert any("ray" in ln.lower() for ln in lines)  # its local Ray is up too
        assert [ln for ln in lines if password in ln] == []
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30)
        assert ps.returncode == 0 and password not in ps.stdout
        assert idx.get_run(run_id).driver_pid == pid  # the driver that got the URL some other way runs the run
    finally:
        stop_background(pid)
        idx.close()


def test_a_lost_database_server_is_one_line_and_leaves_the_run_resumable(tmp_path):
    server, why = pg_server.start()  # a server of its own: this test stops it mid-run
    if server is None:
        pytest.skip(why)
    try:
        url = server.create_database("lost")
        grid = tmp_path / "grid.yaml"
        grid.write_text(stub_grid(cost=0.3, workers=1))
        driver = subprocess.Popen(_cli("submit", str(grid), "--db", url, "--results-dir", str(tmp_path / "res")),
                                  env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                  start_new_session=True)
        idx = RunIndex.open(url)
        wait_until(lambda: idx.list_runs() and idx.run_attempts(idx.list_runs()[0].id), 120, "a first attempt")
        run_id = idx.list_runs()[0].id
        idx.close()
    except BaseException:
        server.stop()
        raise
    server.stop()
    try:
        _, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
    assert driver.returncode == 1 and "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1].startswith(f"error: the index at {url} failed: lost the connection to the "
                                              "database ("), stderr
    assert stderr.splitlines()[-1].endswith(f"`kdeval resume {run_id}` continues it once the index can be written")
