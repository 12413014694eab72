"""``--detach`` keeps ``--address``: a job-server URL submits a Ray job; any other address (host:port, auto,
ray://) is a cluster the background driver joins. Shown on a ``ray.cluster_utils.Cluster``."""
from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from kdeval.cli import detach, service_cmds
from kdeval.storage import RunIndex
from tests.user_env import sandbox_ray

from tests.support.helpers import stub_grid
from tests.support.helpers import stop_background, wait_until


def test_which_addresses_are_job_servers():
    assert service_cmds.is_job_server("http://head:8265") and service_cmds.is_job_server("https://h:443")
    for address in ("127.0.0.1:6379", "auto", "ray://head:10001", None, ""):
        assert not service_cmds.is_job_server(address)


def test_the_detached_driver_resumes_on_the_same_index_and_cluster(tmp_path):
    db = tmp_path / "i.sqlite"
    cmd, env = detach.detached_driver_command("r1", str(db), "10.0.0.5:6379")
    assert cmd[:3] == [sys.executable, "-m", "kdeval.cli.app"]
    assert cmd[3:] == ["resume", "r1", "--address", "10.0.0.5:6379", "--connect-timeout", "30"]
    assert env == {"KDEVAL_DB": f"sqlite:///{db}"}  # the index travels in the environment, not in `ps`
    assert "--address" not in detach.detached_driver_command("r1", str(db), None)[0]


def test_detach_to_a_job_server_submits_a_ray_job(app, paths, monkeypatch):
    calls = []
    monkeypatch.setattr(service_cmds, "detach_ray_job", lambda *a: calls.append(a))
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid())
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--detach",
                                   "--address", "http://head:8265"])
    assert res.exit_code == 0, res.output
    assert len(calls) == 1 and calls[0][3] == "http://head:8265"
    assert not paths["db"].exists()  # the run is recorded on the cluster, not here


@pytest.fixture
def two_nodes():
    """A head and one worker node on loopback, one CPU each; this process does not join it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    sandbox_ray()
    c = Cluster(initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False))
    worker = c.add_node(num_cpus=1)
    try:
        yield c, {c.head_node.node_id, worker.node_id}
    finally:
        c.shutdown()


def test_detached_run_joins_the_given_cluster(two_nodes, app, paths, monkeypatch):
    cluster, node_ids = two_nodes
    monkeypatch.chdir(paths["tmp"])
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid(cost=0.3, workers=2))
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir",
                                   str(paths["results"]), "--detach", "--address", cluster.address])
    assert res.exit_code == 0, res.output
    pid = int(re.search(r"pid (\d+)", res.output).group(1))
    try:
        idx = RunIndex.open(paths["db"])
        run_id = idx.list_runs()[0].id
        wait_until(lambda: idx.get_run(run_id).state in ("done", "failed"), 120, "the detached run to finish",
                   every=0.3)
        run = idx.get_run(run_id)
        log = (paths["results"] / f"driver-{run_id}.log").read_text(errors="replace")
        assert run.state == "done" and run.counts == {"done": 5}, (run, log)
        assert run.driver_pid == pid
        attempts = idx.run_attempts(run_id)
        assert attempts and {a.node for a in attempts} <= node_ids, (attempts, node_ids)
        # a cell whose shards ran on both nodes names both
        assert {n for c in idx.run_cells(run_id) for n in c.node.split(",")} <= node_ids
        idx.close()
    finally:
        stop_background(pid)


@pytest.mark.parametrize("address, said", [
    ("http://head:8265", "error: --address: http://head:8265 is a Ray job server, which only --detach submits to; to "
                         "run here give the cluster's address (host:port, auto or ray://head:10001)"),
    ("head:port", "error: --address head:port: expected host:port, auto or ray://host:port"),
])
def test_an_address_no_driver_joins_is_refused_before_anything_is_written(app, paths, address, said):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid())
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--address", address],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 2, res.output
    assert res.output.strip() == said
    assert not paths["db"].exists()


def test_connect_refuses_a_job_server_url():
    from kdeval.cluster.raysetup import AddressError, connect

    with pytest.raises(AddressError, match=r"^--address https://h:8265 is a Ray job server"):
        connect("https://h:8265")
