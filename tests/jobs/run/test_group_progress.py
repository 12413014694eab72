"""A running group says how far it has got: the worker counts the samples every cell of its group has finished,
the driver asks it while the group runs (kdeval/jobs/run/group_probe.py), and progress shows them as in flight
until the group's rows are stored."""
from __future__ import annotations

import time
from dataclasses import dataclass

from kdeval.cli.progress import progress_line
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service
from kdeval.jobs.run.progress import CellProgress, RunProgress
from tests.support.helpers import new_run

GRID = """
name: group-progress
models: ["stub:0"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 8, params: {depths: [0, 15, 30, 45, 55, 70, 85, 100]}}]
resources: {workers: 1, cpus_per_worker: 0.5}
"""


@dataclass(frozen=True)
class HalfwayStub(StubWorkload):
    """Every cell of the group but ``full`` finishes half of its samples, says so, and takes ``pause_s`` over
    the rest."""

    pause_s: float = 3.0

    def run_group(self, handle, tasks, on_samples=None, on_result=None):
        half = {i: 0 if t.policy == "full" else len(range(t.samples)[t.shard_slice]) // 2 for i, t in enumerate(tasks)}
        for i, n in half.items():
            on_samples(i, n)
        time.sleep(self.pause_s)
        out = super().run_group(handle, tasks)
        for i, res in enumerate(out):
            on_samples(i, len(res.rows) - half[i])
        return out


def test_a_running_group_shows_the_samples_its_cells_finished(local_ray, paths):
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID)
    seen = []
    out = service.execute_run(idx, run_id, workload=HalfwayStub(), on_progress=lambda p: seen.append(
        (p.samples_done, p.samples_in_flight, p.samples_finished,
         sorted((" full " in c.label, c.samples_finished) for c in p.cells.values()))))
    assert (out.done, out.failed) == (5, 0)
    halfway = (0, 16, 16, [(False, 4)] * 4 + [(True, 0)])  # 4 cells x 4 samples finished (not full's), none stored
    assert halfway in seen, seen
    assert seen[-1][:3] == (40, 0, 40)  # stored: nothing left in flight
    finished = [s[2] for s in seen]
    assert finished == sorted(finished)  # never counted twice, never backwards


def test_progress_lines_count_what_running_groups_finished():
    p = RunProgress(total=5, samples_total=40, computing_since=0.0, samples_in_flight=20)
    p.cells = {"a": CellProgress("a keydiff", 8, shards_running=1, samples_in_flight=4)}
    assert "samples 20/40 (50%)" in progress_line("R", p, now=10.0)
    assert p.rate(10.0) == 2.0 and p.eta_s(10.0) == 10.0  # 20 finished in 10 s, 20 left
    assert p.cells["a"].samples_left == 4
    p.samples_done, p.samples_in_flight = 40, 0
    assert p.samples_finished == 40 and p.eta_s(10.0) == 0.0
