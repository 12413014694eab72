"""Reliability on a simulated multi-node cluster (``ray.cluster_utils.Cluster``, loopback only).

* a worker node killed mid-run: every cell ends done exactly once, no duplicate rows;
* the driver SIGKILLed mid-run, then ``kdeval resume``: finishes, nothing done is recomputed, no
  duplicates, leftover temp files are not counted; ``kdeval status`` read while the driver writes.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest
from typer.testing import CliRunner

from kdeval.jobs.run import service
from kdeval.storage import RunIndex
from tests.user_env import sandbox_ray, user_env

from tests.support.helpers import assert_results_consistent, attempt_states, new_run, wait_until

FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
               "health_check_initial_delay_ms": 0}

GPU_GRID = """
name: a100-grid
models: ["stub:{cost}"]
policies: [full, keydiff, keydiff-mean, keydiff-sw]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{{name: needle, lengths: [256], samples: 4}}]
resources: {{workers: 2, cpus_per_worker: 1, gpus_per_worker: 1, accelerator_type: A100}}
retries: {{max_attempts: 3}}
"""  # 7 cells


@pytest.fixture
def cluster():
    """Head (no CPUs) + two A100 nodes + one H100 node; the test process is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    sandbox_ray()
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False,
                                                          _system_config=FAST_HEALTH))
    nodes = [c.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:A100": 1}) for _ in range(2)]
    h100 = c.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, namespace="kdeval-tests",
             logging_level="WARNING")
    try:
        yield c, nodes, h100
    finally:
        ray.shutdown()
        c.shutdown()


def _node_id(node) -> str:
    """The Ray node id an attempt records (``ray.get_runtime_context().get_node_id()`` on the worker)."""
    return node.node_id


def test_worker_node_killed_mid_run(cluster, paths):
    c, (n1, n2), h100 = cluster
    # cells of 1.5 s: at 0.5 s the running cell seen below could finish before the node was removed (seen once in
    # a full run: nothing lost, the assertion on workers_lost failed)
    idx, run_id, plan = new_run(paths["db"], paths["results"], GPU_GRID.format(cost=1.5))
    assert len(plan.cells) == 7
    result: dict = {}
    # each cell alone, two workers in parallel (a group of the 7 cells is one unit of work: tests/jobs/run/test_groups.py)
    t = threading.Thread(target=lambda: result.update(out=service.execute_run(idx, run_id, share=False)))
    t.start()
    reader = RunIndex.open(paths["db"])
    # the node dies while it computes a cell (on a loaded machine its worker can start after two cells are done)
    wait_until(lambda: reader.get_run(run_id).counts.get("done", 0) >= 2 and any(
        a.state == "running" and a.node == _node_id(n2) for a in reader.run_attempts(run_id)), 60,
        "2 cells done and one running on the node to kill")
    c.remove_node(n2, allow_graceful=False)
    c.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:A100": 1})  # capacity comes back
    t.join(timeout=120)
    assert not t.is_alive(), "scheduler did not finish"
    out = result["out"]
    assert (out.done, out.failed, out.left) == (7, 0, 0)
    assert out.workers_lost >= 1 and len(out.model_loads_by_worker) >= 3  # a replacement was started
    run = idx.get_run(run_id)
    assert run.state == "done" and run.counts == {"done": 7}
    states = attempt_states(idx, run_id)
    assert states["done"] == 7 and states["lost"] >= 1 and sum(states.values()) == out.attempts
    assert_results_consistent(idx, run_id, paths["results"], samples=4)
    # pinned by accelerator type: nothing ran on the H100 node, and both A100 nodes ran cells
    nodes = {a.node for a in idx.run_attempts(run_id)}
    assert _node_id(h100) not in nodes and {_node_id(n1), _node_id(n2)} <= nodes


def test_driver_sigkill_then_resume(cluster, app, paths):
    c, _, h100 = cluster
    grid = paths["tmp"] / "grid.yaml"
    # one worker, each cell alone with its 4 samples in one shard (a group of the 7 would finish them all at
    # once, and two workers would split it by samples: tests/jobs/run/test_spread.py), so cells finish one by
    # one and a cell is done or not when the driver dies
    grid.write_text(GPU_GRID.format(cost=0.6).replace("workers: 2,", "workers: 1,") + "execution: {share: false}\n")
    db, results = paths["db"], paths["results"]
    env = user_env()
    log = open(paths["tmp"] / "driver.log", "wb")
    driver = subprocess.Popen(
        [sys.executable, "-m", "kdeval.cli.service_cmds", "submit", str(grid), "--db", str(db),
         "--results-dir", str(results), "--address", c.address],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=paths["tmp"])
    runner = CliRunner()
    try:
        wait_until(lambda: db.exists() and RunIndex.open(db).list_runs(), 60, "the run to be recorded")
        idx = RunIndex.open(db)
        run_id = idx.list_runs()[0].id
        reads = 0

        def two_done() -> bool:  # `kdeval status --json` while the driver writes: never errors
            nonlocal reads
            res = runner.invoke(app, ["status", run_id, "--db", str(db), "--json"])
            assert res.exit_code == 0, res.output
            reads += 1
            return sum(1 for cell in json.loads(res.output)["cells"] if cell["state"] == "done") >= 2

        wait_until(two_done, 90, "2 cells done")
        assert reads >= 1
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        log.close()
    done_before = {cell.id: cell.finished_at for cell in idx.run_cells(run_id, states=["done"])}
    assert len(done_before) >= 2 and idx.get_run(run_id).state == "running"  # the driver never finished
    # a crash between write and rename leaves a temp file: it must not be counted as a result
    orphan = results / "cells" / "zz" / "_tmp-zz-123.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"partial")

    res = runner.invoke(app, ["resume", run_id, "--db", str(db), "--address", c.address])
    assert res.exit_code == 0, res.output
    run = idx.get_run(run_id)
    assert run.state == "done" and run.counts == {"done": 7}
    for cell in idx.run_cells(run_id):
        attempts = idx.cell_attempts(cell.id)
        assert [a.state for a in attempts].count("done") == 1
        if cell.id in done_before:  # not recomputed
            assert cell.finished_at == done_before[cell.id] and len(attempts) == 1
    assert "running" not in attempt_states(idx, run_id)  # the dead driver's attempts became lost
    assert not orphan.exists()
    assert_results_consistent(idx, run_id, results, samples=4)

    res = runner.invoke(app, ["status", run_id, "--db", str(db)])
    assert res.exit_code == 0 and "done 7" in res.output
