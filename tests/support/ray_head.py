"""A Ray head a test starts as a user would (``ray start --head`` on 127.0.0.1, no dashboard) and stops by its
own process group: never ``ray stop``, which stops every Ray of the machine."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.helpers import wait_until


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Head:
    """A running head: its GCS address and the process group of everything ``ray start`` started."""

    address: str
    pgid: int
    temp_dir: Path

    def stop(self) -> None:
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_head(temp_dir: Path, env: dict[str, str], num_cpus: int = 2) -> Head:
    """``ray start --head --node-ip-address=127.0.0.1`` in a session of its own, with ``env`` (the head's shell:
    a loopback head needs ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` there, as its user would set it). Ray's
    temp dir is ``temp_dir`` (short: Ray's socket paths must fit 107 bytes): the machine's ``/tmp/ray`` (what
    ``auto`` finds) is not touched."""
    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", "--port", str(port),
           "--include-dashboard=false", "--num-cpus", str(num_cpus), "--temp-dir", str(temp_dir),
           "--disable-usage-stats"]
    log = open(temp_dir.parent / f"head-{port}.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    head = Head(f"127.0.0.1:{port}", proc.pid, temp_dir)
    try:
        assert proc.wait(timeout=120) == 0, (temp_dir.parent / f"head-{port}.log").read_text(errors="replace")
        wait_until(lambda: _listens(port), 30, f"the head's GCS on port {port}", every=0.2)
    except BaseException:
        head.stop()
        raise
    return head


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
