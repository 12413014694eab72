"""Where the time of one chunk step goes: torch.profiler over a few steady-state chunk steps on the
Llama-3.2-3B shape, bf16, N = 8K, B = 128. The static-layout steps run eagerly ("static-eager"), so each
kernel is attributed. The graph replays ("graphs")
give the wall time per chunk.

    PYTHONPATH=. python bench/gpu_profile.py --out $OUT      # on the GPU machine
    PYTHONPATH=. python bench/gpu_profile.py --cpu           # tiny shapes, to test this script
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from engine_modes import build, engine_kwargs  # noqa: E402

from kdeval.baselines import get_policy  # noqa: E402
from kdeval.keydiff import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    device = "cpu" if args.cpu else "cuda"
    shape, budget, B = ("cpu-tiny", 256, 64) if args.cpu else ("llama-3.2-3b", 8192, 128)
    model = build(shape, device, torch.float32 if args.cpu else torch.bfloat16)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(100, model.config.vocab_size - 1, (1, budget + 10 * B), device=device)
    report = []
    for name, mode in (("keydiff", "graphs"),
                       ("h2o", "graphs"), ("sink", "static-eager"), ("keydiff", "static-eager"),
                       ("keydiff", "plain")):
        eng = Engine(model, get_policy(name), **engine_kwargs(name, budget, B, mode, device=device))
        state = eng.prefill(ids[:, : budget + 2 * B])  # steady state reached
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=acts) as prof:
            eng.prefill(ids[:, budget + 2 * B : budget + 6 * B], state=state)
            if device == "cuda":
                torch.cuda.synchronize()
        key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=60)
        # wall time of 4 steps without the profiler
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        eng.prefill(ids[:, budget + 6 * B : budget + 10 * B], state=state)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 4
        report.append(f"## {name} {mode}: {wall * 1e3:.1f} ms per chunk (wall, unprofiled)\n\n{table}\n")
        print(report[-1], flush=True)
    (out / "gpu_profile.md").write_text("\n".join(report))


if __name__ == "__main__":
    main()
