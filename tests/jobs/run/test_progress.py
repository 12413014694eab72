"""Progress people can follow: samples done / total with ETAs per run and per running cell; plain lines in
a log at least every 30 s or every 10%; the CLI's output when stderr is not a terminal."""
from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

from kdeval.cli.progress import PlainProgress, RichProgress, format_eta, progress_line
from kdeval.jobs.run.progress import CellProgress, RunProgress

from tests.support.helpers import stub_grid


def _progress() -> RunProgress:
    p = RunProgress(total=4, samples_total=100, computing_since=0.0)
    p.cells = {"a": CellProgress("a keydiff", 40, samples_done=10, shards_running=3),
               "b": CellProgress("b full", 20, samples_done=0, shards_running=1)}
    return p


def test_etas_from_the_rate_of_samples_computed_here():
    p = _progress()
    assert p.rate(10.0) is None and p.eta_s(10.0) is None and p.cell_eta_s("a", 10.0) is None  # nothing yet
    p.samples_done, p.samples_computed = 30, 20  # 10 of them reused: done, not computed here
    assert p.rate(10.0) == 2.0 and p.eta_s(10.0) == 35.0  # 70 left at 2 samples/s
    assert p.cell_eta_s("a", 10.0) == 30 / (2.0 * 3 / 4)  # a's share: 3 of the 4 shards in flight
    assert p.cell_eta_s("b", 10.0) == 20 / (2.0 * 1 / 4)
    p.cells["b"].shards_running = 0
    assert p.cell_eta_s("b", 10.0) is None  # queued, not running
    p.samples_done = 100
    assert p.eta_s(10.0) == 0.0
    assert [format_eta(x) for x in (None, 5.4, 65, 3725)] == ["?", "0:05", "1:05", "1:02:05"]


def test_plain_lines_at_start_every_tenth_and_at_least_every_30s():
    buf = io.StringIO()
    clock = [0.0]
    shown = PlainProgress(Console(file=buf, width=300), "R1", describe=lambda rid: f"run {rid} (pid 7)",
                          clock=lambda: clock[0])
    p = RunProgress(total=2, samples_total=200, computing_since=0.0)

    def step(t: float, done: int) -> int:
        clock[0] = t
        p.samples_done = p.samples_computed = done
        before = buf.getvalue().count("\n")
        shown.update(p)
        return buf.getvalue().count("\n") - before

    assert step(0.0, 0) == 1  # the first call
    assert step(1.0, 10) == 0  # 5%: not yet
    assert step(2.0, 20) == 1  # 10%
    assert step(3.0, 39) == 0
    assert step(32.5, 39) == 1  # 30 s since the last line, even without progress
    assert step(33.0, 100) == 1  # 50%: one line, not one per tenth crossed
    p.waiting = {"R0": 2}
    assert step(34.0, 100) == 1 and "waiting for 2 cell(s) held by run R0 (pid 7)" in buf.getvalue()
    assert step(35.0, 100) == 0  # said once while it does not change
    shown.close(p)
    lines = buf.getvalue().splitlines()
    assert lines[1] == "run R1: samples 20/200 (10%), cells 0/2 done, 0 failed, 0 running, ETA 0:18"  # 10/s
    assert lines[2].startswith("run R1: samples 39/200 (19%), ")


def test_terminal_bars_follow_the_running_cells():
    buf = io.StringIO()
    bars = RichProgress(Console(file=buf, force_terminal=True, width=200), "R1", describe=lambda rid: rid)
    p = _progress()
    with bars:
        bars.update(p)
        assert set(bars.cells) == {"a", "b"}
        del p.cells["a"]
        bars.update(p)
        assert set(bars.cells) == {"b"} and len(bars.bar.tasks) == 2  # the run's bar and b's
        bars.close(p)
    assert "samples" in buf.getvalue()


def test_submit_in_a_log_prints_plain_progress_lines(local_ray, app, paths):
    grid = paths["tmp"] / "grid.yaml"
    grid.write_text(stub_grid())
    r = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"])])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ": samples " in ln]
    assert lines[0].endswith("samples 0/15 (0%), cells 0/5 done, 0 failed, 0 running, ETA ?")
    assert "samples 15/15 (100%), cells 5/5 done, 0 failed, 0 running, ETA 0:00" in lines[-1]
    empty = RunProgress(total=0)
    assert progress_line("x", empty) == "run x: samples 0/0 (100%), cells 0/0 done, 0 failed, 0 running, ETA 0:00"
