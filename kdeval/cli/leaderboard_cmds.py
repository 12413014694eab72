"""`kdeval leaderboard`: every done cell of the index for some models and tasks, one row per cell id, ranked, with
Δ against the full cache paired by sample id across runs (:mod:`kdeval.jobs.reports.leaderboard.build`).

Exit codes: 0 rows shown; 1 nothing found (said in one line); 2 bad input (an unknown model, task, policy or
protocol filter, an index without runs, a ``--run`` still in progress: one line).
The report modules (numpy, pyarrow, matplotlib) are imported when the command runs, not for ``--help``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from kdeval.cli.consoles import stderr, stdout
from kdeval.cli.errors import EXIT_FAILED, EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, open_index

#: Where ``--format html`` writes without ``--out`` (``kdeval report`` points at it).
DEFAULT_DIR = Path(".kdeval") / "leaderboard"
FORMATS = ("table", "md", "csv", "json", "html")


def parse_formats(text: str) -> list[str]:
    """``"table,html"`` -> ``["table", "html"]``; an unknown name is a ``ValueError`` naming the allowed ones."""
    names = list(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in FORMATS]
    if bad or not names:
        raise ValueError(f"--format: unknown format {bad[0] if bad else text!r}; expected one or more of "
                         f"{', '.join(FORMATS)} (comma-separated)")
    return names


def where_line(db: Optional[str]) -> str:
    """Where the leaderboard of the whole index is (``kdeval report`` ends with this line): the page when one was
    written to the default place, else the command that writes it."""
    page = DEFAULT_DIR / "leaderboard.html"
    flags = f" --db {db}" if db else ""
    if page.is_file():
        return f"leaderboard (every run of the index): {page}; `kdeval leaderboard{flags} --format html` refreshes it"
    return (f"leaderboard (every run of the index): `kdeval leaderboard{flags}`; with --format html it is written to "
            f"{page}")


def _say(console: Console, line: str) -> None:
    console.print(line, highlight=False, markup=False, soft_wrap=True)


def leaderboard(
    model: Optional[List[str]] = typer.Option(None, "--model", help="Only this model (repeat for several)."),
    task: Optional[List[str]] = typer.Option(None, "--task", help="Only this task: a name (ruler.niah_single_1), a "
                                             "benchmark (ruler) or a task instance (needle@1024#s0); repeatable."),
    policy: Optional[List[str]] = typer.Option(None, "--policy", help="Only this policy (name or label); "
                                               "repeatable. Full-cache references are read whatever it says."),
    protocol: Optional[List[str]] = typer.Option(None, "--protocol", help="Only this protocol: prompt/evict, "
                                                 "context/keep ..., or query-aware / query-agnostic; repeatable."),
    run: Optional[List[str]] = typer.Option(None, "--run", help="Only cells these runs list (ids or prefixes; "
                                            "default: every run of the index)."),
    rank: str = typer.Option("score", "--rank", help="Rank each model × task instance by score or by delta."),
    fmt: str = typer.Option("table", "--format", help="table, md, csv, json, html (comma-separated for several)."),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help=f"Directory for leaderboard.<format>. Without it one md/csv/json format goes to stdout "
                            f"and html goes to {DEFAULT_DIR}/."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    results_dir: Optional[Path] = typer.Option(None, "--results-dir", help="Where the Parquet files are, when "
                                               "moved since their runs (default: as recorded in the index)."),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples for the CIs."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed."),
) -> None:
    """Every done cell of the index, one row per cell id, ranked, with Δ vs the full cache paired across runs."""
    from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard
    from kdeval.jobs.reports.leaderboard.cells import Filters
    from kdeval.jobs.reports.leaderboard import views
    from kdeval.jobs.reports.render.layout import render
    from kdeval.jobs.reports.leaderboard.output import write_files

    with bad_input():
        fmts = parse_formats(fmt)
        files = [f for f in fmts if f != "table"]
        to_stdout = out_dir is None and len(files) == 1 and files != ["html"] and "table" not in fmts
        if out_dir is None and not to_stdout and [f for f in files if f != "html"]:
            raise ValueError("--out DIR is needed to write md, csv or json beside another format")
        options = LeaderboardOptions(order=rank, resamples=resamples, seed=seed, results_dir=results_dir)
        index = open_index(db, write=False)
        filters = Filters(*(tuple(x or ()) for x in (model, task, policy, protocol, run)))
        board = build_leaderboard(index, filters, options)
    if not board.rows:
        what = "; ".join(f"{k} {', '.join(v)}" for k, v in board.meta.filters.items()) or "any filter"
        _say(stderr(), f"nothing found: no done cell in the index matches {what}")
        raise typer.Exit(EXIT_FAILED)
    if to_stdout:
        sys.stdout.write({"md": views.to_markdown, "csv": views.to_csv, "json": views.to_json}[files[0]](board))
        raise typer.Exit(EXIT_OK)
    out = stdout()
    if "table" in fmts:
        _say(out, views.summary_line(board))
        for view in views.table_views(board, long=False):
            out.print(render(view, out.width))
        for line in [views.caption(board), *board.meta.notes, *board.meta.warnings]:
            out.print(line, highlight=False, markup=False)  # wrapped at the terminal's width
    if files:
        for name, path in write_files(board, out_dir or DEFAULT_DIR, files).items():
            _say(out, f"{name}: {path}")
    raise typer.Exit(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add `leaderboard` to the main app."""
    app.command("leaderboard")(leaderboard)
