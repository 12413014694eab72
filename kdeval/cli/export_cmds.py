"""`kdeval export RUN --format parquet|csv|jsonl --out FILE`: every sample of a run's done cells, one file;
`--format kvpress|lm-eval --out DIR`: a new directory of kvpress result directories or lm-evaluation-harness
results and samples files.

Exit codes: 0 every cell of the run exported; 1 written, but some cells are missing (not done, or their
result file failed the integrity check: named on stderr); 2 bad input (unknown run, unknown format, an
--out whose directory does not exist or cannot be written; nothing is written).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.errors import EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, open_index
from kdeval.jobs.interop.export import DIR_FORMATS, FORMATS, export_run


def export(
    run: str = typer.Argument(..., help="Run id or a unique prefix."),
    fmt: Optional[str] = typer.Option(
        None, "--format", help=f"{', '.join([*FORMATS, *DIR_FORMATS])} (default: from the suffix of --out)."),
    out_file: Path = typer.Option(..., "--out", help="File to write (replaced atomically); for kvpress and lm-eval "
                                                     "a new (or empty) directory."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(
        None, "--results-dir", help="Where the Parquet files are, when moved since the run (default: as recorded)."),
) -> None:
    """One table of every sample of a run's done cells: identity columns (run_id, cell_id, model, policy,
    params, budget, chunk_size, task, length, seed, dtype, protocol) and every row column."""
    if fmt in DIR_FORMATS:
        _export_dir(run, fmt, out_file, db, results_dir)
    with bad_input():  # export_run checks --format and --out before it reads anything
        index = open_index(db, write=False)  # export only reads the index
        res = export_run(index, run, fmt, out_file, results_dir=results_dir)
    target = Path(out_file).expanduser().absolute()
    out, err = stdout(), stderr()
    out.print(f"run {res.run_id}: {res.table.num_rows} rows of {res.cells} cells -> {target}",
              highlight=False, markup=False, soft_wrap=True)
    if res.not_done:
        err.print(f"{res.not_done} cell(s) of the run are not done and not exported", highlight=False)
    for cell_id, why in res.skipped.items():
        err.print(f"cell {cell_id} left out: its result file is not usable ({why}); "
                  f"`kdeval resume {res.run_id}` recomputes it", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(EXIT_OK if res.complete else EXIT_FAILED)


def _export_dir(run: str, fmt: str, out_dir: Path, db: Optional[str], results_dir: Optional[Path]) -> None:
    """The kvpress / lm-eval exports: one directory, written whole or not at all."""
    with bad_input():
        from kdeval.jobs.interop.export_dir import check_out_dir, export_dir

        check_out_dir(out_dir)  # before the index is opened
        index = open_index(db, write=False)
        done, target, parts = export_dir(index, run, fmt, out_dir, results_dir=results_dir)
    what = "kvpress result directories" if fmt == "kvpress" else "lm-eval model folders"
    out, err = stdout(), stderr()
    out.print(f"run {done.run_id}: {len(done.cells)} cells -> {target} ({len(parts)} {what})",
              highlight=False, soft_wrap=True)
    if done.not_done:
        err.print(f"{done.not_done} cell(s) of the run are not done and not exported", highlight=False)
    for cell_id, why in done.skipped.items():
        err.print(f"cell {cell_id} left out: its result file is not usable ({why})", highlight=False, markup=False,
                  soft_wrap=True)
    raise typer.Exit(EXIT_OK if done.complete else EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add `export` to the main app."""
    app.command("export")(export)
