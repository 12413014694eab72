"""`kdeval submit / status / cancel / resume / ls / rescore` — the service commands.

Exit codes: 0 every cell done, 1 some cells failed (or the run did not finish: also when the index failed
during the run — disk full, read-only, connection lost — said in one line naming the index and the cause, and
when the driver could not join its cluster within --connect-timeout, said in one line naming the address and
the cause, and when the results directory became unwritable mid-run, said in one line naming --results-dir; no
attempt is spent again on it), 2 bad input (an invalid grid, an unknown run, an unusable --db or --results-dir); an invalid grid writes
nothing.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.detach import detach_local, detach_ray_job
from kdeval.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, check_results_dir, missing_index, open_index
from kdeval.cli.plugin_opts import load_cli_plugins, plugin_option
from kdeval.cli.progress import PlainProgress, RichProgress
from kdeval.cli.status_view import MAX_ROWS, runs_table, status_json, status_table
from kdeval.cluster.plugins import PluginError
from kdeval.cluster.raysetup import AddressError, is_job_server
from kdeval.cluster.reach import DEFAULT_CONNECT_TIMEOUT_S, check_address
from kdeval.jobs.grid.errors import GridError
from kdeval.jobs.grid.load import load_grid
from kdeval.jobs.run import service
from kdeval.jobs.run.drivers import describe_driver
from kdeval.jobs.run.progress import RunProgress
from kdeval.shown import shown
from kdeval.storage import TERMINAL_RUN_STATES, IndexStorageError, RunIndex, RunState

# Names, model ids, errors and paths come from users: nothing printed here is read as rich markup (every console is
# made with markup=False; styles are given as Text). Consoles are made per call (kdeval.cli.consoles).


CONNECT_HELP = ("Seconds the driver may take to join the cluster at --address; past them (or at once, when nothing "
                "listens there or it refuses this driver's token) it exits 1 with one line naming the address and "
                "the cause, and the run is marked failed.")


def _check_address(address: Optional[str]) -> None:
    """A malformed --address exits 2 before anything is written."""
    try:
        if address:
            check_address(address)
    except AddressError as e:
        stderr(markup=False).print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)


def _run_or_exit(index: RunIndex, ref: str):
    run = index.get_run(ref)
    if run is None:
        stderr(markup=False).print(f"error: no run '{shown(ref)}' (or the prefix is ambiguous); see `kdeval ls`")
        raise typer.Exit(EXIT_BAD_INPUT)
    return run


def _exit_code(index: RunIndex, run_id: str) -> int:
    run = index.get_run(run_id)
    return EXIT_OK if run is not None and run.state == RunState.DONE.value else EXIT_FAILED


def _execute(index: RunIndex, run_id: str, address: Optional[str], wait: bool = True,
             connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> int:
    """Run the scheduler with its progress on stderr (bars in a terminal, plain lines in a log: samples done /
    total and ETAs, cells waited for); print the status table; return the exit code."""
    def describe(rid: str) -> str:
        view = index.get_run(rid)
        return describe_driver(view) if view is not None else f"run {rid}"

    from kdeval.jobs.run.outcomes import ResultsDirError  # pyarrow: imported when a run executes, not for `ls`

    out, err = stdout(markup=False), stderr(markup=False)
    started = index.get_run(run_id)
    results_dir = started.results_dir if started is not None else None
    display = (RichProgress if err.is_terminal else PlainProgress)(err, run_id, describe)
    last: list[RunProgress] = []

    def on_progress(p: RunProgress) -> None:
        last[:] = [p]
        display.update(p)

    try:
        with display:
            outcome = service.execute_run(index, run_id, address=address, on_progress=on_progress, wait=wait,
                                          on_wait=lambda msg: err.print(msg, markup=False, highlight=False),
                                          connect_timeout_s=connect_timeout)
            display.close(last[0] if last else None)
    except (AddressError, service.RunBusyError, service.StaleRunError, PluginError) as e:
        err.print(f"error: {e}", markup=False, soft_wrap=True)
        return EXIT_BAD_INPUT
    except ConnectionError as e:  # the cluster could not be joined (the run is marked failed, saying why)
        err.print(f"error: {e}", markup=False, soft_wrap=True)
        return EXIT_FAILED
    except IndexStorageError as e:
        err.print(f"error: {e}; {_stop_run(index, run_id, str(e))}", soft_wrap=True)
        return EXIT_FAILED
    except ResultsDirError as e:  # no attempt can pass: nothing retried, the run stops
        index.recover_orphans(run_id)  # the attempts the stopped driver left running end lost
        err.print(f"error: --results-dir: {e}; {_stop_run(index, run_id, f'--results-dir: {e}', 'it can be written')}", markup=False,
                  highlight=False, soft_wrap=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        run = index.get_run(run_id)
        if run is not None and (run.driver_host, run.driver_pid) == (socket.gethostname(), os.getpid()):
            index.recover_orphans(run_id)  # this process was the run's driver (not one it waited for)
            index.set_run_state(run_id, RunState.CANCELLED, "interrupted (Ctrl-C)")
            err.print(f"interrupted; `kdeval resume {run_id}` continues the run")
        return EXIT_FAILED
    lost = index.storage_problem()  # emptied or replaced while the run held it open: not the run's answers
    if lost is not None:
        err.print(f"error: {lost}; the run is not reported done: its results are kept in {results_dir}, and "
                  f"`kdeval index rebuild --results-dir {results_dir}` makes an index again from them",
                  markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAILED
    if outcome.message:
        err.print(Text(outcome.message, style="yellow"))
    out.print(status_table(index, run_id, out.width))
    return _exit_code(index, run_id)


def _stop_run(index: RunIndex, run_id: str, why: str, once: str = "the index can be written") -> str:
    """Mark the run this process drove failed after its index (or results directory) failed, when the index
    takes it; says what the user can do."""
    then = f"`kdeval resume {run_id}` continues it once {once}"
    try:
        run = index.get_run(run_id)
        if run is None or (run.driver_host, run.driver_pid) != (socket.gethostname(), os.getpid()):
            return then  # it was not this process's run to mark
        index.set_run_state(run_id, RunState.FAILED, f"stopped: {why}")
    except IndexStorageError:
        return f"the run could not be marked failed either (its driver is gone): {then}"
    return f"run {run_id} is marked failed: {then}"


def _print_plan(name: str, p: "service.RunPlan") -> None:
    """The dry run's table: per cell its state, generation length, data source and spec; then the notes."""
    t = Table(title=Text(f"{name}: {len(p.cells)} cells, {len(p.done)} already done, {len(p.to_run)} to run",
                         style="table.title"), box=box.SIMPLE_HEAD)
    for col in ("cell", "state", "gen", "data", "spec"):
        t.add_column(col, overflow="fold", justify="right" if col == "gen" else "left")
    for c in p.cells:
        state = "done" if c.id in p.done else "to run" + (f" ({p.invalid[c.id]})" if c.id in p.invalid else "")
        t.add_row(c.id[:10], state, str(c.task.max_new_tokens), c.task.data_source, c.describe())
    stdout(markup=False).print(t)
    err = stderr(markup=False)
    for note in p.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)


def submit(
    grid_file: Path = typer.Argument(..., help="Grid YAML file (see examples/)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help=f"Where per-cell Parquet files go (default {service.DEFAULT_RESULTS_DIR})."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on: host:port, 'auto' or ray://head:10001; with --detach also a job server http://head:8265 (default: start Ray locally)."),
    detach: bool = typer.Option(False, "--detach", help="Return at once: the driver runs as a background process here (joining --address, if given), or as a Ray job on the cluster when --address is a job server http(s)://head:8265."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the cells and which are already done; write nothing."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Cells another live driver is computing: wait for them (default) or leave them (the run ends failed, naming that run)."),
    connect_timeout: float = typer.Option(DEFAULT_CONNECT_TIMEOUT_S, "--connect-timeout", min=0.1, help=CONNECT_HELP),
    plugin: list[str] = plugin_option(),
) -> None:
    """Validate a grid, record a run and execute its cells (cells already done are reused)."""
    from kdeval.jobs.grid.prompt_fit import check_prompts  # transformers' tokenizers: only when a grid is submitted

    out, err = stdout(markup=False), stderr(markup=False)
    load_cli_plugins(plugin)  # before the grid: it may name their policies
    try:
        grid, text = load_grid(grid_file)
        index = open_index(db, write=False) if dry_run and missing_index(db) is None else None
        if index is not None:  # a dry run never creates the index
            p = service.plan(index, grid)  # which probes the prompts too
        else:  # the prompts a model cannot take refused before the index is opened (service.plan probes them too)
            p = service.RunPlan(**vars(service.expand_grid(grid)), done=set()) if dry_run else None
            check_prompts(grid)
    except GridError as e:
        err.print(str(e.with_source(str(grid_file))), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    if dry_run:
        _print_plan(grid.name, p)
        raise typer.Exit(EXIT_OK)
    if detach and is_job_server(address):
        detach_ray_job(grid_file, db, results_dir, address, out, plugin)  # the run is recorded on the cluster
        raise typer.Exit(EXIT_OK)
    if is_job_server(address):
        err.print(f"error: --address: {address} is a Ray job server, which only --detach submits to; to run "
                  "here give the cluster's address (host:port, auto or ray://head:10001)",
                  markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    _check_address(address)
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
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    out.print(Text.assemble("run ", (run_id, "bold"),
                            f": {len(p.cells)} cells, {len(p.done)} already done, {len(p.to_run)} to run"))
    if detach:
        detach_local(index, run_id, db, address, connect_timeout, out, plugin)
        raise typer.Exit(EXIT_OK)
    raise typer.Exit(_execute(index, run_id, address, wait, connect_timeout))


def resume(
    run: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster to run on: host:port, 'auto' or ray://head:10001 (default: start Ray locally)."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="When the run's driver is alive elsewhere, wait for it to finish, then run what is left (default); with --no-wait, refuse. Cells other live drivers compute are waited for likewise."),
    connect_timeout: float = typer.Option(DEFAULT_CONNECT_TIMEOUT_S, "--connect-timeout", min=0.1, help=CONNECT_HELP),
    plugin: list[str] = plugin_option(),
) -> None:
    """Finish a run: retry failed and lost cells, never recompute done ones."""
    _check_address(address)
    load_cli_plugins(plugin)
    index = open_index(db)
    r = _run_or_exit(index, run)
    raise typer.Exit(_execute(index, r.id, address, wait, connect_timeout))  # --no-wait and a live driver: RunBusyError, exit 2


def status(
    run: Optional[str] = typer.Argument(None, help="Run id or prefix (default: all runs)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    watch: bool = typer.Option(False, "--watch", help="Refresh every second until the run ends."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    every: bool = typer.Option(False, "--all", help=f"Every cell of the run, however many (default: at most "
                               f"{MAX_ROWS}, failed, running and pending ones first)."),
) -> None:
    """Per-run and per-state counts; a run's cells with worker/node and failures with their error."""
    index = open_index(db, write=False)
    run_id = _run_or_exit(index, run).id if run else None
    if as_json:
        print(status_json(index, run_id))
        raise typer.Exit(EXIT_OK)
    out = stdout(markup=False)
    limit = None if every else MAX_ROWS
    render = (lambda: status_table(index, run_id, out.width, limit)) if run_id else (
        lambda: runs_table(index, out.width))
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
    out = stdout(markup=False)
    out.print(runs_table(open_index(db, write=False), out.width))


def cancel(
    run: str = typer.Argument(..., help="Run id or prefix."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Cancel a run: its driver stops dispatching at its next heartbeat and kills its workers."""
    index = open_index(db)
    r = _run_or_exit(index, run)
    before = service.cancel_run(index, r.id)
    out = stdout(markup=False)
    if before in TERMINAL_RUN_STATES:
        out.print(f"run {r.id} already {before}")
    else:
        out.print(f"run {r.id} cancelled (was {before}); `kdeval resume {r.id}` continues it")


def rescore(
    run: str = typer.Argument(..., help="Run id or prefix."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Recompute every stored prediction's score with the current metric code."""
    from kdeval.jobs.run.rescore import rescore_run

    index = open_index(db)
    r = _run_or_exit(index, run)
    with bad_input():
        report = rescore_run(index, r.id)
    out = stdout(markup=False)
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
    """``python -m kdeval.cli.service_cmds``: the service commands alone."""
    app = typer.Typer(add_completion=False, no_args_is_help=True)
    register(app)
    app()


if __name__ == "__main__":
    main()
