"""Where a chunked group's time goes: the paper-shaped grid (bench/shared_grid.py's ``paper``: full and six policies
at three budgets, one chunk size, ``compress: prompt``), or with ``--grid mixed`` the mixed one (one-shot and chunked
cells at the leaderboard's three shares, ``compress: context``), through ``evals.task_run.group_run.run_group`` in this
process, as a CPU worker runs it (batch size unset: a chunked member forks, then batches at 8; a one-shot member
shares whole steps at batch 1), then every cell alone at batch 8 (what ``execution: {share: false}`` runs on a CPU)
over the same samples, one after the other.

The shared side is timed by wrappers around a few calls (no cProfile: its per-call cost would weigh on the
engine's many small calls): the first sample of every cell run alone (the timed samples), each sample's steps up to
its fork (``Engine.prefill_shared``, batch 1: recorded or replayed), the trunks recorded in one batch before them
(``Engine.record_shared``), the batched rest (``Engine.generate_batch``),
the decoding of cells together (``GroupDecoder._decode``), and every model forward by kind (prompt step or decode
step, batch 1 or more, recording or not) with its count.

Budgets and chunk scale with ``--length`` so a cell forks at the chunk it forks at in the 2K grid (paper: N = L/8,
L/4, L/2 and B = L/16, chunk 3, 5 and 9 of 16; mixed: shares of the prompt and B = L/16).

    KDEVAL_DATA_DIR=../shared/data python bench/chunked_profile.py --length 1024 --samples 8 --new 16
    KDEVAL_DATA_DIR=../shared/data python bench/chunked_profile.py --grid mixed --length 1024 --samples 8 --new 16
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import time

from shared_grid import grid, members
from shared_profile import needle_group


class Timers:
    """Seconds and calls per label; ``phase`` names the part of the run a forward belongs to (its label's prefix)."""

    def __init__(self):
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.phase = "shared"
        self.originals: dict[tuple[object, str], object] = {}

    def wrap(self, owner, name: str, label, phase: str | None = None) -> None:
        """Replace ``owner.name`` by a timed call: ``label`` names it (a string, or a callable of the call's
        arguments); ``phase``, when given, is :attr:`phase` while the call runs."""
        original = self.originals.setdefault((owner, name), getattr(owner, name))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            key = label(*args, **kwargs) if callable(label) else label
            before, self.phase = self.phase, phase or self.phase
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1
                self.phase = before

        setattr(owner, name, timed)

    def unwrap(self, owner, name: str) -> None:
        setattr(owner, name, self.originals.pop((owner, name)))

    def take(self) -> list[tuple[str, float, int]]:
        """(label, seconds, calls) of everything timed so far, sorted by label; the counters start again."""
        out = [(k, self.seconds[k], self.calls[k]) for k in sorted(self.seconds)]
        self.seconds.clear()
        self.calls.clear()
        return out


def install(timers: Timers) -> None:
    """Time the timed-alone samples (a group's ``_run_alone``), the steps up to each fork, the batched rest, and
    every forward by kind."""
    from kdeval.evals.task_run import group_run
    from kdeval.evals.task_run.group_decode import GroupDecoder
    from kdeval.keydiff.engine import Engine
    from kdeval.keydiff.step.step import Step

    def forward_kind(step, layout, ids, recording=None, repeat=None):
        kind = "prompt" if ids.shape[1] > 1 else "decode"
        rec = ", recording" if recording is not None else ""
        return f"{timers.phase}: {kind} forward, batch {'1' if ids.shape[0] == 1 else '>1'}{rec}"

    timers.wrap(group_run, "_run_alone", "first sample of every cell, timed alone", phase="timed alone")
    timers.wrap(Step, "forward", forward_kind)
    timers.wrap(Step, "replay_step", "shared: replayed steps")
    timers.wrap(Engine, "record_shared", lambda *a, **k: f"{timers.phase}: trunks recorded in one batch")
    timers.wrap(Engine, "prefill_shared", lambda *a, **k: f"{timers.phase}: steps up to the fork, batch 1")
    timers.wrap(Engine, "generate_batch", lambda *a, **k: f"{timers.phase}: Engine.generate_batch")
    timers.wrap(GroupDecoder, "_decode", lambda *a, **k: f"{timers.phase}: cells decoded together")


def paper_cells(length: int, new: int, samples: int) -> list[dict]:
    """The paper grid's members with budgets and chunk scaled to ``length`` (the 2K grid's fork points)."""
    spec = grid("paper", length, samples, new, True)
    spec.update(budgets=[length // 8, length // 4, length // 2], chunk_sizes=[length // 16])
    return members(spec)


def mixed_cells(length: int, new: int, samples: int) -> list[dict]:
    """The mixed grid's members (one-shot and chunked at the leaderboard's shares, query-agnostic) with the chunk
    scaled to ``length`` (the 2K grid's fork points)."""
    spec = grid("mixed", length, samples, new, True)
    spec.update(chunk_sizes=["whole", length // 16])
    return members(spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--grid", choices=["paper", "mixed"], default="paper")
    args = ap.parse_args()

    from kdeval.evals.task_run import group_run

    lm, task, prompts = needle_group(args.length, args.samples, args.new)
    cells = (paper_cells if args.grid == "paper" else mixed_cells)(args.length, args.new, args.samples)
    n = len(cells) * args.samples

    timers = Timers()
    install(timers)
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=None) for c in cells], prompts, batch_size=8)
    shared = time.perf_counter() - t0, timers.take()
    timers.unwrap(group_run, "_run_alone")  # alone, every sample runs through it: not the timed samples
    timers.phase = "alone"
    t0 = time.perf_counter()
    group_run.run_group(lm, task, [dataclasses.replace(c, batch_size=8) for c in cells], prompts, share=False)
    alone = time.perf_counter() - t0, timers.take()

    budgets = "/".join(str(b) for b in dict.fromkeys(c.budget for c in cells if c.budget is not None))
    chunks = "/".join(str(b) for b in dict.fromkeys(c.chunk_size for c in cells))
    print(f"{args.grid} grid: {len(cells)} cells x {args.samples} samples of ~{args.length} tokens, N = {budgets}, "
          f"B = {chunks}, {args.new} new tokens ({n} cell-samples)")
    print("| part | seconds | calls |\n|---|---:|---:|")
    for side, how, (wall, parts) in (("shared", "fork, then batch 8", shared), ("alone", "batch 8", alone)):
        print(f"| **{side}** ({how}) | {wall:.1f} | |")
        for label, seconds, calls in parts:
            print(f"| {label} | {seconds:.1f} | {calls} |")
    print(f"alone / shared: {alone[0] / shared[0]:.2f}x")


if __name__ == "__main__":
    main()
