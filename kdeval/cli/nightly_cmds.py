"""`kdeval nightly`: run (or resume) a nightly grid, gate it against its baseline, print the verdict (the report's
tables, then the lines that name regressions, speed regressions, drifts, the attribution and on_fail, or the
``--json`` verdict summary); `kdeval nightly history GRID --out DIR` writes the history page.

Exit codes: 0 the gate passed; 1 a regression was found, or some cells failed / are missing; 2 bad input.
The nightly and report modules are imported when the command runs, not for ``--help``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from kdeval.cli.plugin_opts import load_cli_plugins, plugin_option
from kdeval.cli.consoles import stdout
from kdeval.cli.errors import EXIT_OK, bad_input
from kdeval.cli.index_access import DB_HELP, open_index
from kdeval.cli.report_cmds import print_report

#: The gate.json keys ``--json`` prints (the per-night series the history page needs are left out).
SUMMARY_KEYS = ("run", "grid", "grid_hash", "baseline", "passed", "checked", "regressions", "speed_regressions",
                "drift", "failed_cells", "time", "reuse", "attribution", "on_fail")


def verdict_summary(summary: dict[str, Any]) -> str:
    """The ``--json`` output: the verdict and what decided it (one JSON object)."""
    return json.dumps({k: summary[k] for k in SUMMARY_KEYS if k in summary}, indent=2, default=str)


def print_extras(out: Console, summary: dict[str, Any]) -> None:
    """Speed regressions, drifts, the attribution's causes and the on_fail command's outcome."""
    for text in summary.get("speed_regressions", []):
        out.print(f"[bold red]SPEED[/] {escape(text)}", highlight=False)
    for d in summary.get("drift", []):
        out.print(f"[bold yellow]DRIFT[/] {escape(d['text'])}", highlight=False)
    attribution = summary.get("attribution")
    if attribution:
        for r in attribution["regressions"]:
            for c in r["cells"][:3]:
                out.print(f"  driven by {escape(c['text'])}", highlight=False)
        for c in attribution["changes"]:
            out.print(f"  changed: {escape(c['what'])}: {escape(c['baseline'])} → {escape(c['tonight'])}",
                      highlight=False)
    hook = summary.get("on_fail")
    if hook is not None:
        state = "ran" if hook["ok"] else f"FAILED ({hook['error']}; the verdict stands)"
        out.print(f"on_fail {escape(' '.join(hook['command']))}: {escape(state)}", highlight=False)


def history(nightly_file: Path, out_dir: Optional[Path], report_dir: Optional[Path], out: Console) -> None:
    """Write the history page of a nightly file's grid (raises ValueError on bad input)."""
    from kdeval.jobs.nightly.history import write_history
    from kdeval.jobs.nightly.spec import load_nightly

    if out_dir is None:
        raise ValueError("kdeval nightly history GRID --out DIR: --out is required")
    nf = load_nightly(nightly_file)
    page = write_history(nf, out_dir, report_dir)
    out.print(f"history: {page}", highlight=False)


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
    plugin: list[str] = plugin_option(),
) -> None:
    """Run (or resume) the grid, compare it with the last passing nightly, exit 1 on a regression."""
    from kdeval.jobs.nightly.run import run_nightly
    from kdeval.jobs.nightly.spec import load_nightly
    from kdeval.jobs.run import service

    out = stdout()
    if history_of is not None or str(nightly_file) == "history":
        with bad_input():
            if str(nightly_file) != "history" or history_of is None:
                raise ValueError("expected `kdeval nightly GRID` or `kdeval nightly history GRID --out DIR`")
            history(history_of, out_dir, None, out)
        raise typer.Exit(EXIT_OK)
    load_cli_plugins(plugin)  # before the grid: it may name their policies
    with bad_input():
        nf = load_nightly(nightly_file)
        index = open_index(db, must_exist=run is not None)  # gating an existing run needs an existing index
        results_dir = results_dir or service.DEFAULT_RESULTS_DIR
        try:
            outcome = run_nightly(index, nf, results_dir=results_dir, address=address,
                                              report_dir=out_dir, baseline=baseline, existing_run=run)
        except (ConnectionError, LookupError, service.RunBusyError) as e:  # no cluster, no run, busy
            raise ValueError(str(e)) from None
    if as_json:
        print(verdict_summary(outcome.summary))
        raise typer.Exit(outcome.exit_code)
    print_report(outcome.report, out)
    g = outcome.gate
    verb = "resumed" if outcome.resumed else "ran"
    out.print(f"nightly {nf.grid.name}: {verb if run is None else 'gated'} run {outcome.run}; baseline "
              f"{g.baseline or 'none yet (this run becomes the baseline if it passes)'}; "
              f"{g.checked} tracked numbers checked", highlight=False, markup=False)
    for f in g.regressions:
        out.print(f"[bold red]REGRESSION[/] {escape(f.describe())}", highlight=False)
    if g.failed_cells:
        out.print(f"[bold red]{len(g.failed_cells)} cell(s) failed or missing[/]", highlight=False)
    print_extras(out, outcome.summary)
    for name, path in outcome.files.items():
        out.print(f"{name}: {path}", highlight=False, markup=False)
    out.print("[bold green]PASS[/]" if g.passed else "[bold red]FAIL[/]")
    raise typer.Exit(outcome.exit_code)


def register(app: typer.Typer) -> None:
    """Add `nightly` to the main app."""
    app.command("nightly")(nightly)
