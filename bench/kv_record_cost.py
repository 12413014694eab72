"""What the quantized store's record (kdeval/keydiff/quant/packed.py) costs: the engine with the store as it is, side by
side in one process with the in-place-only store that came before it (quantized tokens written back into the
working buffers, bytes from a formula, no record), loaded from that version's ``kvstore.py``.

Every repeat runs each (store, scheme) once, in turn: KeyDiff on SmolLM2-135M, a chunked prompt then greedy
decoding, 4-bit, groups of 32, a 32-token window. Reported: the run's seconds, the seconds spent inside the
store's calls (``before_commit``, ``settle``, ``requantize_values``: their share per chunk and per decoded
token), and whether the tokens and ``peak_kv_bytes`` are the same under both stores.

    git show <commit before the record>:kdeval/keydiff/quant/store.py > kvstore_before.py
    python bench/kv_record_cost.py --before kvstore_before.py [--tokens 1024] [--budget 256] [--chunk 128]
        [--new 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import torch

from kdeval.keydiff.step import eviction


def load_before(path: str):
    spec = importlib.util.spec_from_file_location("kvstore_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.QuantizedStore


def timed(cls):
    """``cls`` with its calls' seconds summed in ``cls.seconds``."""

    class Timed(cls):
        seconds = 0.0

    for name in ("before_commit", "settle", "requantize_values"):
        def wrap(self, *args, _f=getattr(cls, name), **kwargs):
            start = time.perf_counter()
            try:
                return _f(self, *args, **kwargs)
            finally:
                Timed.seconds += time.perf_counter() - start
        setattr(Timed, name, wrap)
    return Timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the in-place-only store's kvstore.py")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.zoo import load_model

    current = eviction.QuantizedStore
    stores = {"record": timed(current), "in place only": timed(load_before(a.before))}
    lm = load_model("smollm2-135m", device="cpu")
    ids = torch.tensor([lm.tokenizer("The city was founded on the river bank. " * (a.tokens // 8)).input_ids[: a.tokens]])
    runs = {(s, q): [] for s in stores for q in ("kivi", "per_token")}
    inside = {k: [] for k in runs}
    out = {}
    for _ in range(a.repeats):
        for (store, scheme) in runs:
            cls = stores[store]
            eviction.QuantizedStore = cls
            try:
                eng = Engine(lm.model, get_policy("keydiff"), EngineConfig(
                    budget=a.budget, chunk_size=a.chunk,
                    kv_quant={"bits": 4, "group_size": 32, "window": 32, "scheme": scheme}))
            finally:
                eviction.QuantizedStore = current
            cls.seconds = 0.0
            start = time.perf_counter()
            res = eng.generate(ids, max_new_tokens=a.new)
            runs[store, scheme].append(time.perf_counter() - start)
            inside[store, scheme].append(cls.seconds)
            out[store, scheme] = (res.tokens[0], res.stats.peak_kv_bytes)
    chunks = -(-a.tokens // a.chunk)
    steps = chunks + a.new - 1
    print(f"SmolLM2-135M, float32, 1 thread, KeyDiff N={a.budget}, B={a.chunk}, {a.tokens}-token prompt, {a.new} "
          f"new tokens ({chunks} chunks + {a.new - 1} decode steps), 4-bit g32 w32; medians of {a.repeats}")
    print("| scheme | store | run s | ratio | store calls s | store ms per step | peak KV bytes | same tokens and bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for scheme in ("kivi", "per_token"):
        base = statistics.median(runs["in place only", scheme])
        for store in stores:
            run, calls = statistics.median(runs[store, scheme]), statistics.median(inside[store, scheme])
            same = out[store, scheme] == out["in place only", scheme]
            print(f"| {scheme} | {store} | {run:.2f} | {run / base:.2f}x | {calls:.3f} | {calls / steps * 1e3:.2f} | "
                  f"{out[store, scheme][1]} | {same} |")


if __name__ == "__main__":
    main()
