"""`kdeval submit / status / cancel / resume / ls / rescore` — the service commands.

Exit codes: 0 every cell done, 1 some cells failed (or the run did not finish: also when the index failed
during the run — disk full, read-only, connection lost — said in one line naming the index and the cause),
2 bad input (an invalid grid, an unknown run, an unusable --db or --results-dir); an invalid grid writes
nothing.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kdeval.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, check_results_dir, missing_index, open_index
from kdeval.evals.chunking import chunk_text
from kdeval.cli.progress import PlainProgress, RichProgress
from kdeval.cluster.raysetup import is_job_server
from kdeval.jobs import service
from kdeval.jobs.cells import policy_label, protocol_tag
from kdeval.jobs.drivers import describe_driver
from kdeval.jobs.errors import GridError
from kdeval.jobs.groups import execution_label
from kdeval.jobs.progress import RunProgress
from kdeval.jobs.validate import load_grid
from kdeval.storage import (
    DB_ENV, TERMINAL_RUN_STATES, CellState, IndexStorageError, RunIndex, RunState, age_seconds, db_text, db_url,
    to_jsonable,
)

# Names, model ids, errors and paths come from users: nothing printed here is read as rich markup (styles are
# given as Text).
out = Console(markup=False)
err = Console(stderr=True, markup=False)


#: the widest a status table's policy column insists on (a longer label without spaces folds)
LABEL_WIDTH = 16  # "[query-agnostic]" stays whole


def _run_or_exit(index: RunIndex, ref: str):
    run = index.get_run(ref)
    if run is None:
        err.print(f"error: no run '{ref}' (or the prefix is ambiguous); see `kdeval ls`")
        raise typer.Exit(EXIT_BAD_INPUT)
    return run


def _exit_code(index: RunIndex, run_id: str) -> int:
    run = index.get_run(run_id)
    return EXIT_OK if run is not None and run.state == RunState.DONE.value else EXIT_FAILED


def _execute(index: RunIndex, run_id: str, address: Optional[str], wait: bool = True) -> int:
    """Run the scheduler with its progress on stderr (bars in a terminal, plain lines in a log: samples done /
    total and ETAs, cells waited for); print the status table; return the exit code."""
    def describe(rid: str) -> str:
        view = index.get_run(rid)
        return describe_driver(view) if view is not None else f"run {rid}"

    display = (RichProgress if err.is_terminal else PlainProgress)(err, run_id, describe)
    last: list[RunProgress] = []

    def on_progress(p: RunProgress) -> None:
        last[:] = [p]
        display.update(p)

    try:
        with display:
            outcome = service.execute_run(index, run_id, address=address, on_progress=on_progress, wait=wait,
                                          on_wait=lambda msg: err.print(msg, markup=False, highlight=False))
            display.close(last[0] if last else None)
    except (ConnectionError, service.RunBusyError, service.StaleRunError) as e:
        err.print(f"error: {e}", markup=False)
        return EXIT_BAD_INPUT
    except IndexStorageError as e:
        err.print(f"error: {e}; {_stop_run(index, run_id, str(e))}", soft_wrap=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        run = index.get_run(run_id)
        if run is not None and (run.driver_host, run.driver_pid) == (socket.gethostname(), os.getpid()):
            index.recover_orphans(run_id)  # this process was the run's driver (not one it waited for)
            index.set_run_state(run_id, RunState.CANCELLED, "interrupted (Ctrl-C)")
            err.print(f"interrupted; `kdeval resume {run_id}` continues the run")
        return EXIT_FAILED
    if outcome.message:
        err.print(Text(outcome.message, style="yellow"))
    out.print(_status_table(index, run_id))
    return _exit_code(index, run_id)


def _stop_run(index: RunIndex, run_id: str, why: str) -> str:
    """Mark the run this process drove failed after its index failed (when the index takes it); says what
    the user can do."""
    then = f"`kdeval resume {run_id}` continues it once the index can be written"
    try:
        run = index.get_run(run_id)
        if run is None or (run.driver_host, run.driver_pid) != (socket.gethostname(), os.getpid()):
            return then  # it was not this process's run to mark
        index.set_run_state(run_id, RunState.FAILED, f"stopped: {why}")
    except IndexStorageError:
        return f"the run could not be marked failed either (its driver is gone): {then}"
    return f"run {run_id} is marked failed: {then}"


def _counts_line(counts: dict[str, int]) -> str:
    order = [s.value for s in CellState]
    return "  ".join(f"{k} {counts.get(k, 0)}" for k in order)


def _runs_table(index: RunIndex) -> Table:
    t = Table(title="runs (created UTC)", box=box.SIMPLE_HEAD)
    for col in ("run", "name", "state", "done", "failed", "left", "created"):
        t.add_column(col, overflow="fold", min_width=len(col),
                      justify="right" if col in ("done", "failed", "left") else "left")
    for r in index.list_runs():
        c = r.counts
        left = c.get("pending", 0) + c.get("running", 0)
        state = r.state if r.state != RunState.RUNNING.value or service.driver_alive(r) else "running (driver gone)"
        t.add_row(r.id, r.name, state, str(c.get("done", 0)), str(c.get("failed", 0)), str(left),
                  r.created_at.strftime("%m-%d %H:%M"))
    return t


def _headline(summary: dict | None) -> str:
    """The cell's headline numbers: scalar metrics, not counts, latencies or nested tables."""
    if not summary:
        return ""
    skip = ("n", "grid", "shared_rows")
    vals = [f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()
            if isinstance(v, (int, float)) and k not in skip and not k.startswith(("mean_", "max_"))
            and not k.endswith("_bytes")]
    return " ".join(vals[:3])


def _status_table(index: RunIndex, run_id: str) -> Group:
    """One run: a heading with per-state counts, one row per cell (worker@node on wide terminals, time, score
    or error), the driver's message. Columns fold instead of cutting what a user types next (ids, policies,
    tasks) or must read (errors)."""
    run = index.get_run(run_id)
    cells = index.run_cells(run.id)
    caption = run.message
    if run.state == RunState.RUNNING.value and not service.driver_alive(run):
        caption = (f"driver pid {run.driver_pid} on {run.driver_host} not seen for "
                   f"{age_seconds(run.heartbeat_at) or 0:.0f}s: `kdeval resume {run.id}` continues the run")
    models = sorted({c.model for c in cells})
    one_model = len(models) == 1
    title = f"run {run.id} ({run.name}{', ' + models[0] if one_model else ''}): {run.state} — {_counts_line(run.counts)}"
    wide = out.width >= 110
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["cell"] + ([] if one_model else ["model"]) + ["policy", "N/B", "task", "state"] + (
        ["worker@node"] if wide else []) + ["s"]
    # the label reports and progress print: two settings of one policy must not read the same
    labels = {c.id: policy_label(c.policy, (c.spec or {}).get("policy_params") or {}) + protocol_tag(c.spec)
              for c in cells}
    # a label folds between its words ("keydiff [query-agnostic]"); a long parameter list folds where it must
    longest = min(max((len(w) for label in labels.values() for w in label.split()), default=0), LABEL_WIDTH)
    for col in cols:
        t.add_column(col, overflow="fold", justify="right" if col == "s" else "left",
                     min_width=longest if col == "policy" else None)
    t.add_column("score / error", overflow="fold", ratio=1)
    for c in cells:
        detail = c.error_line if c.state == CellState.FAILED.value else _headline(c.summary)
        where = f"{c.worker or ''}@{(c.node or '')[:6]}" if c.worker else ""
        state = c.state if c.n_attempts <= 1 else f"{c.state} ({c.n_attempts})"
        state = " ".join(filter(None, [state, execution_label(c.summary, c.n_rows)]))  # "done shared": in a group
        nb = f"{'-' if c.grid_budget is None else c.grid_budget}/{chunk_text(c.chunk_size)}"
        row = [c.id[:8]] + ([] if one_model else [c.model]) + [labels[c.id], nb, c.task, state] + (
            [where] if wide else []) + [f"{c.duration_s:.1f}" if c.duration_s is not None else "", detail or ""]
        t.add_row(*row)
    parts = [Text(title, style="bold"), t] + ([Text(caption)] if caption else [])
    return Group(*parts)


def _status_json(index: RunIndex, run_id: str | None) -> str:
    if run_id is None:
        return json.dumps({"runs": [to_jsonable(r, drop=("grid_yaml",)) for r in index.list_runs()]}, indent=2)
    run = index.get_run(run_id)
    cells = [dict(to_jsonable(c, drop=("spec",)), error_line=c.error_line) for c in index.run_cells(run.id)]
    run_json = dict(to_jsonable(run, drop=("grid_yaml",)), driver_alive=service.driver_alive(run),
                    heartbeat_age_s=age_seconds(run.heartbeat_at))
    return json.dumps({"run": run_json, "cells": cells}, indent=2)



def detached_driver_command(run_id: str, db: Optional[str], address: Optional[str]) -> tuple[list[str], dict]:
    """The background driver's command line (``resume`` of the run on the same cluster) and what its
    environment adds: the index URL, in ``$KDEVAL_DB`` rather than in the arguments every local user can
    read (``ps``), since it may hold a password."""
    entry = [sys.executable, "-m", "kdeval.cli.service_cmds", "resume", run_id]
    return entry + (["--address", address] if address else []), {DB_ENV: db_url(db)}


def _detach_local(index: RunIndex, run_id: str, db: Optional[str], address: Optional[str]) -> None:
    """Start this run's driver as a background process on this machine (log next to the results); it joins
    the cluster at ``address`` (None: a local Ray of its own)."""
    entry, env = detached_driver_command(run_id, db, address)
    log = Path(index.get_run(run_id).results_dir) / f"driver-{run_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(entry, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **env})
    out.print(f"run {run_id} started in the background (pid {proc.pid}, log {log}); "
              f"follow it with `kdeval status {run_id} --watch`")


#: Where a detached Ray job keeps the index and results on the cluster's head node by default.
CLUSTER_DB, CLUSTER_RESULTS = "~/.kdeval/index.sqlite", "~/.kdeval/results"
#: The file of a Ray job's working_dir that holds its ``--db`` (see :func:`ray_job_spec`).
JOB_DB_FILE = "index-url"


def ray_job_spec(grid_file: Path, db: Optional[str], results_dir: Optional[Path]) -> tuple[str, dict]:
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
    entry = " ".join(["kdeval", "submit", "grid.yaml", "--db", shlex.quote(where),
                      "--results-dir", shlex.quote(str(results_dir or CLUSTER_RESULTS)), "--address", "auto"])
    return entry, {"working_dir": str(staging)}


def _detach_ray_job(grid_file: Path, db: Optional[str], results_dir: Optional[Path], address: str) -> None:
    from ray.job_submission import JobSubmissionClient

    entry, runtime_env = ray_job_spec(grid_file, db, results_dir)
    try:
        job = JobSubmissionClient(address).submit_job(entrypoint=entry, runtime_env=runtime_env)
    finally:  # the working_dir is uploaded by submit_job
        shutil.rmtree(runtime_env["working_dir"], ignore_errors=True)
    out.print(f"submitted Ray job {job} to {address}: {entry}\n"
              f"follow it with `ray job logs --follow {job} --address {address}`")


def _print_plan(name: str, p: "service.Plan") -> None:
    """The dry run's table: per cell its state, generation length, data source and spec; then the notes."""
    t = Table(title=Text(f"{name}: {len(p.cells)} cells, {len(p.done)} already done, {len(p.to_run)} to run",
                         style="table.title"), box=box.SIMPLE_HEAD)
    for col in ("cell", "state", "gen", "data", "spec"):
        t.add_column(col, overflow="fold", justify="right" if col == "gen" else "left")
    for c in p.cells:
        state = "done" if c.id in p.done else "to run" + (f" ({p.invalid[c.id]})" if c.id in p.invalid else "")
        t.add_row(c.id[:10], state, str(c.task.max_new_tokens), c.task.data_source, c.describe())
    out.print(t)
    for note in p.notes:
        err.print(f"note: {note}", markup=False, highlight=False)


def submit(
    grid_file: Path = typer.Argument(..., help="Grid YAML file (see examples/)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help=f"Where per-cell Parquet files go (default {service.DEFAULT_RESULTS_DIR})."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on: host:port, 'auto' or ray://head:10001; with --detach also a job server http://head:8265 (default: start Ray locally)."),
    detach: bool = typer.Option(False, "--detach", help="Return at once: the driver runs as a background process here (joining --address, if given), or as a Ray job on the cluster when --address is a job server http(s)://head:8265."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the cells and which are already done; write nothing."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Cells another live driver is computing: wait for them (default) or leave them (the run ends failed, naming that run)."),
) -> None:
    """Validate a grid, record a run and execute its cells (cells already done are reused)."""
    try:
        grid, text = load_grid(grid_file)
        if dry_run:  # a dry run never creates the index
            index = open_index(db, write=False) if missing_index(db) is None else None
            p = service.plan(index, grid) if index else service.Plan(**vars(service.expand_grid(grid)), done=set())
        else:
            p = None
    except GridError as e:
        err.print(str(e.with_source(str(grid_file))), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    if dry_run:
        _print_plan(grid.name, p)
        raise typer.Exit(EXIT_OK)
    if detach and is_job_server(address):
        _detach_ray_job(grid_file, db, results_dir, address)  # the run is recorded on the cluster
        raise typer.Exit(EXIT_OK)
    if is_job_server(address):
        err.print(f"error: --address: {address} is a Ray job server, which only --detach submits to; to run "
                  "here give the cluster's address (host:port, auto or ray://head:10001)",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    results_dir = results_dir or service.DEFAULT_RESULTS_DIR
    check_results_dir(results_dir)  # a bad --results-dir or --db exits 2 before anything is written
    index = open_index(db, must_exist=False)
    try:
        run_id, p = service.create_run(index, grid, text, results_dir)
    except GridError as e:
        err.print(str(e.with_source(str(grid_file))), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    except IndexStorageError as e:
        err.print(f"error: no run recorded: {e}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    except OSError as e:  # the run's manifest could not be written into the results directory
        err.print(f"error: no run recorded: --results-dir {results_dir}: {e.strerror or e}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILED)
    for note in p.notes:
        err.print(f"note: {note}", markup=False, highlight=False)
    out.print(Text.assemble("run ", (run_id, "bold"),
                            f": {len(p.cells)} cells, {len(p.done)} already done, {len(p.to_run)} to run"))
    if detach:
        _detach_local(index, run_id, db, address)
        raise typer.Exit(EXIT_OK)
    raise typer.Exit(_execute(index, run_id, address, wait))


def resume(
    run: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on: host:port, 'auto' or ray://head:10001 (default: start Ray locally)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="When the run's driver is alive elsewhere, wait for it to finish, then run what is left (default); with --no-wait, refuse. Cells other live drivers compute are waited for likewise."),
) -> None:
    """Finish a run: retry failed and lost cells, never recompute done ones."""
    index = open_index(db)
    r = _run_or_exit(index, run)
    raise typer.Exit(_execute(index, r.id, address, wait))  # --no-wait and a live driver: RunBusyError, exit 2


def status(
    run: Optional[str] = typer.Argument(None, help="Run id or prefix (default: all runs)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    watch: bool = typer.Option(False, "--watch", help="Refresh every second until the run ends."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Per-run and per-state counts; a run's cells with worker/node and failures with their error."""
    index = open_index(db, write=False)
    run_id = _run_or_exit(index, run).id if run else None
    if as_json:
        print(_status_json(index, run_id))
        raise typer.Exit(EXIT_OK)
    render = (lambda: _status_table(index, run_id)) if run_id else (lambda: _runs_table(index))
    if not watch:
        out.print(render())
        raise typer.Exit(EXIT_OK)
    with Live(render(), console=out, refresh_per_second=2) as live:
        while True:
            time.sleep(1.0)
            live.update(render())
            if run_id and index.get_run(run_id).state in TERMINAL_RUN_STATES:
                break
    raise typer.Exit(_exit_code(index, run_id) if run_id else EXIT_OK)


def ls(db: Optional[str] = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """List runs, newest first."""
    out.print(_runs_table(open_index(db, write=False)))


def cancel(
    run: str = typer.Argument(..., help="Run id or prefix."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Cancel a run: its driver stops dispatching at its next heartbeat and kills its workers."""
    index = open_index(db)
    r = _run_or_exit(index, run)
    before = service.cancel_run(index, r.id)
    if before in TERMINAL_RUN_STATES:
        out.print(f"run {r.id} already {before}")
    else:
        out.print(f"run {r.id} cancelled (was {before}); `kdeval resume {r.id}` continues it")


def rescore(
    run: str = typer.Argument(..., help="Run id or prefix."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Recompute every stored prediction's score with the current metric code."""
    from kdeval.jobs.rescore import rescore_run

    index = open_index(db)
    r = _run_or_exit(index, run)
    with bad_input():
        report = rescore_run(index, r.id)
    out.print(f"rescored {report.cells} cells ({report.rows} rows, {report.changed} scores changed)")
    if report.skipped:
        out.print(f"skipped {len(report.skipped)} cells: " + "; ".join(report.skipped[:5]))


def register(app: typer.Typer) -> None:
    """Add the service commands to the main app."""
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("cancel")(cancel)
    app.command("resume")(resume)
    app.command("ls")(ls)
    app.command("rescore")(rescore)


def main() -> None:
    """``python -m kdeval.cli.service_cmds`` (the detached driver's entry point)."""
    app = typer.Typer(add_completion=False, no_args_is_help=True)
    register(app)
    app()


if __name__ == "__main__":
    main()
