"""Where a chunked group's time goes: the paper-shaped grid (bench/shared_grid.py's ``paper``: full and six policies
at three budgets, one chunk size, ``compress: prompt``) through ``evals.group_run.run_group`` in this process, three
ways over the same samples, one after another:

- shared (members at batch 1, as ``kdeval submit`` runs a group), under cProfile: the first sample of every cell
  timed alone, the others shared; within those, the replayed steps and each cell's own steps after its fork;
- alone at batch 8 (what ``execution: {share: false}`` runs on a CPU);
- alone at batch 1 (the same work as the shared side without sharing: what batching alone is worth).

Budgets and chunk scale with ``--length`` so a cell forks at the chunk it forks at in the 2K grid (N = L/8, L/4,
L/2 and B = L/16: chunk 3, 5 and 9 of 16).

    KDEVAL_DATA_DIR=../shared/data python bench/chunked_profile.py --length 1024 --samples 4 --new 8
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from shared_grid import grid, members
from shared_profile import needle_group

#: (file, function) whose cumulative seconds the shared side reports
PARTS = {"first sample of every cell, timed alone": ("group_run.py", "_run_alone"),
         "later samples, shared (drive)": ("group_decode.py", "drive"),
         "  replayed steps": ("step.py", "replay_step"),
         "  every model forward of a step (both parts)": ("step.py", "forward"),
         "  batched decoding": ("group_decode.py", "_decode")}


def paper_cells(length: int, new: int, samples: int) -> list[dict]:
    spec = grid("paper", length, samples, new, True)
    spec.update(budgets=[length // 8, length // 4, length // 2], chunk_sizes=[length // 16])
    return members(spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()

    from kdeval.evals import group_run

    lm, task, prompts = needle_group(args.length, args.samples, args.new)
    cells = paper_cells(args.length, args.new, args.samples)
    n = len(cells) * args.samples

    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    group_run.run_group(lm, task, [{**c, "batch_size": 1} for c in cells], prompts)
    profile.disable()
    shared = time.perf_counter() - t0
    walls = {}
    for batch in (8, 1):
        t0 = time.perf_counter()
        group_run.run_group(lm, task, [{**c, "batch_size": batch} for c in cells], prompts, share=False)
        walls[batch] = time.perf_counter() - t0

    stats = pstats.Stats(profile)
    cum = {(file.rsplit("/", 1)[-1], name): c for (file, _, name), (_, _, _, c, _) in stats.stats.items()}
    print(f"{len(cells)} cells x {args.samples} samples of ~{args.length} tokens, N = {args.length // 8}/"
          f"{args.length // 4}/{args.length // 2}, B = {args.length // 16}, {args.new} new tokens ({n} cell-samples)")
    print("| side | seconds | per cell-sample |\n|---|---:|---:|")
    print(f"| shared (batch 1, cProfile on) | {shared:.1f} | {shared / n:.2f} |")
    for label, key in PARTS.items():
        print(f"| {label} | {cum.get(key, 0.0):.1f} | |")
    for batch, wall in walls.items():
        print(f"| alone, batch {batch} | {wall:.1f} | {wall / n:.2f} |")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
