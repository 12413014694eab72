"""Build the results page (docs/results.md and its figures) from grids in examples/paper-claims/, in one command.

    python bench/results_page.py examples/paper-claims/smollm2_2k.yaml examples/paper-claims/smollm2_4k.yaml \
        examples/paper-claims/gemma3_2k.yaml --out docs/results.md

The grids run in the order given (the claims that need the most cells first).

Each grid is submitted with ``kdeval submit`` (cells already done in the index are reused, so a second call only
redraws), then the leaderboard of those runs (``kdeval leaderboard``'s rows) is checked claim by claim
(bench/results_claims.py) and written as the page: the claims with their numbers and CIs, the per-task tables,
the score-vs-budget and score-vs-KV-bytes figures (PNG files beside the page, under ``results-figures/``), the
leaderboard page itself, and under it the command, the wall time and the machine.

``--slice`` checks the command end to end in a few minutes: each grid cut to its first task, first budget, the
full cache, KeyDiff and StreamingLLM, 2 samples a cell, and the page marked as a slice (never results).
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_claims import CLAIMS, Finding, claim_gap_grows, claim_keydiff_vs_baselines, claim_window_helps, overall  # noqa: E402

from kdeval.jobs.reports.leaderboard.build import LeaderboardOptions, build_leaderboard  # noqa: E402
from kdeval.jobs.reports.leaderboard.cells import Filters  # noqa: E402
from kdeval.jobs.reports.render.formats import md_table  # noqa: E402
from kdeval.jobs.reports.leaderboard.output import write_files  # noqa: E402
from kdeval.jobs.reports.leaderboard.plots import task_figure  # noqa: E402
from kdeval.jobs.reports.leaderboard.views import caption, groups, table_views  # noqa: E402
from kdeval.jobs.reports.samples import Samples, load_cell  # noqa: E402
from kdeval.storage import RunIndex  # noqa: E402

SLICE_POLICIES = ("full", "keydiff", "sink")


def slice_grid(grid: dict) -> dict:
    """A few-minute cut of ``grid``: its first task and budget, full / keydiff / sink, 2 samples a cell."""
    policies = [p for p in grid["policies"] if (p if isinstance(p, str) else p["name"]) in SLICE_POLICIES
                and (isinstance(p, str) or not p.get("params"))]
    task = dict(grid["tasks"][0], samples=2)
    return dict(grid, name=f"{grid['name']}-slice", policies=policies, budgets=grid["budgets"][:1], tasks=[task])


def submit(grid_path: Path, db: Path, results: Path) -> tuple[str, float]:
    """``kdeval submit`` one grid (its progress on this terminal); the run id and the wall seconds."""
    name = yaml.safe_load(grid_path.read_text(encoding="utf-8"))["name"]
    start = time.monotonic()
    rc = subprocess.run([sys.executable, "-m", "kdeval.cli.app", "submit", str(grid_path), "--db", str(db),
                         "--results-dir", str(results)]).returncode
    seconds = time.monotonic() - start
    if rc not in (0, 1):
        sys.exit(f"kdeval submit {grid_path} exited {rc}")
    index = RunIndex.open(db, write=False)
    run = next(r for r in index.list_runs() if r.name == name)
    index.close()
    return run.id, seconds


def _md_findings(findings: list[Finding]) -> list[str]:
    lines = []
    for claim, text in CLAIMS.items():
        lines += ["", f"### {claim}. {text}: **{overall(claim, findings)}**", ""]
        mine = [f for f in findings if f.claim == claim]
        if not mine:
            lines.append("No cell of these runs tests it (see what this page does not test, below).")
            continue
        lines += ["| where | compared | margin [95% CI] | n | each side | verdict |", "|---|---|---:|---:|---|---|"]
        for f in mine:
            margin = "" if f.margin is None else f"{f.margin:+.2f}" + (
                f" [{f.low:.2f}, {f.high:.2f}]" if f.low is not None else "")
            lines.append(f"| {f.where} | {f.compared} | {margin} | {f.n} | {f.detail} | {f.verdict} |")
    return lines


def machine() -> str:
    """The machine in one line: OS, CPU, cores, Python, torch."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU {platform.processor() or platform.machine()}"
    return (f"{platform.system()} {platform.release()}, {device}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, torch {torch.__version__}")


def commit() -> str:
    """The checkout's commit (the cells' code is the ``kdeval/`` of that tree), or why it is unknown."""
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    return f"commit {got.stdout.strip()}" if got.returncode == 0 else "commit unknown (not a git checkout)"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grids", nargs="+", type=Path, help="Grid files (examples/paper-claims/*.yaml).")
    ap.add_argument("--out", type=Path, default=Path("docs/results.md"), help="The page (default docs/results.md).")
    ap.add_argument("--db", type=Path, default=Path(".kdeval/results-page/index.sqlite"))
    ap.add_argument("--results-dir", type=Path, default=Path(".kdeval/results-page/results"))
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--slice", action="store_true", help="A few-minute check of the command (not results).")
    args = ap.parse_args(argv)
    command = "python bench/results_page.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    args.db.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs, walls = [], []
    for grid in args.grids:
        path = grid
        if args.slice:
            path = args.db.parent / f"slice-{grid.name}"
            path.write_text(yaml.safe_dump(slice_grid(yaml.safe_load(grid.read_text(encoding="utf-8")))),
                            encoding="utf-8")
        run, seconds = submit(path, args.db, args.results_dir)
        runs.append(run)
        walls.append(f"{grid.name}: {seconds / 60:.1f} min (run {run})")
    index = RunIndex.open(args.db, write=False)
    boot = dict(resamples=args.resamples, seed=0, confidence=0.95)
    board = build_leaderboard(index, Filters(runs=tuple(runs)), LeaderboardOptions(**boot))
    cache: dict[str, Samples] = {}

    def samples(cell_id: str) -> Samples:
        if cell_id not in cache:
            cache[cell_id] = load_cell(index.get_cell(cell_id), "", None).samples
        return cache[cell_id]

    first = claim_keydiff_vs_baselines(board, samples, **boot)
    findings = first + claim_gap_grows(first) + claim_window_helps(board, samples, **boot)
    assets = args.out.parent / f"{args.out.stem}-figures"  # (git ignores folders named results/)
    assets.mkdir(parents=True, exist_ok=True)
    write_files(board, assets, ["html"])
    lines = ["# Results: do the KeyDiff paper's claims hold on a real model?", ""]
    if args.slice:
        lines += ["> **SLICE**: 2 samples a cell, a check that the command runs end to end. These numbers are "
                  "not results.", ""]
    lines += [f"Grids: {', '.join(f'`{g.as_posix()}`' for g in args.grids)}. Every row of the tables is one cell; "
              "Δ is paired by sample id against the full cache with a 95% bootstrap CI. "
              f"[The leaderboard page]({assets.name}/leaderboard.html) sorts and filters them.", "", "## Claims"]
    lines += _md_findings(findings)
    lines += ["", "## Per task", "", caption(board)]
    for view in table_views(board, with_code=False):
        lines += [""] + md_table(view)
    lines += ["", "## Figures"]
    for (model, task), rows in groups(board).items():
        slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{model}-{task}")
        (assets / f"{slug}.png").write_bytes(task_figure(f"{model} — {task}", rows))
        lines += ["", f"![{model} {task}: score vs budget and vs KV bytes]({assets.name}/{slug}.png)"]
    computed = sum((index.get_cell(r.cell).duration_s or 0.0) for r in board.rows)
    lines += ["", "## What this page does not test", "",
              "- Claim 3 needs a reasoning task: SmolLM2-135M cannot solve MATH-500, so the grids pair KeyDiff with "
              "a sliding window against plain KeyDiff on retrieval only (shown, not counted); "
              "`examples/paper/math500.yaml` is the paper-sized check on a GPU.",
              "- On Gemma-3-270M the budget N holds only in its 3 full-attention layers: its 15 sliding layers keep "
              "their 512-token window whole under every policy, so its rows compare policies on a sixth of the "
              "layers (`layer_kinds` and `windowed_kv_bytes` in each row say so)."]
    lines += ["", "## How this page was made", "", f"- command: `{command}`",
              f"- wall time: {(time.monotonic() - started) / 60:.1f} min in all; " + "; ".join(walls)
              + f"; the cells' own compute time (cells reused from earlier runs included): {computed / 60:.1f} min",
              f"- code: {commit()}", f"- machine: {machine()}", f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"page: {args.out}")


if __name__ == "__main__":
    main()
