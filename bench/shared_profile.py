"""Where one shared group's time goes: ``evals.run.group_run.run_group`` over the leaderboard grid's cells (as
bench/shared_grid.py builds them), in this process, under cProfile; prints the seconds of the first sample's
alone-timed runs, of the shared samples (their prompt steps and their batched decoding) and the top functions.

    KDEVAL_DATA_DIR=../shared/data python bench/shared_profile.py --length 1024 --samples 2 --new 8
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import time

from shared_grid import THREADS, depths, grid, members


def needle_group(length: int, samples: int, new: int) -> tuple:
    """SmolLM2 (float32, ``THREADS`` threads), the needle task and its first ``samples`` prompts: a group's inputs."""
    import torch

    from kdeval.evals import get_task
    from kdeval.evals.task_run import runner
    from kdeval.zoo import load_model

    torch.set_num_threads(THREADS)
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    task = get_task("needle", lengths=[length], depths=depths(samples), max_new_tokens=new)
    return lm, task, runner.model_prompts(lm, task, limit=samples, max_new_tokens=new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    from kdeval.evals.task_run import group_run

    lm, task, prompts = needle_group(args.length, args.samples, args.new)
    cells = members(grid("leaderboard", args.length, args.samples, args.new, True))
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=1) for c in cells], prompts)
    profile.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(profile)
    seconds = {(file.rsplit("/", 1)[-1], name): cum for (file, _, name), (_, _, _, cum, _) in stats.stats.items()}
    seconds = {name: seconds.get((file, name), 0.0) for file, name in (
        ("group_run.py", "_run_alone"), ("group_decode.py", "drive"), ("group_decode.py", "_decode"),
        ("step.py", "replay_step"))}
    alone, shared = seconds.get("_run_alone", 0.0), seconds.get("drive", 0.0)
    print(f"{len(cells)} cells x {args.samples} samples of ~{args.length} tokens, {args.new} new tokens: {wall:.1f} s")
    print(f"  first sample of every cell, timed alone: {alone:.1f} s ({alone / len(cells):.2f} s a cell-sample)")
    later = len(cells) * (args.samples - 1)
    if later:
        print(f"  the other samples, shared: {shared:.1f} s ({shared / later:.2f} s a cell-sample), of which "
              f"batched decoding {seconds.get('_decode', 0.0):.1f} s, replayed steps {seconds.get('replay_step', 0.0):.1f} s")
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
