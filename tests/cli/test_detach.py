"""``kdeval submit --detach`` (local): returns at once; a background driver finishes the run."""
from __future__ import annotations

import re
import time
from pathlib import Path

from typer.testing import CliRunner

from kdeval.storage import RunIndex

from tests.support.helpers import stub_grid
from tests.support.helpers import stop_background, wait_until


def test_detached_submit_finishes_in_background(app, paths, monkeypatch):
    monkeypatch.chdir(paths["tmp"])
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid(workers=1))
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]),
                                   "--results-dir", str(paths["results"]), "--detach"])
    assert res.exit_code == 0, res.output
    pid = int(re.search(r"pid (\d+)", res.output).group(1))
    try:
        idx = RunIndex.open(paths["db"])
        run_id = idx.list_runs()[0].id
        wait_until(lambda: idx.get_run(run_id).state in ("done", "failed"), 90, "the run to finish", every=0.3)
        run = idx.get_run(run_id)
        assert run.state == "done" and run.counts == {"done": 5}, run
        assert run.driver_pid == pid
    finally:
        stop_background(pid)
    assert time.monotonic() - t0 < 120


def test_a_background_driver_that_died_before_taking_its_run_reads_failed_with_its_last_log_line(app, paths):
    """Not ``pending`` for good: ``status`` and ``ls`` say the driver is gone, and what its log said last."""
    import socket
    import subprocess
    import sys

    from tests.support.helpers import new_run

    idx, run_id, _ = new_run(paths["db"], paths["results"], stub_grid())
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert idx.record_launch(run_id, socket.gethostname(), alive.pid)
        st = CliRunner().invoke(app, ["status", run_id, "--db", str(paths["db"])], env={"COLUMNS": "300"})
        assert f"run {run_id} (stub-grid, stub:0.02): pending" in " ".join(st.output.split()), st.output
    finally:
        alive.kill()
        alive.wait()
    (paths["results"] / f"driver-{run_id}.log").write_text("Traceback (most recent call last):\n"
                                                           "MemoryError: out of memory\n\n")
    st = CliRunner().invoke(app, ["status", run_id, "--db", str(paths["db"])], env={"COLUMNS": "300"})
    assert st.exit_code == 0, st.output
    said = " ".join(st.output.split())  # as read, whatever the terminal's width folded
    assert f"run {run_id} (stub-grid, stub:0.02): failed (driver gone)" in said, st.output
    assert (f"the background driver (pid {alive.pid} on {socket.gethostname()}) exited before it ran the run; its "
            f"log's last line: MemoryError: out of memory; `kdeval resume {run_id}` runs it") in said, st.output
    ls = CliRunner().invoke(app, ["ls", "--db", str(paths["db"])], env={"COLUMNS": "300"})  # one line per run
    assert re.search(rf"{run_id}\s+stub-grid\s+failed \(driver gone\)", ls.output), ls.output
    assert idx.get_run(run_id).state == "pending"  # status only reads the index
    idx.close()


def test_detach_to_a_job_server_that_cannot_take_it_is_one_line(tmp_path):
    """``--detach`` to an ``http://`` job server: Ray's job SDK missing (``ray[default]``) or nothing
    listening is one line on stderr, exit 1, and nothing recorded (no index, no staging directory left)."""
    import tempfile

    from kdeval.cli.app import app as kdeval_app

    grid = tmp_path / "g.yaml"
    grid.write_text("name: d\nmodels: ['stub:0.01']\npolicies: [full]\n"
                    "tasks: [{name: needle, lengths: [256], samples: 1}]\nchunk_sizes: [32]\n")
    staged = set(Path(tempfile.gettempdir()).glob("kdeval-job-*"))
    r = CliRunner().invoke(kdeval_app, ["submit", str(grid), "--detach", "--address", "http://127.0.0.1:9",
                                        "--db", str(tmp_path / "i.sqlite")], env={"COLUMNS": "400"})
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 1, r.output
    assert len(lines) == 1 and lines[0].startswith("error: --address: cannot submit a Ray job to "
                                                   "http://127.0.0.1:9: "), r.output
    assert lines[0].endswith("; nothing was recorded")
    assert not (tmp_path / "i.sqlite").exists()
    assert set(Path(tempfile.gettempdir()).glob("kdeval-job-*")) == staged
