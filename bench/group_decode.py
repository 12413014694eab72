"""Cells decoded together (kdeval/evals/task_run/group_decode.py) vs each cell decoding alone, side by side in one run.

One needle prompt of about ``--length`` tokens on SmolLM2-135M (offline), float32, CPU; ``--cells`` cells that
keep while decoding (``decode: keep``): KeyDiff at budgets spread from 25% to 75% of the prompt, one-shot.
Each cell's prompt runs alone up to its first token (``Engine.generate(prompt_only=True)``, the states
forked from one computed once, so that only decoding is timed); then its ``--new`` - 1 later tokens are decoded

- ``alone``: each cell on its own engine at batch 1, as a cell alone decodes (``Engine.generate`` from the
  prompt's state, fed the first token unevicted);
- ``R rows``: ``GroupDecoder``'s batches of ``R`` rows (``rows_per_batch``) on its one engine without eviction.

Figures: decode seconds over all cells (the median of ``--rounds`` rounds, the sides interleaved), cell-tokens
per second, and the ratio to alone. The tokens of every side are checked equal to alone's.

    python bench/group_decode.py --cells 32 --rows 4 8 16 32
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from kdeval.baselines import get_policy
from kdeval.evals import get_task
from kdeval.evals.task_run.generation_jobs import GenerateJob
from kdeval.evals.task_run.group_decode import Driven, GroupDecoder
from kdeval.evals.task_run.runner import model_prompts
from kdeval.keydiff import Engine, EngineConfig
from kdeval.zoo import load_model


def one_request(job):
    return (yield job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--cells", type=int, default=32)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("smollm2-135m", dtype="float32")
    task = get_task("needle", lengths=[args.length], depths=[50])
    _, built = model_prompts(lm, task, max_new_tokens=args.new)
    ids = torch.tensor([built[0].ids])
    n = ids.shape[1]
    budgets = [round(n * (0.25 + 0.5 * i / max(args.cells - 1, 1))) for i in range(args.cells)]
    engines = [Engine(lm.model, get_policy("keydiff"), EngineConfig(budget=b, chunk_size=n)) for b in budgets]
    firsts = []
    for eng in engines:  # each cell's prompt once; every round decodes from forks of these states
        job = GenerateJob(eng, ids, args.new, [], None, 0, False, "s")
        firsts.append(job.run(prompt_only=True))

    def alone() -> tuple[float, list]:
        tokens, t0 = [], time.perf_counter()
        for eng, first in zip(engines, firsts):
            res = eng.generate(torch.tensor([first.tokens[0]]), max_new_tokens=args.new - 1, state=first.state.fork(),
                               protect_last=1, decode_evict=False)
            tokens.append([first.tokens[0] + res.tokens[0]])
        return time.perf_counter() - t0, tokens

    def batched(rows: int) -> tuple[float, list]:
        decoder = GroupDecoder(lm.model, rows_per_batch=rows)
        waiting = [(k, GenerateJob(eng, ids, args.new, [], None, 0, False, "s"),
                    dataclasses.replace(first, state=first.state.fork()))
                   for k, (eng, first) in enumerate(zip(engines, firsts))]
        answer, out = {}, {k: Driven() for k in range(len(waiting))}
        t0 = time.perf_counter()
        for s in range(0, len(waiting), rows):
            decoder._decode(waiting[s : s + rows], answer, out)
        return time.perf_counter() - t0, [answer[k].tokens for k in range(len(waiting))]

    sides = {"alone": alone, **{f"{r} rows": (lambda r=r: batched(r)) for r in args.rows}}
    times: dict[str, list[float]] = {name: [] for name in sides}
    ref = None
    for _ in range(args.rounds):
        for name, side in sides.items():
            seconds, tokens = side()
            ref = ref or tokens
            assert tokens == ref, f"{name}: tokens differ from alone's"
            times[name].append(seconds)
    cell_tokens = args.cells * (args.new - 1)
    base = statistics.median(times["alone"])
    print(f"SmolLM2-135M float32 CPU, {args.threads} threads; {args.cells} keydiff cells, prompt {n} tokens, budgets "
          f"{budgets[0]}..{budgets[-1]}, {args.new - 1} tokens decoded per cell, median of {args.rounds} rounds")
    print("| decoding | decode s (all cells) | cell-tokens/s | vs alone |")
    print("|---|---:|---:|---:|")
    for name in sides:
        m = statistics.median(times[name])
        print(f"| {name} | {m:.2f} | {cell_tokens / m:.1f} | {base / m:.2f}x |")


if __name__ == "__main__":
    main()
