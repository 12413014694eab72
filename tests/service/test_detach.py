"""``kdeval submit --detach`` (local): returns at once; a background driver finishes the run."""
from __future__ import annotations

import re
import time

from typer.testing import CliRunner

from kdeval.storage import RunIndex

from .conftest import stub_grid
from .helpers import stop_background, wait_until


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
