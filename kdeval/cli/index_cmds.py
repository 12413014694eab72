"""`kdeval index rebuild`: an index made again from a results directory (each part and each run's manifest
says what it is; see :mod:`kdeval.jobs.run.recovery`).

Exit codes: 0 every cell found in the results is done again; 1 some cells (or run manifests) could not be
recovered (each named with why); 2 bad input (an unusable --db or --results-dir).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from kdeval.cli.index_access import DB_HELP, open_index


index_app = typer.Typer(help="Rebuild the index from a results directory: runs, cells and summaries (not attempt "
                             "history).", no_args_is_help=True)


@index_app.command("rebuild")
def rebuild(
    results_dir: Path = typer.Option(..., "--results-dir", help="The results directory to read (its cells/ and runs/)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Rebuild runs, cells and their summaries from the Parquet parts and run manifests of a results directory.

    Runs the index already has are left as they are; cells are checked as integrity checks them before they
    count as done; attempt history (errors, retries, timings of attempts) is not recovered."""
    from kdeval.jobs.run import service
    from kdeval.jobs.run.recovery import rebuild_index

    out, err = stdout(markup=False, highlight=False), stderr(markup=False, highlight=False)
    if not (results_dir / "cells").is_dir() and not (results_dir / "runs").is_dir():
        err.print(f"error: --results-dir: {results_dir} holds no cells/ or runs/ directory (not a kdeval results "
                  "directory)", soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    index = open_index(db, must_exist=False)
    done = rebuild_index(index, results_dir, service.default_workload)
    out.print(f"rebuilt {len(done.runs)} run(s) with {done.cells_done} done cell(s) from {results_dir}"
              + (f"; {len(done.skipped_runs)} run(s) already in the index left as they were" if done.skipped_runs
                 else "") + "; attempt history is not recovered", soft_wrap=True)
    for what, why in done.lost.items():
        err.print(f"not recovered: {what}: {why}", soft_wrap=True)
    raise typer.Exit(EXIT_FAILED if done.lost else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the `index` group to the main app."""
    app.add_typer(index_app, name="index")
