"""Throughput of batched samples: samples/s and decode tokens/s at several batch sizes, two workloads.

- ``decode``: needle-in-a-haystack at ~512 tokens, 64 new tokens, eos ignored (every sample decodes 64).
- ``prefill``: RULER niah_single_1 at 2K tokens, 8 new tokens (eos stops it, as in a grid).

Each batch size runs ``max(batch, --min-samples)`` samples (whole batches: one batch from batch 4 on) after a
warm-up, through ``Engine.generate`` at batch 1 and ``Engine.generate_batch`` above it: the paths
``RunSettings(batch_size=...)`` takes. Figures:

- samples/s: samples over the wall time of all of them (end to end; on a shared machine one stall of
  another process's making shows here);
- decode tok/s: the median over pure decode steps (every row feeds one token) of rows / step time;
- prefill tok/s: the median over full prefill steps (every row feeds a whole chunk) of tokens / step time.

The medians are per-step rates, robust to the occasional stall; samples/s is what a cell sees. On a CPU
shared with other busy processes, ``--threads 1`` avoids torch's OpenMP threads waiting on one another
(measured here: 3-10x slower steps with 2 threads than with 1 while others ran).

On CUDA, batch 1 runs the engine's default CUDA graphs and batches run eagerly; ``--eager`` turns the graphs
off at batch 1 too. ``--smollm2-shape`` loads a random-weight model of SmolLM2-135M's shape (byte-level
tokenizer; it never says eos) where the offline SmolLM2 package is not installed.

    python bench/throughput.py                       # SmolLM2 on the CPU, batch 1/4/8/16, prints a table
    python bench/throughput.py --device cuda --dtype bfloat16 --batches 1 4 8 16 32 64 --out results.md
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch

from kdeval.baselines import get_policy
from kdeval.evals import get_task
from kdeval.evals.task_run.runner import model_prompts
from kdeval.keydiff import Engine, EngineConfig

#: SmolLM2-135M's dimensions, for ``--smollm2-shape`` (random weights; the byte-level vocabulary stays, so
from kdeval.zoo import load_model
#: its output layer is far smaller than SmolLM2's 49152-way one)
SMOLLM2_SHAPE = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, head_dim=64, max_position_embeddings=8192)

WORKLOADS = {
    "decode": dict(task="needle", length=512, new=64, eos=False),
    "prefill": dict(task="ruler.niah_single_1", length=2048, new=8, eos=True),
}


def prompts_for(lm, name: str, n: int) -> list[list[int]]:
    w = WORKLOADS[name]
    if w["task"] == "needle":
        depths = [round(100 * i / max(n - 1, 1)) for i in range(n)]
        task = get_task("needle", lengths=[w["length"]], depths=depths)
    else:
        task = get_task(w["task"], lengths=[w["length"]], num_samples=n)
    _, built = model_prompts(lm, task, max_new_tokens=w["new"])
    return [list(p.ids) for p in built[:n]]


class StepClock:
    """Times the engine's steps (``on_step`` at batch 1, ``on_batch_step`` above): the rate of every pure decode
    step and of every full prefill step."""

    def __init__(self, chunk: int):
        self.chunk, self.decode, self.prefill = chunk, [], []
        self.start()

    def start(self) -> None:
        self.last, self.seen = time.perf_counter(), {}

    def _add(self, fed: list[int]) -> None:
        now = time.perf_counter()
        dt, self.last = now - self.last, now
        if all(t == 1 for t in fed):
            self.decode.append(len(fed) / dt)
        elif all(t == self.chunk for t in fed):
            self.prefill.append(sum(fed) / dt)

    def single(self, state) -> None:
        fed, self.seen[0] = state.seen - self.seen.get(0, 0), state.seen
        self._add([fed])

    def batch(self, view) -> None:
        fed = [s - self.seen.get(i, 0) for i, s in zip(view.requests, view.seen)]
        self.seen.update(zip(view.requests, view.seen))
        self._add(fed)


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def run(eng: Engine, prompts: list[list[int]], batch: int, new: int, eos) -> dict:
    """All ``prompts``, ``batch`` at a time: wall seconds and the median step rates."""
    clock = StepClock(eng.config.chunk_size)
    eng.on_step, eng.on_batch_step = clock.single, clock.batch
    wall0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        clock.start()
        if batch == 1:
            eng.release(eng.generate(torch.tensor(group), max_new_tokens=new, eos_token_id=eos).state)
        else:
            eng.generate_batch(group, max_new_tokens=new, eos_token_id=eos)
    return dict(samples=len(prompts), wall=time.perf_counter() - wall0, decode=median(clock.decode),
                prefill=median(clock.prefill))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--policy", default="keydiff")
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--min-samples", type=int, default=4, help="samples at batch sizes below this")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's own)")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs at batch 1 either")
    ap.add_argument("--smollm2-shape", action="store_true", help="random:llama-tiny with SmolLM2-135M's shape")
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smollm2_shape:
        args.model = "random:llama-tiny"
    lm = load_model(args.model, device=args.device, dtype=args.dtype,
                    overrides=SMOLLM2_SHAPE if args.smollm2_shape else None)
    config = EngineConfig(budget=args.budget, chunk_size=args.chunk, cuda_graphs=False if args.eager else None)
    eng = Engine(lm.model, get_policy(args.policy), config)
    most = max(max(b, args.min_samples) for b in args.batches)
    header = (f"`python bench/throughput.py {' '.join(sys.argv[1:])}`".replace(" `", "`") +
              f": {args.model} {args.dtype} on {args.device} ({platform.machine()}, {os.cpu_count()} cores, "
              f"torch {torch.__version__}), {args.policy} N={args.budget} B={args.chunk}"
              f"{', graphs off' if args.eager else ''}, {torch.get_num_threads()} CPU threads, "
              f"{time.strftime('%Y-%m-%d')}.")
    lines = ["| workload | batch | samples | samples/s | x batch 1 | decode tok/s | x batch 1 | prefill tok/s | "
             "x batch 1 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in args.workloads:
        w = WORKLOADS[name]
        eos = lm.eos_token_ids if w["eos"] else None
        prompts = prompts_for(lm, name, most)
        run(eng, prompts[:2], 2, 4, eos)  # warm-up: both paths' first calls
        run(eng, prompts[:1], 1, 4, eos)
        base = None
        for b in args.batches:
            r = run(eng, prompts[: max(b, args.min_samples)], b, w["new"], eos)
            figures = (r["samples"] / r["wall"], r["decode"], r["prefill"])
            base = base or figures
            ratio = [f"{f / b0:.2f}x" if b0 else "-" for f, b0 in zip(figures, base)]
            label = f"{name}: {w['task']} {w['length']}, {w['new']} new{'' if w['eos'] else ' (no eos)'}"
            lines.append(f"| {label} | {b} | {r['samples']} | {figures[0]:.3f} | {ratio[0]} | {figures[1]:.1f} | "
                         f"{ratio[1]} | {figures[2]:.0f} | {ratio[2]} |")
            print(lines[-1], flush=True)
    table = "\n".join([header, "", *lines])
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
