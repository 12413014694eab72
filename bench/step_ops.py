"""Operators per chunk step of the graph path, counted on the CPU: a proxy for the kernels a captured step
launches on a GPU (each ATen operator is one kernel or more, each kernel inductor generates is one), split
into the model's forward and the eviction (observation, scoring, selection, compaction). Llama-3.2-3B's layer
count and head layout, tiny widths.

    PYTHONPATH=. python bench/step_ops.py            # table on stdout
    PYTHONPATH=. python bench/step_ops.py --time     # also the wall time of a steady chunk step, side by side

With tiny widths every operator is a few microseconds of host work, so the step times are a launch-bound
regime like a GPU's at small chunks: they show what fusing the layers' eviction saves per operator.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).parent))
from engine_modes import build, engine_kwargs  # noqa: E402

from kdeval.baselines import get_policy  # noqa: E402
from kdeval.keydiff import Engine  # noqa: E402

torch._inductor.config.cpp.enable_kernel_profile = True  # compiled kernels appear in the profile, to be counted

EVICT = "kdeval::evict"
#: conversions that are free when nothing changes (then they call no other operator)
MAYBE_NOOP = {"to", "contiguous", "type_as"}
POLICIES = ["keydiff", "sink", "tova", "snapkv", "h2o"]
#: views and metadata: no kernel on a GPU
FREE = {"view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "transpose", "t", "permute",
        "as_strided", "alias", "detach", "_reshape_alias", "reshape", "split", "unbind", "lift_fresh", "empty",
        "empty_like", "empty_strided", "new_empty", "sym_size", "sym_stride", "is_same_size",
        "promote_types", "result_type", "can_cast"}  # the last three: dtype arithmetic on the host


def _step_ops(prof) -> dict[str, collections.Counter]:
    """The ATen operators called from Python (not those an operator calls inside), less views and no-op
    conversions, by part of the step: about one GPU kernel each (a few, for composite ones)."""
    out = {"model": collections.Counter(), "evict": collections.Counter()}
    for ev in prof.events():
        if "cpp_fused" in ev.name:  # a kernel inductor generated (compiled scoring or blocks)
            op = "compiled kernel"
        elif ev.name.startswith("aten::"):
            op = ev.name.removeprefix("aten::")
        else:
            continue
        part, parent, nested = "model", ev.cpu_parent, False
        while parent is not None:
            nested |= parent.name.startswith("aten::")
            if parent.name == EVICT:
                part = "evict"
            parent = parent.cpu_parent
        does_work = op not in MAYBE_NOOP or any(c.name.startswith("aten::") for c in ev.cpu_children)
        if not nested and op not in FREE and does_work:
            out[part][op] += 1
    return out


#: the modes of this table, as engine_modes names them (the graph path, emulated on the CPU)
MODES = {"per layer": "static-eager", "fused": "static-eager-fused", "fused+compiled": "static-eager-fused-compiled",
         "fused+blocks": "static-eager-fused-blocks"}


def model(layers: int):
    return build("3b-layout-tiny", "cpu", torch.float32, layers)


def _engine(m, policy: str, mode: str, budget: int, B: int) -> Engine:
    return Engine(m, get_policy(policy), **engine_kwargs(policy, budget, B, MODES[mode], device="cpu"))


def count(m, policy: str, mode: str, budget: int, B: int, room: bool = False) -> dict[str, collections.Counter]:
    """Operators of one steady chunk step (the head full), or with ``room`` of the first chunk (the empty head
    slots take it whole: nothing is scored)."""
    eng = _engine(m, policy, mode, budget, B)
    ids = torch.randint(0, 512, (1, budget + 3 * B))
    state = eng.prefill(ids[:, : B if room else budget + 2 * B])
    evict = eng._evict

    def tagged(*a, **k):
        with record_function(EVICT):
            return evict(*a, **k)

    eng._evict = tagged
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.prefill(ids[:, B : 2 * B] if room else ids[:, budget + 2 * B : budget + 3 * B], state=state)
    return _step_ops(prof)


def step_ms(m, policy: str, mode: str, budget: int, B: int, steps: int = 8, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean wall time of ``steps`` chunk steps after the head is full."""
    eng = _engine(m, policy, mode, budget, B)
    ids = torch.randint(0, 512, (1, budget + (steps + 1) * B))
    times = []
    for _ in range(repeats):
        state = eng.prefill(ids[:, : budget + B])
        t = time.perf_counter()
        eng.prefill(ids[:, budget + B :], state=state)
        times.append((time.perf_counter() - t) / steps * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--top", type=int, default=0, help="also list the N most frequent eviction operators")
    ap.add_argument("--time", action="store_true", help="also time a steady chunk step per mode")
    args = ap.parse_args()
    m = model(args.layers)
    torch.set_num_threads(1)
    print(f"{args.layers} layers, N={args.budget}, B={args.chunk}: ATen operators in one steady chunk step"
          + (" and its wall time (CPU, one thread)" if args.time else "") + "\n")
    head = "| policy | eviction | model forward ops | eviction ops | eviction ops per layer | room step eviction ops |"
    print(head + (" step ms | vs per layer |" if args.time else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if args.time else ""))
    for policy in POLICIES:
        per_layer_ms = None
        for mode in MODES:
            if mode != "per layer" and get_policy(policy).needs().reads_layer:
                continue
            if mode == "fused+blocks" and policy not in ("keydiff", "h2o"):
                continue  # the model's forward does not depend on the policy beyond its attention capture
            ops = count(m, policy, mode, args.budget, args.chunk)
            n_model, n_evict = sum(ops["model"].values()), sum(ops["evict"].values())
            n_room = sum(count(m, policy, mode, args.budget, args.chunk, room=True)["evict"].values())
            row = f"| {policy} | {mode} | {n_model} | {n_evict} | {n_evict / args.layers:.1f} | {n_room} |"
            if args.time:
                ms = step_ms(m, policy, mode, args.budget, args.chunk)
                per_layer_ms = per_layer_ms or ms
                row += f" {ms:.2f} | {ms / per_layer_ms:.2f}x |"
            print(row, flush=True)
            if args.top:
                print("|  |  | " + ", ".join(f"{k} {v}" for k, v in ops["evict"].most_common(args.top)) + " | | | |")


if __name__ == "__main__":
    main()
