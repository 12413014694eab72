"""The scheduler on a local Ray with the stub workload: completion, reuse, failures, timeouts, cancel."""
from __future__ import annotations

import threading
import time

from kdeval.cluster.stub import StubWorkload
from kdeval.jobs.run import service

from tests.support.helpers import stub_grid
from tests.support.helpers import assert_results_consistent, attempt_states, new_run, result_file


def test_run_completes_and_resubmit_runs_zero_cells(local_ray, paths):
    # one worker: each cell's 3 samples in one shard (two would split the group over them:
    # tests/jobs/run/test_spread.py)
    idx, run_id, plan = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    assert (len(plan.cells), len(plan.to_run)) == (5, 5)
    out = service.execute_run(idx, run_id, workload=StubWorkload())
    assert (out.done, out.failed, out.left, out.attempts) == (5, 0, 0, 5)
    assert out.model_loads == 1  # one model x one worker, never once per cell
    run = idx.get_run(run_id)
    assert run.state == "done" and run.counts == {"done": 5}
    assert run.message.startswith("5 done, 0 failed in 5 attempts; ")
    assert attempt_states(idx, run_id) == {"done": 5}
    assert_results_consistent(idx, run_id, paths["results"], samples=3)
    mtimes = {c.id: result_file(paths["results"], c).stat().st_mtime_ns for c in idx.run_cells(run_id)}

    idx2, run2, plan2 = new_run(paths["db"], paths["results"], stub_grid(workers=1))  # same cells
    assert (len(plan2.cells), len(plan2.to_run)) == (5, 0)
    out2 = service.execute_run(idx2, run2, workload=StubWorkload())
    assert (out2.done, out2.attempts) == (0, 0)
    assert idx2.get_run(run2).state == "done" and idx2.get_run(run2).counts == {"done": 5}
    assert len(idx2.run_attempts(run2)) == 0
    assert {c.id: result_file(paths["results"], c).stat().st_mtime_ns for c in idx.run_cells(run2)} == mtimes


def test_raising_cell_fails_with_message_others_done(local_ray, paths):
    idx, run_id, _ = new_run(paths["db"], paths["results"], stub_grid())
    # each cell alone: a cell's own error in a group is tests/jobs/run/test_groups.py's
    out = service.execute_run(idx, run_id, share=False, workload=StubWorkload(fail_policies=("keydiff-mean",),
                                                                              oom_policies=("keydiff",)))
    assert (out.done, out.failed, out.left) == (1, 4, 0)
    run = idx.get_run(run_id)
    assert run.state == "failed" and run.counts == {"done": 1, "failed": 4}
    for cell in idx.run_cells(run_id):
        if cell.policy == "keydiff-mean":
            assert cell.state == "failed" and "stub failure injected for policy 'keydiff-mean'" in cell.error_line
        elif cell.policy == "keydiff":
            assert cell.state == "failed" and "out of memory" in cell.error_line
        else:
            assert cell.state == "done"
        assert cell.n_attempts == 1  # a cell's own error is not retried
    assert attempt_states(idx, run_id) == {"done": 1, "failed": 4}
    assert_results_consistent(idx, run_id, paths["results"], samples=3)


def test_cell_timeout_replaces_worker_and_caps_attempts(local_ray, paths):
    text = stub_grid(workers=1).replace("policies: [full, keydiff, keydiff-mean]", "policies: [full]")
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)
    out = service.execute_run(idx, run_id, workload=StubWorkload(cost_s=30.0), cell_timeout_s=0.5,
                              max_attempts=2)
    assert (out.done, out.failed, out.attempts) == (0, 1, 2)
    assert attempt_states(idx, run_id) == {"timeout": 2}
    cell = idx.run_cells(run_id)[0]
    assert cell.state == "failed" and "gave up after 2 attempts" in cell.error


def test_cancel_then_resume_finishes_without_recomputing(local_ray, paths):
    idx, run_id, _ = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    timer = threading.Timer(2.0, service.cancel_run, args=(idx, run_id))
    timer.start()
    out = service.execute_run(idx, run_id, workload=StubWorkload(cost_s=0.6))
    timer.join()
    assert out.cancelled and out.done < 5
    run = idx.get_run(run_id)
    assert run.state == "cancelled" and run.counts.get("running", 0) == 0
    done_before = {c.id for c in idx.run_cells(run_id, states=["done"])}
    assert len(done_before) == out.done

    out2 = service.execute_run(idx, run_id, workload=StubWorkload(cost_s=0.01))
    assert out2.done == 5 - len(done_before) and idx.get_run(run_id).state == "done"
    for cell in idx.run_cells(run_id):
        if cell.id in done_before:
            assert [a.state for a in idx.cell_attempts(cell.id)] == ["done"]
    assert_results_consistent(idx, run_id, paths["results"], samples=3)


def test_no_worker_can_start_reports_why(local_ray, paths):
    text = stub_grid(workers=1) + "resources: {workers: 1, gpus_per_worker: 1, accelerator_type: A100}\n"
    text = text.replace("resources: {workers: 1}\n", "")
    idx, run_id, _ = new_run(paths["db"], paths["results"], text)
    t0 = time.monotonic()
    out = service.execute_run(idx, run_id, workload=StubWorkload(), worker_start_timeout_s=1.5)
    assert time.monotonic() - t0 < 30
    assert out.left == 5 and out.done == 0 and "no GPU in the cluster" in out.message
    run = idx.get_run(run_id)
    assert run.state == "failed" and "no worker could start" in run.message
    assert run.counts == {"pending": 5}


def test_model_affinity_loads_each_model_once_per_worker(local_ray, paths):
    text = stub_grid(workers=2).replace('models: ["stub:0.02"]', 'models: ["stub:0.02", "stub:0.03"]')
    idx, run_id, plan = new_run(paths["db"], paths["results"], text)
    assert len(plan.cells) == 10
    out = service.execute_run(idx, run_id, workload=StubWorkload())
    assert (out.done, out.attempts) == (10, 10)
    assert out.model_loads <= 2 * 2  # workers x models, not cells
    assert all(n <= 2 for n in out.model_loads_by_worker.values())


def test_pick_prefers_held_model_and_does_not_steal_a_cell_its_holder_will_take():
    from collections import deque

    from kdeval.cluster.workload import WorkerInfo
    from kdeval.jobs.grid.cells import expand
    from kdeval.jobs.grid.load import parse_grid
    from kdeval.jobs.run.affinity import WorkerSlot, pick_model

    cells = expand(parse_grid(stub_grid().replace('models: ["stub:0.02"]', 'models: ["stub:1", "stub:2"]')))
    a, b = cells[0].model_key, cells[5].model_key
    queue: dict[str, deque] = {}
    for c in cells:
        queue.setdefault(c.model_key, deque()).append(c)
    info = WorkerInfo("w", "n")
    w0, w1 = WorkerSlot("w0", None, info=info), WorkerSlot("w1", None, info=info)
    workers = [w0, w1]
    assert pick_model(queue, w0, workers) == a  # nobody holds anything: the first model
    queue[a].popleft()
    w0.loaded_key, w0.busy = a, True
    assert pick_model(queue, w1, workers) == b  # the model nobody holds
    w1.loaded_key = b
    while queue[b]:
        assert pick_model(queue, w1, workers) == b  # its own model first
        queue[b].popleft()
    queue[a] = deque(list(queue[a])[:1])  # one A cell left, its holder busy
    assert pick_model(queue, w1, workers) is None  # wait: w0 takes it next, loading A on w1 would cost more
    queue[a].append(cells[1])  # two A cells queued, one holder: worth a second copy
    assert pick_model(queue, w1, workers) == a
    w0.alive = False
    assert pick_model(queue, w1, workers) == a  # a dead holder holds nothing
    queue[a].popleft()
    assert pick_model(queue, w1, workers) == a  # one A cell, and no live holder but w1 itself


def test_cells_finished_by_another_run_meanwhile_are_not_rerun(local_ray, paths):
    from kdeval.jobs.grid.cells import CellSpec
    from kdeval.jobs.run.run_config import SchedulerConfig
    from kdeval.jobs.run.scheduler import Scheduler

    # one worker: each cell's 3 samples in one shard (two would split the group over them:
    # tests/jobs/run/test_spread.py)
    idx, run1, _ = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    _, run2, plan2 = new_run(paths["db"], paths["results"], stub_grid(workers=1))
    assert len(plan2.to_run) == 5  # both runs planned before either ran
    todo2 = [CellSpec.model_validate(c.spec) for c in idx.run_cells(run2)]
    service.execute_run(idx, run1, workload=StubWorkload())
    sched = Scheduler(idx, run2, todo2, StubWorkload(), str(paths["results"]), SchedulerConfig(workers=1))
    out = sched.run()
    assert (out.done, out.attempts, sched.skipped_done) == (5, 0, 5)
    assert len(idx.run_attempts(run2)) == 0
    assert_results_consistent(idx, run1, paths["results"], samples=3)


def test_worker_process_crash_requeues_then_caps(local_ray, paths):
    idx, run_id, _ = new_run(paths["db"], paths["results"], stub_grid())
    # keydiff cells crash their worker process once, then succeed on a replacement worker (each cell alone: a
    # worker lost mid-group is tests/jobs/run/test_groups.py's)
    out = service.execute_run(idx, run_id, max_attempts=2, share=False, workload=StubWorkload(
        crash_policies=("keydiff",), crash_marker_dir=str(paths["tmp"])))
    assert (out.done, out.failed) == (5, 0) and out.workers_lost == 2
    assert attempt_states(idx, run_id) == {"done": 5, "lost": 2}
    for cell in idx.run_cells(run_id):
        assert cell.n_attempts == (2 if cell.policy == "keydiff" else 1)
    assert_results_consistent(idx, run_id, paths["results"], samples=3)

    paths2 = paths["tmp"] / "again"
    # one worker: each cell one shard, so a cell's cap is 2 attempts in all (test_spread.py splits over more)
    idx2, run2, _ = new_run(paths2 / "db.sqlite", paths2 / "res", stub_grid(workers=1).replace("[64, 128]", "[65]"))
    out = service.execute_run(idx2, run2, max_attempts=2, workload=StubWorkload(crash_policies=("keydiff-mean",)))
    assert (out.done, out.failed) == (2, 1)
    bad = [c for c in idx2.run_cells(run2) if c.state == "failed"]
    assert [c.policy for c in bad] == ["keydiff-mean"] and "gave up after 2 attempts" in bad[0].error
    assert [a.state for a in idx2.cell_attempts(bad[0].id)] == ["lost", "lost"]
