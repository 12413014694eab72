"""Whether a run's driver is alive: the rule behind one driver per run and one driver per cell.

A driver heartbeats into its run's row (``kdeval.storage.RunIndex.heartbeat``) every second or so. It counts
as alive while its run is ``running``, its heartbeat is fresher than :data:`DRIVER_STALE_S` and, on this host,
its pid exists. Cells held by a run whose driver is not alive may be taken over (``RunIndex.claim_cell``);
those of a live driver are waited for.
"""
from __future__ import annotations

import os
import socket

from kdeval.storage import RunState, RunView, age_seconds

#: A driver whose heartbeat is older than this is presumed dead.
DRIVER_STALE_S = 15.0


def driver_alive(run: RunView) -> bool:
    """Whether a run's driver looks alive: state running, a fresh heartbeat and (same host) its pid exists.

    A run recorded by this very process counts as not alive (this process is its driver, or was)."""
    if run.state != RunState.RUNNING.value or run.driver_pid is None:
        return False
    age = age_seconds(run.heartbeat_at)
    if age is None or age > DRIVER_STALE_S:
        return False
    if run.driver_host == socket.gethostname():
        if run.driver_pid == os.getpid():
            return False
        try:
            os.kill(run.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    return True


def describe_driver(run: RunView) -> str:
    """``run R (pid P on HOST, heartbeat 2s ago)``, for messages about a run holding cells."""
    age = age_seconds(run.heartbeat_at)
    beat = f", heartbeat {age:.0f}s ago" if age is not None else ""
    return f"run {run.id} (pid {run.driver_pid} on {run.driver_host}{beat})"
