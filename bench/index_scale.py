"""The index at 20,000 cells: `kdeval status RUN`, `ls`, `leaderboard`, `report` and `export --format csv` on
a synthetic index, each timed in a fresh process (wall time and peak RSS).

The index is one run of ``--cells`` done cells (10 policies × 10 budgets × seeds of ``needle`` at 1024 tokens,
4 samples a cell, each cell its own Parquet part), made once through the index's own API into ``--dir`` and
reused by later calls (making 20,000 cells takes a few minutes on 2 cores).

    python bench/index_scale.py --dir /tmp/kdeval-scale              # 20,000 cells
    python bench/index_scale.py --dir /tmp/kdeval-scale-2k --cells 2000
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["keydiff", "snapkv", "tova", "h2o", "sink", "knorm", "random", "pyramidkv", "ada-keydiff",
            "chunkkv"]
BUDGETS = [32, 64, 96, 128, 160, 192, 224, 256, 320, 384]
RUN = "20261207-000000-5ca1e0"


def build(where: Path, cells: int) -> None:
    """One run of ``cells`` done cells (and one full-cache cell per seed) in ``where``."""
    sys.path.insert(0, str(ROOT))
    from tests.jobs.reports.helpers import FakeCell, record_done, rows
    from kdeval.storage import CellRecord, RunIndex, RunState
    from kdeval.evals.task_run.budget import budget_share, budget_tokens

    per_seed = len(POLICIES) * len(BUDGETS)
    seeds = max(1, cells // per_seed)
    fakes = [FakeCell("full", None, seed=s, rows=rows([1, 1, 0, 1])) for s in range(seeds)]
    fakes += [FakeCell(p, b, seed=s, rows=rows([1, 0, i % 2, 1]), summary={"score": 50.0 + i % 50})
              for s in range(seeds) for i, (p, b) in enumerate((p, b) for p in POLICIES for b in BUDGETS)]
    idx = RunIndex.open(where / "index.sqlite")
    records = [CellRecord(id=c.cell_id("v1"), spec=c.spec("v1"), model=c.model, policy=c.policy,
                          budget=budget_tokens(c.budget), chunk_size=c.chunk, task=c.label,
                          budget_share=budget_share(c.budget)) for c in fakes]
    idx.create_run(RUN, name="scale", grid_yaml="name: scale\n", grid_hash="scale",
                   results_dir=str(where / "results"), kdeval_version="v1", cells=records)
    start = time.perf_counter()
    for n, (c, rec) in enumerate(zip(fakes, records)):
        record_done(idx, RUN, rec.id, where / "results", c.rows, summary=c.summary)
        if n % 2000 == 0:
            print(f"  {n}/{len(fakes)} cells stored ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    idx.set_run_state(RUN, RunState.DONE)
    idx.close()
    (where / "ready").write_text(str(len(fakes)))


COMMANDS = {
    "status RUN": ["status", RUN],
    "ls": ["ls"],
    "leaderboard": ["leaderboard"],
    "report": ["report", RUN],
    "export csv": ["export", RUN, "--format", "csv", "--out", "{out}/all.csv"],
}


# : runs a command and prints its peak RSS (KiB) last on stderr: a fresh parent per command, so the figure is
# its own
_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
         "sys.stdout.write(r.stdout)\n"
         "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)")


def timed(args: list[str], db: Path, timeout: float) -> tuple[float, float, int, int]:
    """(wall s, peak RSS MiB, exit code, stdout lines) of ``kdeval ARGS --db db`` in a fresh process."""
    start = time.perf_counter()
    try:
        command = [sys.executable, "-c", _PEAK, sys.executable, "-m", "kdeval.cli.app", *args,
                   "--db", str(db)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "COLUMNS": "120"})
        code, peak = (int(x) for x in out.stderr.split()[-2:])
        lines = len(out.stdout.splitlines())
    except subprocess.TimeoutExpired:
        code, peak, lines = -1, 0, 0
    return time.perf_counter() - start, peak / 1024, code, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--cells", type=int, default=20_000)
    ap.add_argument("--only", nargs="*", default=list(COMMANDS))
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if not (args.dir / "ready").exists():
        build(args.dir, args.cells)
    cells = int((args.dir / "ready").read_text())
    print(f"| command ({cells} cells) | wall s | peak RSS MiB | exit | stdout lines |\n|---|---|---|---|---|")
    for name in args.only:
        out = args.dir / "out"
        out.mkdir(exist_ok=True)
        for f in out.iterdir():
            f.unlink()
        cmd = [a.format(out=out) for a in COMMANDS[name]]
        wall, rss, code, lines = timed(cmd, args.dir / "index.sqlite", args.timeout)
        shown = " ".join(COMMANDS[name])
        print(f"| `kdeval {shown}` | {wall:.1f} | {rss:.0f} | {code} | {lines} |", flush=True)


if __name__ == "__main__":
    main()
