"""What a ``kdeval submit`` costs before any cell runs: two source trees timed against each other.

Two measurements per tree, each in a fresh interpreter with ``PYTHONPATH`` set to that tree, the trees
alternating round by round so load from other processes on the machine falls on both alike:

- *grid validation*: ``load_grid`` of ``examples/demo.yaml`` (models, policies, tasks and engine settings
  checked), and whether it imported transformers;
- *stub submit*: ``kdeval submit`` of a 5-cell grid of stub cells (``stub:0``: no model, no work) into a fresh
  index, until the run is done: start-up, validation, Ray, scheduling.

    git worktree add ../kdeval-before 0bb2f1f
    python bench/submit_startup.py --before ../kdeval-before --after . --rounds 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUB = """name: startup
models: ["stub:0"]
policies: [full, keydiff, keydiff-mean]
budgets: [64, 128]
chunk_sizes: [32]
tasks: [{name: needle, lengths: [256], samples: 3}]
resources: {workers: 1}
"""

VALIDATE = ("import sys, time\nt = time.perf_counter()\nfrom kdeval.jobs.grid.load import load_grid\n"
            "load_grid('examples/demo.yaml')\n"
            "print(time.perf_counter() - t, 'transformers' in sys.modules)")


def env_for(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "TRANSFORMERS_VERBOSITY": "error"}


def validate(tree: Path) -> tuple[float, float, bool]:
    """(wall s of the interpreter, s inside it for load_grid, transformers imported)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", VALIDATE], cwd=tree, env=env_for(tree), capture_output=True,
                         text=True, timeout=300, check=True)
    inner, loaded = out.stdout.split()
    return time.perf_counter() - t0, float(inner), loaded == "True"


def submit(tree: Path, work: Path) -> float:
    """Wall s of ``kdeval submit`` of the stub grid into a fresh index under ``work``."""
    work.mkdir(parents=True)
    (work / "grid.yaml").write_text(STUB)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kdeval.cli.app", "submit", "grid.yaml", "--db", "index.sqlite",
                    "--results-dir", "results"], cwd=work, env=env_for(tree), capture_output=True, text=True,
                   timeout=300, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, default=Path("."))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    got: dict[str, dict[str, list]] = {k: {"wall": [], "inner": [], "loaded": [], "submit": []} for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in (trees if r % 2 == 0 else reversed(list(trees))):
                wall, inner, loaded = validate(trees[name])
                got[name]["wall"].append(wall)
                got[name]["inner"].append(inner)
                got[name]["loaded"].append(loaded)
                got[name]["submit"].append(submit(trees[name], Path(tmp) / f"{name}-{r}"))
    med = {k: {m: statistics.median(v[m]) for m in ("wall", "inner", "submit")} for k, v in got.items()}
    print(f"{args.rounds} rounds, medians; trees alternate round by round\n")
    print("| measurement | before s | after s | after / before |")
    print("|---|---:|---:|---:|")
    for m, label in (("inner", "grid validation (load_grid, in-process)"),
                     ("wall", "grid validation, interpreter start to exit"),
                     ("submit", "kdeval submit of 5 stub cells, to done")):
        b, a = med["before"][m], med["after"][m]
        print(f"| {label} | {b:.2f} | {a:.2f} | {a / b:.2f}x |")
    for k in trees:
        print(f"\n{k}: validation imported transformers in {sum(got[k]['loaded'])}/{args.rounds} rounds")


if __name__ == "__main__":
    main()
