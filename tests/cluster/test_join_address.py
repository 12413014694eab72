"""``--address HOST:PORT`` joins exactly that cluster, in a bounded time or with one line saying why not.

The heads are started as a user starts them (``ray start --head --node-ip-address=127.0.0.1``) and the kdeval
processes run with no ``RAY_*`` variable in their environment. On a machine with a second network interface,
a driver that Ray lets resolve 127.0.0.1 to that interface dials it and never reaches the loopback head (the
bug these tests catch); the driver's own sockets are checked to stay on loopback either way.
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from kdeval.jobs.grid.load import load_grid
from kdeval.storage import RunIndex
from tests.user_env import user_env

from tests.support.helpers import stub_grid
from tests.support.helpers import stop_background, wait_until
from tests.support.ray_head import free_port, start_head

TOKEN = "kdeval-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def ray_tmp():
    path = Path(tempfile.mkdtemp(prefix="kd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def head(ray_tmp):
    """A loopback head without token auth (its user's shell sets the loopback switch)."""
    h = start_head(ray_tmp / "open", user_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def token_head(ray_tmp):
    """A loopback head with Ray's token authentication on (``HOME`` elsewhere: no ``~/.ray`` is written)."""
    h = start_head(ray_tmp / "tok", user_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token",
                                             RAY_AUTH_TOKEN=TOKEN, HOME=str(ray_tmp)))
    yield h
    h.stop()


def _kdeval(*args: str, env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdeval.cli.app", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _non_loopback(pid: int) -> set[str]:
    """The inet endpoints of process ``pid`` (and its children) that are not loopback."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    seen = set()
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
            for end in (c.laddr, c.raddr):
                if end and end.ip not in ("0.0.0.0", "::"):
                    addr = ipaddress.ip_address(end.ip.split("%")[0])
                    if not (getattr(addr, "ipv4_mapped", None) or addr).is_loopback:
                        seen.add(f"{end.ip}:{end.port}")
    return seen


def test_detached_run_on_a_loopback_head_finishes_from_a_shell_without_ray_variables(head, paths):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid(cost=0.05, workers=1))
    res = _kdeval("submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"]),
                  "--address", head.address, "--detach", env=user_env(COLUMNS="300"), cwd=paths["tmp"])
    assert res.returncode == 0, res.stdout + res.stderr
    pid = int(re.search(r"pid (\d+)", res.stdout).group(1))
    idx = RunIndex.open(paths["db"], write=False)
    run_id = idx.list_runs()[0].id
    exposed: set[str] = set()
    try:
        def finished() -> bool:
            exposed.update(_non_loopback(pid))
            return idx.get_run(run_id).state in ("done", "failed")

        wait_until(finished, 120, "the detached run to finish", every=0.3)
    finally:
        stop_background(pid)
    run = idx.get_run(run_id)
    log = (paths["results"] / f"driver-{run_id}.log").read_text(errors="replace")
    assert run.state == "done" and run.counts == {"done": 5}, (run, log[-2000:])
    assert not exposed, f"the driver of a loopback cluster used another interface: {sorted(exposed)}"
    idx.close()


def test_a_port_nobody_listens_on_fails_at_once_with_one_line(app, paths):
    """Wrong port or head down: exit 1 in well under the timeout, one line naming the address and the cause,
    and the run reads failed (not pending) with that reason."""
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid())
    load_grid(grid)  # what validating a grid imports (torch) is not the time to reach a cluster
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir",
                                   str(paths["results"]), "--address", address], env={"COLUMNS": "300"})
    took = time.monotonic() - t0
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert errors == [f"error: cannot reach the Ray cluster at {address}: connection refused (no Ray head listens "
                      "on that port: is it down, or is the port wrong?)"], res.output
    assert took < 5, took
    idx = RunIndex.open(paths["db"], write=False)
    [run] = idx.list_runs()
    assert run.state == "failed" and "connection refused" in run.message and run.counts == {"pending": 5}
    ls = CliRunner().invoke(app, ["ls", "--db", str(paths["db"])], env={"COLUMNS": "300"})
    assert re.search(r"stub-grid\s+failed\s+0\s+0\s+5\s", ls.output), ls.output  # the id may fold
    idx.close()


def test_a_port_that_is_no_gcs_fails_within_the_connect_timeout(app, paths):
    """Something listens but never answers as a GCS: the driver gives up after --connect-timeout."""
    import socket

    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid())
    load_grid(grid)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        res = CliRunner().invoke(app, ["submit", str(grid), "--db", str(paths["db"]), "--results-dir",
                                       str(paths["results"]), "--address", address, "--connect-timeout", "3"],
                                 env={"COLUMNS": "300"})
        took = time.monotonic() - t0
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert errors == [f"error: cannot reach the Ray cluster at {address}: its port accepts connections but no Ray "
                      "GCS answered within 3s (is it a Ray head's GCS port?)"], res.output
    assert 2.5 < took < 10, took


def test_a_token_cluster_refuses_a_driver_without_its_token_in_one_line_and_takes_one_with_it(
        token_head, app, paths, ray_tmp, monkeypatch):
    grid = paths["tmp"] / "g.yaml"
    grid.write_text(stub_grid(cost=0.02, workers=1))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(ray_tmp))  # no ~/.ray/auth_token of this machine's user
    args = ["submit", str(grid), "--db", str(paths["db"]), "--results-dir", str(paths["results"]),
            "--address", token_head.address]
    t0 = time.monotonic()
    res = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error")]
    assert errors == [f"error: the Ray cluster at {token_head.address} refused this driver's authentication "
                      "(RAY_AUTH_MODE is unset): set RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN "
                      "(or a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) in the shell that runs "
                      "kdeval"], res.output
    assert time.monotonic() - t0 < 15
    # the token as Ray reads it, in the shell of a user who followed that line
    ok = _kdeval(*args, env=user_env(COLUMNS="300", HOME=str(ray_tmp), RAY_AUTH_MODE="token",
                                     RAY_AUTH_TOKEN=TOKEN), cwd=paths["tmp"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "5 done, 0 failed" in ok.stderr


def test_each_form_of_address_names_the_host_a_driver_dials(monkeypatch):
    from kdeval.cluster.reach import AddressError, resolve_target

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6390")  # what `auto` finds first, as Ray looks
    auto = resolve_target("auto")
    assert (auto.host, auto.port, auto.loopback, auto.client) == ("127.0.0.1", 6390, True, False)
    client = resolve_target("ray://10.1.2.3")
    assert (client.host, client.port, client.loopback, client.client) == ("10.1.2.3", 10001, False, True)
    assert resolve_target("localhost:6379").loopback and resolve_target("[::1]:6379").loopback
    assert not resolve_target("192.0.2.7:6379").loopback
    with pytest.raises(AddressError, match=r"^--address head: expected host:port, auto or ray://host:port$"):
        resolve_target("head")

