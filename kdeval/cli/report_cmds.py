"""`kdeval report` and `kdeval nightly`: paired deltas with CIs, report files, the regression gate.

Exit codes: 0 ok; 1 a regression was found, or some cells failed / are missing; 2 bad input.
The report modules (numpy, pyarrow, matplotlib) are imported when a command runs, not for ``--help``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kdeval.cli.errors import EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, open_index  # storage: SQLAlchemy and pyarrow, no torch or Ray
from kdeval.storage import RunIndex

if TYPE_CHECKING:
    from kdeval.jobs.reports import Report

out = Console()  # the terminal's width: tables fold to fit it
err = Console(stderr=True)

RESULTS_HELP = "Where the Parquet files are, when moved since the run (default: as recorded in the index)."


def print_report(report: "Report", console: Console = out, detail: bool = False) -> None:
    """The terminal tables of a report: scores, speed, memory, cells not done; then its warnings."""
    from kdeval.jobs.reports.terminal import (cells_table, contrast_tables, memory_table, scores_table, speed_table,
                                              warning_lines)

    width = console.width
    console.print(scores_table(report, width, detail=detail))
    for table in contrast_tables(report, width):
        console.print(table)
    if report.perf:
        console.print(speed_table(report, width))
        console.print(memory_table(report, width))
    bad = cells_table(report, width)
    if bad is not None:
        console.print(bad)
    for line in warning_lines(report):
        console.print(line, highlight=False, soft_wrap=True)


def _latest_run(index: RunIndex) -> list[str]:
    runs = index.list_runs()
    if not runs:
        raise ValueError("the index has no runs; `kdeval submit grid.yaml` first")
    return [runs[0].id]


def report(
    runs: Optional[List[str]] = typer.Argument(None, help="Run ids or prefixes (default: the newest run)."),
    compare: str = typer.Option("full", "--compare", help="'full' (the full cache of the same run) or a run id."),
    fmt: str = typer.Option("table", "--format", help="table, md, csv, json, html (comma-separated for several)."),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Directory for the report files. Without it one md/json/csv format goes to stdout "
                            "(csv: the scores table) and html goes to .kdeval/reports/<run>/."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help=RESULTS_HELP),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples for the CIs."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
    detail: bool = typer.Option(False, "--detail", help="Terminal table: also per length / depth / level rows."),
) -> None:
    """Scores per model × task × policy × budget × chunk with paired deltas and 95% bootstrap CIs."""
    from kdeval.jobs.reports import ReportOptions, build_report, formats
    from kdeval.jobs.reports.output import parse_formats, write_report
    from kdeval.jobs.reports.terminal import warning_lines

    with bad_input():  # open_index's exit passes through
        fmts = parse_formats(fmt)
        index = open_index(db, write=False)  # reports read: a read-only index will do
        run_ids = list(runs) if runs else _latest_run(index)
        rep = build_report(index, run_ids, ReportOptions(compare=compare, resamples=resamples, seed=seed,
                                                        results_dir=results_dir))
    files = [f for f in fmts if f != "table"]
    if files and out_dir is None and files != ["html"] and len(files) == 1:
        text = {"md": formats.to_markdown, "json": formats.to_json,
                "csv": lambda r: formats.csv_text(r, "scores")}[files[0]](rep)
        sys.stdout.write(text)
        for line in warning_lines(rep):  # stdout holds the file; the warning goes to the terminal
            err.print(line, highlight=False, soft_wrap=True)
    else:
        if "table" in fmts:
            print_report(rep, detail=detail)
        else:
            for line in warning_lines(rep):
                out.print(line, highlight=False, soft_wrap=True)
        if files:
            target = out_dir or Path(".kdeval") / "reports" / rep.meta.runs[0]
            for name, path in write_report(rep, target, files).items():
                out.print(f"{name}: {path}", highlight=False, markup=False)
    raise typer.Exit(EXIT_FAILED if rep.n_incomplete_cells else EXIT_OK)


def nightly(
    nightly_file: Path = typer.Argument(..., help="Grid file with a nightly: section (see examples/nightly.yaml); "
                                                   "or `history GRID --out DIR`: write the history page."),
    history_of: Optional[Path] = typer.Argument(None, metavar="[GRID]", help="With `history`: the nightly file."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir",
                                               help="Where per-cell Parquet files go (default .kdeval/results)."),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster address (default: start Ray locally)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Report directory (default: nightly.report_dir); "
                                                              "with `history`: where the page goes."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Compare with this run (overrides nightly.baseline)."),
    run: Optional[str] = typer.Option(None, "--run", help="Gate this existing run instead of running the grid."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict summary as JSON (nothing else)."),
) -> None:
    """Run (or resume) the grid, compare it with the last passing nightly, exit 1 on a regression."""
    from kdeval.cli import nightly_cmds
    from kdeval.jobs import nightly as nightly_job

    if history_of is not None or str(nightly_file) == "history":
        with bad_input():
            if str(nightly_file) != "history" or history_of is None:
                raise ValueError("expected `kdeval nightly GRID` or `kdeval nightly history GRID --out DIR`")
            nightly_cmds.history(history_of, out_dir, None, out)
        raise typer.Exit(EXIT_OK)
    with bad_input():
        nf = nightly_job.load_nightly(nightly_file)
        index = open_index(db, must_exist=run is not None)  # gating an existing run needs an existing index
        results_dir = results_dir or nightly_job.service.DEFAULT_RESULTS_DIR
        try:
            outcome = nightly_job.run_nightly(index, nf, results_dir=results_dir, address=address,
                                              report_dir=out_dir, baseline=baseline, existing_run=run)
        except (ConnectionError, LookupError, nightly_job.service.RunBusyError) as e:  # no cluster, no run, busy
            raise ValueError(str(e)) from None
    if as_json:
        print(nightly_cmds.verdict_summary(outcome.summary))
        raise typer.Exit(outcome.exit_code)
    print_report(outcome.report)
    g = outcome.gate
    verb = "resumed" if outcome.resumed else "ran"
    out.print(f"nightly {nf.grid.name}: {verb if run is None else 'gated'} run {outcome.run}; baseline "
              f"{g.baseline or 'none yet (this run becomes the baseline if it passes)'}; "
              f"{g.checked} tracked numbers checked", highlight=False, markup=False)
    for f in g.regressions:
        out.print(f"[bold red]REGRESSION[/] {escape(f.describe())}", highlight=False)
    if g.failed_cells:
        out.print(f"[bold red]{len(g.failed_cells)} cell(s) failed or missing[/]", highlight=False)
    nightly_cmds.print_extras(out, outcome.summary)
    for name, path in outcome.files.items():
        out.print(f"{name}: {path}", highlight=False, markup=False)
    out.print("[bold green]PASS[/]" if g.passed else "[bold red]FAIL[/]")
    raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    """Add `report` and `nightly` to the main app."""
    app.command("report")(report)
    app.command("nightly")(nightly)
