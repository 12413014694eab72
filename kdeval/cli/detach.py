"""`submit --detach`: the run's driver as a background process here, or as a Ray job on a cluster.

A background driver is ``resume`` of the run (joining ``--address``, if given) with its output in
``<results_dir>/driver-<run>.log``; its pid is recorded with the run (``RunIndex.record_launch``), so that
``status`` tells a driver that died before it took the run from one still starting. A Ray job runs
``kdeval submit`` on the cluster's head node.
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import typer
from rich.console import Console

from kdeval.cli.consoles import stderr
from kdeval.cli.errors import EXIT_FAILED

from kdeval.cluster.reach import DEFAULT_CONNECT_TIMEOUT_S
from kdeval.jobs.run.drivers import driver_log
from kdeval.storage import DB_ENV, RunIndex, db_text, db_url


def detached_driver_command(run_id: str, db: Optional[str], address: Optional[str],
                            connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                            plugins: Sequence[str] = ()) -> tuple[list[str], dict]:
    """The background driver's command line (``resume`` of the run on the same cluster, with the submit's
    ``--plugin``s, a file by its absolute path) and what its environment adds: the index URL, in ``$KDEVAL_DB``
    rather than in the arguments every local user can read (``ps``), since it may hold a password."""
    entry = [sys.executable, "-m", "kdeval.cli.app", "resume", run_id]
    if address:
        entry += ["--address", address, "--connect-timeout", f"{connect_timeout:g}"]
    for ref in plugins:
        entry += ["--plugin", str(Path(ref).resolve()) if Path(ref).is_file() else ref]
    return entry, {DB_ENV: db_url(db)}


def detach_local(index: RunIndex, run_id: str, db: Optional[str], address: Optional[str],
                 connect_timeout: float, out: Console, plugins: Sequence[str] = ()) -> None:
    """Start this run's driver as a background process on this machine (log next to the results); it joins
    the cluster at ``address`` (None: a local Ray of its own)."""
    entry, env = detached_driver_command(run_id, db, address, connect_timeout, plugins)
    log = driver_log(index.get_run(run_id).results_dir, run_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(entry, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **env})
    index.record_launch(run_id, socket.gethostname(), proc.pid)
    out.print(f"run {run_id} started in the background (pid {proc.pid}, log {log}); "
              f"follow it with `kdeval status {run_id} --watch`")


#: Where a detached Ray job keeps the index and results on the cluster's head node by default.
CLUSTER_DB, CLUSTER_RESULTS = "~/.kdeval/index.sqlite", "~/.kdeval/results"
#: The file of a Ray job's working_dir that holds its ``--db`` (see :func:`ray_job_spec`).
JOB_DB_FILE = "index-url"


def ray_job_spec(grid_file: Path, db: Optional[str], results_dir: Optional[Path],
                 plugins: Sequence[str] = ()) -> tuple[str, dict]:
    """Entrypoint and runtime_env of the Ray job that runs ``kdeval submit`` on the cluster.

    The grid file travels in the job's working_dir; ``--db``/``--results-dir`` are paths on the head
    node (default ``~/.kdeval/...``), since the driver — the only writer of the index — runs there. A ``--db``
    travels as a file of the working_dir readable only by its owner (``--db @index-url``), never in the
    entrypoint, which the job list and dashboard show: it may hold a password."""
    staging = Path(tempfile.mkdtemp(prefix="kdeval-job-"))
    shutil.copy(grid_file, staging / "grid.yaml")
    where = CLUSTER_DB
    if db is not None:
        fd = os.open(staging / JOB_DB_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{db_text(db)}\n")  # an @FILE given here is read here
        where = f"@{JOB_DB_FILE}"
    options = []
    for ref in plugins:  # a plugin file travels in the working_dir too; a module is named as it is
        if Path(ref).is_file():
            shutil.copy(ref, staging / Path(ref).name)
            ref = Path(ref).name
        options += ["--plugin", shlex.quote(ref)]
    entry = " ".join(["kdeval", "submit", "grid.yaml", "--db", shlex.quote(where),
                      "--results-dir", shlex.quote(str(results_dir or CLUSTER_RESULTS)), "--address", "auto",
                      *options])
    return entry, {"working_dir": str(staging)}


def detach_ray_job(grid_file: Path, db: Optional[str], results_dir: Optional[Path], address: str,
                   out: Console, plugins: Sequence[str] = ()) -> None:
    """Submit the grid as a Ray job to the job server at ``address``; a server that cannot take it (Ray's job
    SDK missing, nothing listening, a refusal) is one line on stderr and exit 1, nothing recorded."""
    entry, runtime_env = ray_job_spec(grid_file, db, results_dir, plugins)
    try:
        from ray.job_submission import JobSubmissionClient

        job = JobSubmissionClient(address).submit_job(entrypoint=entry, runtime_env=runtime_env)
    except Exception as e:  # Ray's SDK raises RuntimeError, ConnectionError, requests' errors...: one line
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        stderr(markup=False).print(f"error: --address: cannot submit a Ray job to {address}: "
                                   f"{lines[0] if lines else type(e).__name__}; nothing was recorded",
                                   markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None
    finally:  # the working_dir is uploaded by submit_job
        shutil.rmtree(runtime_env["working_dir"], ignore_errors=True)
    out.print(f"submitted Ray job {job} to {address}: {entry}\n"
              f"follow it with `ray job logs --follow {job} --address {address}`")
