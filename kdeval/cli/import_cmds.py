"""`kdeval import kvpress DIR`: a kvpress evaluation result as an external run of the index.

Exit codes: 0 imported; 1 nothing imported because the results directory or the index failed midway (a full
disk: what was written is removed, and the import can be run again); 2 bad input (a DIR that holds no kvpress
result or an unreadable one, a file in it that resolves outside it, results imported already, a bad --db or
--results-dir; nothing is written).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.errors import EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, check_results_dir, open_index
from kdeval.storage import IndexStorageError

imports = typer.Typer(help="Import another tool's results (kvpress) as an external run that reports compare.",
                      no_args_is_help=True)


@imports.command("kvpress")
def kvpress(
    directory: Path = typer.Argument(..., help="A kvpress result directory (predictions.csv, metrics.json, "
                                               "config.yaml) or a directory of them."),
    model: Optional[str] = typer.Option(None, "--model", help="The kdeval model id the results are of (default: "
                                                              "kvpress's model name), so reports pair their cells."),
    seed: int = typer.Option(0, "--seed", help="The task seed the cells are filed under (kdeval grids: 0)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help="Where the imported rows' Parquet files "
                                                                            "go (default .kdeval/results)."),
) -> None:
    """Record a kvpress evaluation (its predictions, kdeval's per-sample scores of them, its ratio and metrics) as
    a done run marked external; `kdeval report RUN --compare <this run>` sets kdeval's numbers beside it."""
    from kdeval.jobs.run import service
    from kdeval.jobs.interop.kvpress_import import import_kvpress, read_import

    with bad_input():
        cells = read_import(directory, model, seed)  # a bad DIR exits 2 before the index is opened
        results_dir = results_dir or service.DEFAULT_RESULTS_DIR
        check_results_dir(results_dir)
        index = open_index(db, must_exist=False)
        err = stderr(markup=False, highlight=False)
        try:
            run_id, cells = import_kvpress(index, directory, results_dir, model=model, seed=seed, cells=cells)
        except OSError as e:  # the results directory filled up: what was written is removed, the index untouched
            err.print(f"error: nothing imported: --results-dir {results_dir}: {e.strerror or e}; the import can "
                      "be run again", soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
        except IndexStorageError as e:
            err.print(f"error: the import is not recorded: {e}; the import can be run again", soft_wrap=True)
            raise typer.Exit(EXIT_FAILED)
    n = sum(len(c.rows) for c in cells)
    stdout().print(f"run {run_id}: {len(cells)} cells, {n} predictions imported from kvpress (external)",
                   highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add `import` (with its `kvpress` subcommand) to the main app."""
    app.add_typer(imports, name="import")
