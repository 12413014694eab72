"""Where a chunked group's time goes: the paper-shaped grid (bench/shared_grid.py's ``paper``: full and six policies
at three budgets, one chunk size, ``compress: prompt``) through ``evals.group_run.run_group`` in this process, as a
CPU worker runs it (batch size unset: a chunked member forks, then batches at 8), then every cell alone at batch 8
(what ``execution: {share: false}`` runs on a CPU) over the same samples, one after the other.

The shared side is timed by wrappers around a few calls (no cProfile: its per-call cost would weigh on the
engine's many small calls): the first sample of every cell run alone (the timed samples), each sample's steps up to
its fork (``Engine.prefill_shared``, batch 1: recorded or replayed), the batched rest (``Engine.generate_batch``),
and every model forward by kind (prompt step or decode step, batch 1 or more, recording or not) with its count.

Budgets and chunk scale with ``--length`` so a cell forks at the chunk it forks at in the 2K grid (N = L/8, L/4,
L/2 and B = L/16: chunk 3, 5 and 9 of 16).

    KDEVAL_DATA_DIR=../shared/data python bench/chunked_profile.py --length 2048 --samples 8 --new 16
"""
from __future__ import annotations

import argparse
import collections
import functools
import time

from shared_grid import grid, members
from shared_profile import needle_group


class Timers:
    """Seconds and calls per label; ``phase`` prefixes the forward labels (timed alone, shared, or alone)."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        self.phase = "shared"

    def wrap(self, owner, name: str, label):
        """Replace ``owner.name`` by a timed call; ``label(*args)`` names the call (a string, or a callable)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            key = label(*args, **kwargs) if callable(label) else label
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1

        setattr(owner, name, timed)
        return original


def install(timers: Timers):
    """Put the wrappers in place; returns what puts ``group_run._run_alone`` back."""
    from kdeval.evals import group_run
    from kdeval.keydiff.engine import Engine
    from kdeval.keydiff.step import Step

    run_alone = group_run._run_alone

    def alone(*args, **kwargs):
        timers.phase = "timed alone"
        t0 = time.perf_counter()
        try:
            return run_alone(*args, **kwargs)
        finally:
            timers.seconds["first sample of every cell, timed alone"] += time.perf_counter() - t0
            timers.calls["first sample of every cell, timed alone"] += 1
            timers.phase = "shared"

    group_run._run_alone = alone
    def forward_kind(step, layout, ids, recording=None, repeat=None):
        kind = "prompt" if ids.shape[1] > 1 else "decode"
        rec = ", recording" if recording is not None else ""
        return f"{timers.phase}: {kind} forward, batch {'1' if ids.shape[0] == 1 else '>1'}{rec}"

    timers.wrap(Step, "forward", forward_kind)
    timers.wrap(Step, "replay_step", "shared: replayed steps")
    timers.wrap(Engine, "prefill_shared", lambda *a, **k: f"{timers.phase}: steps up to the fork, batch 1")
    timers.wrap(Engine, "generate_batch", lambda *a, **k: f"{timers.phase}: Engine.generate_batch")
    return lambda: setattr(group_run, "_run_alone", run_alone)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=16)
    args = ap.parse_args()

    from kdeval.evals import group_run

    lm, task, prompts = needle_group(args.length, args.samples, args.new)
    spec = grid("paper", args.length, args.samples, args.new, True)
    spec.update(budgets=[args.length // 8, args.length // 4, args.length // 2], chunk_sizes=[args.length // 16])
    cells = members(spec)
    n = len(cells) * args.samples

    timers = Timers()
    restore = install(timers)
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [{**c, "batch_size": None} for c in cells], prompts, batch_size=8)
    shared = time.perf_counter() - t0
    shared_parts = dict(timers.seconds), dict(timers.calls)
    timers.seconds.clear()
    timers.calls.clear()
    restore()
    timers.phase = "alone"
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [{**c, "batch_size": 8} for c in cells], prompts, share=False)
    alone = time.perf_counter() - t0

    print(f"{len(cells)} cells x {args.samples} samples of ~{args.length} tokens, N = {args.length // 8}/"
          f"{args.length // 4}/{args.length // 2}, B = {args.length // 16}, {args.new} new tokens ({n} cell-samples)")
    print("| part | seconds | calls |\n|---|---:|---:|")
    print(f"| **shared** (fork, then batch 8) | {shared:.1f} | |")
    for parts in (shared_parts, (dict(timers.seconds), dict(timers.calls))):
        for label in sorted(parts[0]):
            print(f"| {label} | {parts[0][label]:.1f} | {parts[1][label]} |")
        if parts is shared_parts:
            print(f"| **alone** (batch 8) | {alone:.1f} | |")
    print(f"alone / shared: {alone / shared:.2f}x")


if __name__ == "__main__":
    main()
