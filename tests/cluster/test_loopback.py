"""A local run listens on loopback only, started from a shell that sets no Ray variable.

The driver is a separate process whose environment has none of the ``RAY_*`` variables this test suite sets
for its simulated clusters, so what is tested is what a user's ``kdeval submit`` does by itself."""
from __future__ import annotations

import ipaddress
import subprocess
import sys
import time

import psutil

from tests.user_env import user_env

from tests.support.helpers import stub_grid



def _listening(root: psutil.Process) -> dict[tuple[str, int], str]:
    """(address, port) -> process name, for every listening TCP socket of ``root`` and its descendants."""
    found: dict[tuple[str, int], str] = {}
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return found
    for p in procs:
        try:
            conns, name = p.net_connections(kind="inet"), p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN:
                found[(c.laddr.ip, c.laddr.port)] = name
    return found


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_local_run_listens_only_on_loopback(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(stub_grid(cost=1.0, workers=1))
    env = user_env()
    cmd = [sys.executable, "-m", "kdeval.cli.app", "submit", str(grid), "--db", str(tmp_path / "index.sqlite"),
           "--results-dir", str(tmp_path / "results")]
    driver = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    seen: dict[tuple[str, int], str] = {}
    try:
        root = psutil.Process(driver.pid)
        deadline = time.monotonic() + 240
        while driver.poll() is None and time.monotonic() < deadline:
            seen.update(_listening(root))
            time.sleep(0.3)
        out, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=30)
    assert driver.returncode == 0, out
    names = set(seen.values())
    assert {"gcs_server", "raylet"} <= names, f"the run's Ray processes were not seen listening: {seen}"
    exposed = {f"{ip}:{port} ({name})" for (ip, port), name in seen.items() if not _is_loopback(ip)}
    assert not exposed, f"listening beyond loopback: {sorted(exposed)}"
