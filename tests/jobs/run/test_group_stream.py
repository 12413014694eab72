"""A group streams what its cells finish: each (cell, shard) whose samples are all done is written and marked done
while the group goes on, so a worker or driver killed mid-group loses only what was in flight (the rule without
Ray: :func:`take_group`'s span and :class:`GroupStreams`; with Ray: a worker SIGKILLed mid-group, then the driver
SIGKILLed mid-group and the run resumed, each (cell, sample) stored once and the recomputed samples counted)."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

from typer.testing import CliRunner

from kdeval.cluster.group_streams import GroupStreams
from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.grid.cells import expand
from kdeval.jobs.grid.load import parse_grid
from kdeval.jobs.run import service
from kdeval.jobs.run.groups import take_group
from kdeval.jobs.run.shards import Shard
from kdeval.storage import RunIndex
from tests.support.helpers import assert_results_consistent, new_run, stub_grid, wait_until
from tests.user_env import user_env

SAMPLES = 4

GRID = """
name: group-stream
models: ["stub:{cost}"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 4, params: {{depths: [10, 40, 60, 90]}}}}]
resources: {{workers: 1, cpus_per_worker: 0.5}}
retries: {{max_attempts: 3}}
"""  # 5 cells of 4 samples, one worker: one group of the 5 cells, its members run one after another


def _cells():
    return expand(parse_grid(stub_grid(cost=0)), version="t")


def test_a_group_spans_the_consecutive_shards_every_cell_has_queued():
    cells = _cells()  # 5 cells of 3 samples
    shards = {c.id: [Shard(c, 0, 0, 1), Shard(c, 1, 1, 2), Shard(c, 2, 2, 3)] for c in cells}
    queue = deque(sh for c in cells[1:] for sh in shards[c.id])
    queue.extend(shards[cells[0].id][1:])
    got = take_group(shards[cells[0].id][0], queue, lambda c: None, queue.appendleft, span=2)
    # ranges in order, the cells in order within a range: the worker runs samples 0-2 once for all five
    assert [(sh.cell.id, sh.start) for sh in got] == [(c.id, 0) for c in cells] + [(c.id, 1) for c in cells]
    assert sorted((sh.cell.id, sh.start) for sh in queue) == sorted((c.id, 2) for c in cells)
    # a cell lacking the second range (stored already, or to run alone) makes the group one range wide
    queue = deque(sh for c in cells[1:] for sh in shards[c.id] if (c is not cells[3] or sh.index != 1))
    queue.extend(shards[cells[0].id][1:])
    got = take_group(shards[cells[0].id][0], queue, lambda c: None, queue.appendleft, span=3)
    assert [(sh.cell.id, sh.start) for sh in got] == [(c.id, 0) for c in cells]
    alone = {(cells[2].id, 0)}
    queue = deque(sh for c in cells[1:] for sh in shards[c.id])
    got = take_group(shards[cells[0].id][0], queue, lambda c: None, queue.appendleft, alone, span=1)
    assert [sh.cell.id for sh in got] == [c.id for i, c in enumerate(cells) if i != 2]


def test_group_streams_hands_each_cell_shard_over_once_its_rows_are_all_in():
    cells = _cells()[:2]
    tasks = [dataclasses.replace(c.to_task(), shard=k, sample_start=a, sample_stop=b)
             for k, (a, b) in enumerate([(0, 2), (2, 3)]) for c in cells]
    handed, counted = [], Counter()
    streams = GroupStreams(tasks, [c.id for c in cells], ["s0", "s1", "s2"], 0,
                           on_samples=lambda k, n: counted.update({k: n}),
                           on_result=lambda k, res: handed.append((k, [r["id"] for r in res.rows], res.seconds)))
    streams.add(1, [{"id": "s1"}], 1.0)
    assert handed == []  # cell 1 has one of its first shard's two samples
    streams.add(1, [{"id": "s0"}, {"id": "s2"}], 2.0)  # its first shard done (rows in sample order), and its second
    assert handed == [(1, ["s0", "s1"], 2.0), (3, ["s2"], 1.0)]
    streams.add(0, [{"id": "s0"}, {"id": "s1"}, {"id": "s2"}], 3.0)
    assert [k for k, _, _ in handed] == [1, 3, 0, 2] and counted == {0: 2, 1: 2, 2: 1, 3: 1}
    assert [[r["id"] for r in res.rows] for res in streams.results()] == [["s0", "s1"], ["s0", "s1"], ["s2"], ["s2"]]


@dataclass(frozen=True)
class PidStub(StubWorkload):
    """:class:`StubWorkload` that writes its worker's process id to ``pid_file`` as a group starts."""

    pid_file: str = ""

    def run_group(self, handle, tasks, on_samples=None, on_result=None):
        with open(self.pid_file, "w", encoding="utf-8") as f:
            f.write(str(os.getpid()))
        return super().run_group(handle, tasks, on_samples, on_result)


def _group_running(reader: RunIndex, run_id: str, done: int) -> bool:
    """At least ``done`` cells done while the group's other attempts still run."""
    attempts = reader.run_attempts(run_id)
    return (reader.get_run(run_id).counts.get("done", 0) >= done
            and sum(a.state == "running" for a in attempts) >= 1)


def test_a_worker_killed_mid_group_loses_only_the_cells_in_flight(local_ray, paths):
    pid_file = paths["tmp"] / "worker.pid"
    idx, run_id, plan = new_run(paths["db"], paths["results"], GRID.format(cost=0))
    assert len(plan.cells) == 5
    result: dict = {}
    work = PidStub(cost_per_sample_s=0.4, pid_file=str(pid_file))  # 1.6 s a cell, 8 s the group
    t = threading.Thread(target=lambda: result.update(out=service.execute_run(idx, run_id, workload=work)))
    t.start()
    reader = RunIndex.open(paths["db"])
    try:
        # cells are marked done one by one while their group runs (status shows them finishing)
        wait_until(lambda: _group_running(reader, run_id, 2), 90, "2 cells of the group done, the group running")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
    finally:
        t.join(timeout=120)
    out = result["out"]
    assert (out.done, out.failed, out.left, out.workers_lost) == (5, 0, 0, 1)
    assert_results_consistent(idx, run_id, paths["results"], samples=SAMPLES)  # each (cell, sample) once
    attempts = {c.id: sorted((a.id, a.state) for a in idx.cell_attempts(c.id)) for c in plan.cells}
    kept = [cid for cid, a in attempts.items() if [s for _, s in a] == ["done"]]
    lost = [cid for cid, a in attempts.items() if [s for _, s in a] == ["lost", "done"]]
    assert len(kept) + len(lost) == 5 and 2 <= len(kept) <= 4, attempts
    recomputed = sum(SAMPLES for _ in lost)  # the lost group's unfinished cells ran again, alone
    assert recomputed == SAMPLES * (5 - len(kept)) <= 12  # before streaming: all 20 samples of the group
    assert all("in a group of 5 cells" in (a.error or "") for c in lost for a in idx.cell_attempts(c)
               if a.state == "lost")


def test_the_driver_killed_mid_group_then_resume_recomputes_nothing_done(local_ray, paths, app):
    import ray

    grid = paths["tmp"] / "grid.yaml"
    grid.write_text(GRID.format(cost=1.2))  # 1.2 s a cell: 6 s the group
    db, results = paths["db"], paths["results"]
    address = ray.get_runtime_context().gcs_address
    log = open(paths["tmp"] / "driver.log", "wb")
    driver = subprocess.Popen(
        [sys.executable, "-m", "kdeval.cli.service_cmds", "submit", str(grid), "--db", str(db),
         "--results-dir", str(results), "--address", address],
        env=user_env(), stdout=log, stderr=subprocess.STDOUT, cwd=paths["tmp"])
    try:
        wait_until(lambda: db.exists() and RunIndex.open(db).list_runs(), 60, "the run to be recorded")
        idx = RunIndex.open(db)
        run_id = idx.list_runs()[0].id
        wait_until(lambda: _group_running(idx, run_id, 2), 120, "2 cells of the group done, the group running")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        log.close()
    time.sleep(0.5)
    done_before = {c.id: c.finished_at for c in idx.run_cells(run_id, states=["done"])}
    assert 2 <= len(done_before) <= 4 and idx.get_run(run_id).state == "running"
    res = CliRunner().invoke(app, ["resume", run_id, "--db", str(db), "--address", address])
    assert res.exit_code == 0, res.output
    assert idx.get_run(run_id).counts == {"done": 5}
    assert_results_consistent(idx, run_id, results, samples=SAMPLES)
    resumed = Counter()
    for cell in idx.run_cells(run_id):
        states = [a.state for a in sorted(idx.cell_attempts(cell.id), key=lambda a: a.id)]
        if cell.id in done_before:  # stored mid-group: not recomputed
            assert states == ["done"] and cell.finished_at == done_before[cell.id]
        else:
            assert states == ["lost", "done"], states  # in flight when the driver died
            resumed[cell.id] += SAMPLES
    assert sum(resumed.values()) == SAMPLES * (5 - len(done_before))  # the samples recomputed
