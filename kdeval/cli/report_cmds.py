"""`kdeval report`: paired deltas with CIs and report files (the terminal tables `kdeval nightly` prints too).

Exit codes: 0 ok; 1 some cells failed / are missing; 2 bad input (also an --out that is a file, a device or a
symbolic link, or that cannot be written: one line).
The report modules (numpy, pyarrow, matplotlib) are imported when a command runs, not for ``--help``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.console import Console

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, open_index  # storage: SQLAlchemy and pyarrow, no torch or Ray
from kdeval.cli.leaderboard_cmds import where_line
from kdeval.storage import RunIndex

if TYPE_CHECKING:
    from kdeval.jobs.reports import Report

RESULTS_HELP = "Where the Parquet files are, when moved since the run (default: as recorded in the index)."


def print_report(report: "Report", console: Console, detail: bool = False) -> None:
    """The terminal tables of a report: scores, contrasts, conversations by turn, speed, answer length, memory,
    cells not done; then its warnings."""
    from kdeval.jobs.reports.render.terminal import (cells_table, contrast_tables, conversation_tables, length_table,
                                                     memory_table, scores_table, speed_table, warning_lines)

    width = console.width
    console.print(scores_table(report, width, detail=detail))
    for table in contrast_tables(report, width) + conversation_tables(report, width):
        console.print(table)
    if report.perf:
        console.print(speed_table(report, width))
        length = length_table(report, width)
        if length is not None:
            console.print(length)
        console.print(memory_table(report, width))
    bad = cells_table(report, width)
    if bad is not None:
        console.print(bad)
    for line in warning_lines(report):
        console.print(line, highlight=False, soft_wrap=True)


def print_broken(report: "Report", console: Console) -> None:
    """``kdeval report --broken``: the broken-sample table (or a line saying there is none), then the warnings."""
    from kdeval.jobs.reports.render.terminal import broken_table, warning_lines

    table = broken_table(report, console.width)
    if table is None:
        console.print(f"nothing broken: no sample that {report.meta.compare} answers fails under a policy",
                      highlight=False, markup=False)
    else:
        console.print(table)
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
    broken: bool = typer.Option(False, "--broken", help="Print only what compression broke: per policy × budget × "
                                "task, the samples the reference answers (score >= 0.5) and the policy does not, "
                                "with both predictions and the gold answer."),
) -> None:
    """Scores per model × task × policy × budget × chunk with paired deltas and 95% bootstrap CIs."""
    from kdeval.jobs.interop.out_paths import check_dir_target
    from kdeval.jobs.reports import ReportOptions, build_report
    from kdeval.jobs.reports.render import formats
    from kdeval.jobs.reports.render.output import parse_formats, write_report
    from kdeval.jobs.reports.render.terminal import warning_lines

    with bad_input():  # open_index's exit passes through
        fmts = parse_formats(fmt)
        if out_dir is not None:  # a file, a device, a symbolic link: refused before anything is read
            check_dir_target(Path(out_dir).expanduser().absolute())
        index = open_index(db, write=False)  # reports read: a read-only index will do
        run_ids = list(runs) if runs else _latest_run(index)
        rep = build_report(index, run_ids, ReportOptions(compare=compare, resamples=resamples, seed=seed,
                                                        results_dir=results_dir))
    out, err = stdout(), stderr()  # this call's terminal width: tables fold to fit it
    if broken:
        print_broken(rep, out)
        raise typer.Exit(EXIT_FAILED if rep.n_incomplete_cells else EXIT_OK)
    files = [f for f in fmts if f != "table"]
    if files and out_dir is None and files != ["html"] and len(files) == 1:
        text = {"md": formats.to_markdown, "json": formats.to_json,
                "csv": lambda r: formats.csv_text(r, "scores")}[files[0]](rep)
        sys.stdout.write(text)
        for line in warning_lines(rep):  # stdout holds the file; the warning goes to the terminal
            err.print(line, highlight=False, soft_wrap=True)
    else:
        if "table" in fmts:
            print_report(rep, out, detail=detail)
        else:
            for line in warning_lines(rep):
                out.print(line, highlight=False, soft_wrap=True)
        if files:
            target = out_dir or Path(".kdeval") / "reports" / rep.meta.runs[0]
            try:
                written = write_report(rep, target, files)
            except OSError as e:  # read-only, full, not a directory: one line, not a traceback
                err.print(f"error: --out: cannot write {Path(target).expanduser().absolute()}: {e.strerror or e}",
                          highlight=False, markup=False, soft_wrap=True)
                raise typer.Exit(EXIT_BAD_INPUT)
            for name, path in written.items():
                out.print(f"{name}: {path}", highlight=False, markup=False)
        out.print(where_line(db), highlight=False, markup=False)
    raise typer.Exit(EXIT_FAILED if rep.n_incomplete_cells else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add `report` to the main app."""
    app.command("report")(report)
