"""Whether a run's driver is alive: the rule behind one driver per run and one driver per cell.

A driver heartbeats into its run's row (``kdeval.storage.RunIndex.heartbeat``) every second or so. It counts
as alive while its run is ``running``, its heartbeat is fresher than :data:`DRIVER_STALE_S` and, on this host,
its pid exists. Cells held by a run whose driver is not alive may be taken over (``RunIndex.claim_cell``);
those of a live driver are waited for.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

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
        return not _pid_gone(run.driver_pid)
    return True


def _pid_gone(pid: int) -> bool:
    """Whether process ``pid`` of this host has exited (a zombie nobody reaped has too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # Linux: state Z (exited, not yet reaped: its parent may be gone and init not reaping)
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rpartition(")")[2].split()[:1] == ["Z"]
    except OSError:
        return False


def launch_gone(run: RunView) -> bool:
    """Whether a pending run's background driver (``submit --detach``, recorded by ``RunIndex.record_launch``)
    exited on this host without taking the run: it will never start by itself."""
    return (run.state == RunState.PENDING.value and run.driver_pid is not None
            and run.driver_host == socket.gethostname() and run.driver_pid != os.getpid()
            and _pid_gone(run.driver_pid))


def driver_gone(run: RunView) -> bool:
    """Whether a run that is not finished has no driver left: a running one whose driver is not alive, or a
    pending one whose background driver exited (:func:`launch_gone`)."""
    return (run.state == RunState.RUNNING.value and not driver_alive(run)) or launch_gone(run)


def driver_log(results_dir: str | Path, run_id: str) -> Path:
    """Where a background driver of run ``run_id`` writes its output: ``<results_dir>/driver-<run>.log``."""
    return Path(results_dir) / f"driver-{run_id}.log"


def last_log_line(run: RunView, limit: int = 65536) -> str | None:
    """The last non-empty line of the run's background driver log (None when there is none)."""
    path = driver_log(run.results_dir, run.id)
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def describe_driver(run: RunView) -> str:
    """``run R (pid P on HOST, heartbeat 2s ago)``, for messages about a run holding cells."""
    age = age_seconds(run.heartbeat_at)
    beat = f", heartbeat {age:.0f}s ago" if age is not None else ""
    return f"run {run.id} (pid {run.driver_pid} on {run.driver_host}{beat})"
