"""One driver per cell: leases in the index, waiting for cells (and runs) a live driver holds, taking over
from a dead one, and two submits of one grid started together (two driver processes on one Ray cluster)."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service
from kdeval.storage import AttemptState, CellRecord, RunIndex, list_temp_files, verify_cell
from tests.user_env import sandbox_ray, user_env

from tests.support.helpers import stub_grid
from tests.support.helpers import assert_results_consistent, attempt_states, new_run, wait_until



def _records(n: int) -> list[CellRecord]:
    return [CellRecord(id=f"cell{i:02d}", spec={"i": i}, model="m", policy="keydiff", budget=64,
                       chunk_size=32, task="needle") for i in range(n)]


def test_a_cell_has_one_holder_and_only_a_dead_ones_attempts_become_lost(paths):
    idx = RunIndex.open(paths["db"])
    for rid in ("r1", "r2"):
        idx.create_run(rid, name=rid, grid_yaml="", grid_hash="h", results_dir=str(paths["results"]),
                       kdeval_version="0", cells=_records(2))
    assert idx.claim_cell("cell00", "r1") is None and idx.claim_cell("cell00", "r1") is None  # re-entrant
    assert idx.claim_cell("cell00", "r2") == "r1" and idx.holds("cell00", "r1")
    with pytest.raises(LookupError, match="no cell nope"):
        idx.claim_cell("nope", "r1")
    a0 = idx.start_attempt("r1", "cell00", "w0", "n", shard=0)
    a1 = idx.start_attempt("r1", "cell00", "w1", "n", shard=1)
    assert [(a.shard, a.number) for a in idx.cell_attempts("cell00")] == [(0, 1), (1, 1)]
    idx.finish_attempt_failed(a0, state=AttemptState.LOST, error="worker died", final=False)
    assert idx.get_cell("cell00").state == "running"  # shard 1 still runs
    a0b = idx.start_attempt("r1", "cell00", "w0", "n", shard=0)
    assert idx.get_cell("cell00").n_attempts == 2  # the most any shard took

    # another run's resume touches none of r1's attempts or cells
    assert idx.recover_orphans("r2") == 0
    assert idx.reset_cells(["cell00"], [service.CellState.RUNNING]) == 0  # held: left to its driver
    assert [a.state for a in idx.cell_attempts("cell00")] == ["lost", "running", "running"]

    # r1's driver died: r2 takes the cell over; r1's running attempts are lost, r1 can store nothing more
    assert idx.claim_cell("cell00", "r2", takeover=["r1"]) is None
    assert [a.state for a in idx.cell_attempts("cell00")] == ["lost", "lost", "lost"]
    assert "driver of run r1 died" in idx.cell_attempts("cell00")[1].error
    assert not idx.finish_shard(a1, shard_size=2, start=2, stop=4, results_dir="x", result_path="p", n_rows=2,
                                duration_s=1.0, peak_memory_bytes=None, worker="w1", node="n")
    assert not idx.finish_cell("cell00", "r1", results_dir="x", result_path="p", n_rows=2, summary={},
                               duration_s=1.0, peak_memory_bytes=None, worker=None, node=None)
    assert idx.cell_shards("cell00") == [] and a0b

    # a shard stored by the holder is recorded; giving the cell back makes it pending
    a2 = idx.start_attempt("r2", "cell00", "w9", "n", shard=1)
    assert idx.finish_shard(a2, shard_size=2, start=2, stop=4, results_dir="x", result_path="p", n_rows=2,
                            duration_s=1.0, peak_memory_bytes=7, worker="w9", node="n")
    assert [(s.shard, s.start, s.stop, s.run_id) for s in idx.cell_shards("cell00")] == [(1, 2, 4, "r2")]
    assert idx.release_cells("r2") == 1
    cell = idx.get_cell("cell00")
    assert (cell.state, cell.held_by) == ("pending", None)
    assert idx.drop_shards("cell00") == 1 and idx.cell_shards("cell00") == []


def test_taking_a_run_is_atomic(paths):
    idx = RunIndex.open(paths["db"])
    idx.create_run("r1", name="r1", grid_yaml="", grid_hash="h", results_dir=str(paths["results"]),
                   kdeval_version="0", cells=_records(1))
    assert idx.start_driver("r1", "h", 2, expect=(None, None))  # a new run: nobody drove it
    # two resumes both saw driver 2 dead: the first takes the run, the second is told it lost the race
    assert idx.start_driver("r1", "h", 3, expect=("h", 2))
    assert not idx.start_driver("r1", "h", 4, expect=("h", 2))
    assert (idx.get_run("r1").driver_host, idx.get_run("r1").driver_pid) == ("h", 3)


@pytest.fixture
def fake_driver():
    """A live process standing in for another run's driver (killed at the end)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def _hold(idx: RunIndex, run_id: str, cells: list[str], pid: int) -> int:
    """Make ``run_id`` a live run (driver ``pid``) holding ``cells``, with an attempt running at the first."""
    idx.start_driver(run_id, socket.gethostname(), pid)
    for cid in cells:
        assert idx.claim_cell(cid, run_id) is None
    return idx.start_attempt(run_id, cells[0], "w0", "n", shard=0)


def test_cells_a_live_driver_holds_are_waited_for_then_taken_over_when_it_dies(local_ray, paths, fake_driver):
    idx, run1, plan = new_run(paths["db"], paths["results"], stub_grid())
    _, run2, _ = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    held = [c.id for c in plan.cells[:2]]
    att = _hold(idx, run1, held, fake_driver.pid)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(out=service.execute_run(idx, run2, workload=StubWorkload())))
    t.start()

    def others_done() -> bool:
        idx.heartbeat(run1)  # the stand-in driver stays alive
        return idx.get_run(run2).counts.get("done", 0) >= 3

    wait_until(others_done, 60, "the 3 cells nobody holds to be done")
    time.sleep(1.5)  # the second driver now only waits
    assert t.is_alive()
    assert [a.state for a in idx.run_attempts(run1)] == ["running"]  # never marked lost while alive
    assert {c.id: c.held_by for c in idx.run_cells(run2) if c.id in held} == {held[0]: run1, held[1]: run1}
    assert all(a.cell_id not in held for a in idx.run_attempts(run2))

    fake_driver.kill()  # the holder dies: its cells are taken over
    fake_driver.wait(timeout=10)
    t.join(timeout=60)
    assert not t.is_alive(), "the second driver did not finish"
    out = result["out"]
    assert (out.done, out.failed, out.left, out.attempts) == (5, 0, 0, 5)
    assert [a.state for a in idx.run_attempts(run1)] == ["lost"] and idx.cell_attempts(held[0])[0].id == att
    assert idx.get_run(run2).state == "done"
    assert_results_consistent(idx, run2, paths["results"], samples=3)


def test_no_wait_leaves_held_cells_and_names_the_run_holding_them(local_ray, paths, fake_driver):
    idx, run1, plan = new_run(paths["db"], paths["results"], stub_grid())
    _, run2, _ = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    held = [c.id for c in plan.cells[:2]]
    _hold(idx, run1, held, fake_driver.pid)
    out = service.execute_run(idx, run2, workload=StubWorkload(), wait=False)
    assert (out.done, out.failed, out.left) == (3, 0, 2)
    assert f"2 cell(s) held by run {run1} (pid {fake_driver.pid} on {socket.gethostname()}" in out.message
    run = idx.get_run(run2)
    assert run.state == "failed" and f"held by run {run1}" in run.message
    assert [a.state for a in idx.run_attempts(run1)] == ["running"]
    assert all(idx.get_cell(cid).held_by == run1 for cid in held)


def test_resume_waits_for_the_runs_live_driver(local_ray, paths, fake_driver):
    idx, run_id, _ = new_run(paths["db"], paths["results"], stub_grid())
    assert service.execute_run(idx, run_id, workload=StubWorkload()).done == 5
    idx.start_driver(run_id, socket.gethostname(), fake_driver.pid)  # "another driver" runs it again
    said: list[str] = []
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        out=service.execute_run(idx, run_id, workload=StubWorkload(), on_wait=said.append)))
    t.start()
    wait_until(lambda: said, 10, "the waiting message")
    time.sleep(1.5)
    assert t.is_alive() and idx.get_run(run_id).driver_pid == fake_driver.pid
    assert said == [f"run {run_id} (pid {fake_driver.pid} on {socket.gethostname()}, heartbeat 0s ago) is "
                    "running this run: waiting for it to finish (--no-wait: do not wait)"]
    fake_driver.kill()
    fake_driver.wait(timeout=10)
    t.join(timeout=30)
    assert not t.is_alive() and result["out"].attempts == 0  # nothing left to do: every cell was done
    assert idx.get_run(run_id).state == "done"


GRID_FILE = """
name: shared-grid
models: ["stub:0.15"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 6, params: {depths: [0, 20, 40, 60, 80, 100]}}]
resources: {workers: 2, shard_size: 2}
"""  # 5 cells x 3 shards


@pytest.fixture
def cluster4():
    """A simulated cluster (loopback) of one 4-CPU node; the test process is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    sandbox_ray()
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=4, include_dashboard=False))
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def test_two_submits_of_one_grid_started_together_compute_each_shard_once(cluster4, paths):
    grid = paths["tmp"] / "grid.yaml"
    grid.write_text(GRID_FILE)
    db, results = paths["db"], paths["results"]
    RunIndex.open(db).close()  # the index exists before both start
    env = user_env()
    cmd = [sys.executable, "-m", "kdeval.cli.service_cmds", "submit", str(grid), "--db", str(db),
           "--results-dir", str(results), "--address", cluster4.address]
    logs = [open(paths["tmp"] / f"driver{i}.log", "wb") for i in range(2)]
    procs = [subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=paths["tmp"]) for log in logs]
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p, log in zip(procs, logs):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
            log.close()
    outputs = [(paths["tmp"] / f"driver{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], outputs

    idx = RunIndex.open(db)
    runs = idx.list_runs()
    assert len(runs) == 2 and all(r.state == "done" and r.counts == {"done": 5} for r in runs)
    attempts = [a for r in runs for a in idx.run_attempts(r.id)]
    assert Counter(a.state for a in attempts) == {"done": 15}  # every shard exactly once, nothing lost
    assert Counter((a.cell_id, a.shard) for a in attempts) == {
        (c.id, s): 1 for c in idx.run_cells(runs[0].id) for s in range(3)}
    for cell in idx.run_cells(runs[0].id):
        assert cell.held_by is None and cell.n_rows == 6 and verify_cell(cell) is None
    assert list_temp_files(results) == []
    assert all("samples" in text for text in outputs)  # plain progress lines (stderr is not a terminal)
    assert sum(attempt_states(idx, r.id)["done"] for r in runs) == 15


def test_an_index_and_results_from_before_shards_are_upgraded_and_reused(local_ray, paths):
    import shutil

    from sqlalchemy import text

    from kdeval.jobs.interop.export import run_table
    from kdeval.storage import migrate, write_cell_rows

    res = paths["results"]
    # one worker: each cell's 3 samples in one shard (two would split the group over them:
    # tests/jobs/run/test_spread.py)
    idx, run_id, plan = new_run(paths["db"], res, stub_grid(workers=1))
    assert service.execute_run(idx, run_id, workload=StubWorkload()).done == 5
    old, redo = [c.id for c in plan.cells[:2]], [c.id for c in plan.cells[2:]]
    with idx.engine.begin() as conn:  # what older kdeval left: one file per done cell, no shards, no leases
        for cid in old:
            table = idx.read_cell_table(cid)
            shutil.rmtree(res / f"cells/{cid[:2]}/{cid}")
            rel = write_cell_rows(res, cid, table)
            conn.execute(text("UPDATE cells SET result_path=:p WHERE id=:c"), {"p": rel, "c": cid})
        for cid in redo:  # never computed
            shutil.rmtree(res / f"cells/{cid[:2]}/{cid}")
            conn.execute(text("UPDATE cells SET state='pending', result_path=NULL, n_rows=NULL WHERE id=:c"),
                         {"c": cid})
        conn.execute(text("DELETE FROM attempts WHERE cell_id IN (:a, :b, :c)"), dict(zip("abc", redo)))
        conn.execute(text("DROP TABLE cell_shards"))
        conn.execute(text("ALTER TABLE cells DROP COLUMN held_by"))
        conn.execute(text("ALTER TABLE attempts DROP COLUMN shard"))
    digests = {cid: (res / f"cells/{cid[:2]}/{cid}.parquet").read_bytes() for cid in old}
    idx.close()

    idx = RunIndex.open(paths["db"])  # the new code opens it: columns and table added, data kept
    assert migrate.missing_columns(idx.engine) == [] and [a.shard for a in idx.cell_attempts(old[0])] == [None]
    assert all(verify_cell(idx.get_cell(cid)) is None for cid in old)
    out = service.execute_run(idx, run_id, workload=StubWorkload())
    assert (out.done, out.attempts) == (3, 3) and idx.get_run(run_id).state == "done"
    assert {cid: (res / f"cells/{cid[:2]}/{cid}.parquet").read_bytes() for cid in old} == digests  # reused
    assert all(idx.get_cell(cid).result_path == f"cells/{cid[:2]}/{cid}" for cid in redo)
    export = run_table(idx, run_id)
    assert export.complete and export.table.num_rows == 15


def test_a_driver_whose_cell_is_taken_over_stores_nothing_more_of_it(local_ray, paths):
    from tests.jobs.run.test_shards import one_cell

    idx, run_id, plan = new_run(paths["db"], paths["results"], one_cell(samples=8, workers=1, shard_size=2))
    (cell,) = plan.cells
    stolen: list[int] = []

    def steal_after_first_shard(p) -> None:  # as a driver that judged this one dead would
        if p.samples_done >= 2 and not stolen:
            assert idx.claim_cell(cell.id, "other-run", takeover=[run_id]) is None
            stolen.append(len(idx.cell_attempts(cell.id)))

    out = service.execute_run(idx, run_id, workload=StubWorkload(cost_per_sample_s=0.2),
                              on_progress=steal_after_first_shard)
    assert (out.done, out.failed, out.left) == (0, 0, 1)
    attempts = idx.cell_attempts(cell.id)
    assert len(attempts) <= stolen[0] + 1  # at most the shard dispatched as it happened; then it stops
    assert [(a.shard, a.state) for a in attempts][0] == (0, "done")
    assert [s.shard for s in idx.cell_shards(cell.id)] == [0]  # nothing stored after the takeover
    for a in attempts[1:]:  # in flight at the takeover (lost) or started just after it (its result discarded)
        assert (a.state, a.error) in {("lost", f"the driver of run {run_id} died while the attempt was running"),
                                      ("failed", "result discarded: another driver took the cell over")}
    view = idx.get_cell(cell.id)
    assert (view.state, view.held_by) == ("running", "other-run")  # left to its new holder
    assert idx.get_run(run_id).state == "failed"


def test_a_second_driver_takes_over_the_cells_a_sigkilled_driver_held(local_ray, paths):
    """A real driver (``kdeval submit``, its own local Ray) is SIGKILLed holding a running cell; a second run of
    the same grid takes that cell over at once (the holder's pid is gone), reuses what it finished and computes
    the rest: each cell done once, the killed driver's attempt lost, nothing held, no temp file."""
    import os
    import signal

    grid = paths["tmp"] / "grid.yaml"
    # alone: a group of the 5 would finish them all at once, leaving no moment with one done and one running
    grid.write_text(stub_grid(cost=1.0, workers=1) + "execution: {share: false}\n")
    log = open(paths["tmp"] / "driver.log", "wb")
    first = subprocess.Popen([sys.executable, "-m", "kdeval.cli.app", "submit", str(grid), "--db", str(paths["db"]),
                              "--results-dir", str(paths["results"])], env=user_env(), stdout=log,
                             stderr=subprocess.STDOUT, cwd=paths["tmp"], start_new_session=True)
    try:
        wait_until(lambda: paths["db"].exists() and RunIndex.open(paths["db"]).list_runs(), 120, "the run")
        idx = RunIndex.open(paths["db"])
        run1 = idx.list_runs()[0].id
        wait_until(lambda: idx.run_cells(run1, states=["done"]) and idx.run_cells(run1, states=["running"]), 120,
                   "a cell done and one running")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and the local Ray it started
        first.wait(timeout=30)
        log.close()
    held = {c.id for c in idx.run_cells(run1) if c.held_by == run1}
    finished = {c.id for c in idx.run_cells(run1, states=["done"])}
    assert held and not held & finished, (held, finished)

    _, run2, _ = new_run(paths["db"], paths["results"], grid.read_text())  # the same cells
    out = service.execute_run(idx, run2, workload=StubWorkload(), wait=False)  # no waiting: the holder is dead
    assert (out.done, out.failed, out.left) == (5 - len(finished), 0, 0), out  # the rest is reused
    assert (idx.get_run(run2).state, idx.get_run(run2).counts) == ("done", {"done": 5})
    assert {a.state for a in idx.run_attempts(run1) if a.cell_id in held} == {"lost"}
    assert not {a.cell_id for a in idx.run_attempts(run2)} & finished  # what the dead driver finished is reused
    assert {c.held_by for c in idx.run_cells(run2)} == {None}
    assert_results_consistent(idx, run2, paths["results"], samples=3)
    idx.close()
