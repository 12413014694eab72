"""Would a chunked group gain from batching its cells' own chunk steps across samples, after their forks?

The paper grid's shape (the six policies at three budgets, one chunk size, ``compress: prompt``) on SmolLM2's
needle prompts, each cell three ways, side by side in one process (no Ray):

- alone: the cell's samples in one batch (``Engine.generate_batch``), as a CPU worker runs a cell alone;
- shared (today): one sample at a time, the prompt steps replayed from a store that ``full`` recorded for that
  sample (``Engine.sharing``), the cell's own steps at batch 1 after its fork;
- fork, then batch: each sample's steps up to the cell's first eviction replayed from its store
  (``Engine.prefill``), then every sample's rest of the prompt and its decoding in one batch from those states
  (``Engine.generate_batch(states=...)``).

``full``'s recording runs (one per sample) are counted once, in both shared columns. Prints seconds per
cell-sample and whether each way gives the alone tokens.

    KDEVAL_DATA_DIR=../shared/data python bench/fork_batch.py --length 1024 --samples 4 --new 8
"""
from __future__ import annotations

import argparse
import time

from shared_profile import needle_group

POLICIES = ("keydiff", "snapkv", "tova", "knorm", "sink", "expected-attention")


def fork_tokens(budget: int, chunk: int, length: int) -> int:
    """The prompt tokens up to and with the first chunk that leaves more than ``budget`` tokens (where a cell
    forks from the full cache), whole chunks, at most the prompt less one chunk."""
    first = (budget // chunk + 1) * chunk
    return min(first, (length - 1) // chunk * chunk)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--budgets", default="128,256,512")
    args = ap.parse_args()

    import torch

    from kdeval.baselines import get_policy
    from kdeval.keydiff import Engine, EngineConfig
    from kdeval.keydiff.step.shared import SharedSteps

    lm, _, (_, built) = needle_group(args.length, args.samples, args.new)
    eos = lm.eos_token_ids
    ids = [torch.tensor([p.ids]) for p in built]
    budgets = [int(b) for b in args.budgets.split(",")]
    cells = [(p, n) for p in POLICIES for n in budgets]
    B = args.chunk

    def engine(policy: str, budget: int | None) -> Engine:
        return Engine(lm.model, get_policy(policy), EngineConfig(budget=budget, chunk_size=B))

    t0 = time.perf_counter()
    stores = []
    for x in ids:  # full records every sample's trunk, as the group's `full` cell does
        store = SharedSteps([get_policy(p) for p in POLICIES], max_tokens=max(budgets) + B)
        rec = engine("full", None)
        with rec.sharing(store):
            rec.generate(x, max_new_tokens=args.new, eos_token_id=eos)
        stores.append(store)
    record_s = time.perf_counter() - t0

    seconds = {"alone": 0.0, "shared": record_s, "fork+batch": record_s}
    same = {"shared": 0, "fork+batch": 0}
    for policy, budget in cells:
        eng = engine(policy, budget)
        t0 = time.perf_counter()
        alone = [r.tokens[0] for r in eng.generate_batch([p.ids for p in built], max_new_tokens=args.new,
                                                         eos_token_id=eos)]
        seconds["alone"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        shared = []
        for x, store in zip(ids, stores):
            with eng.sharing(store):
                shared.append(eng.generate(x, max_new_tokens=args.new, eos_token_id=eos).tokens[0])
        seconds["shared"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        states, rests = [], []
        for x, store in zip(ids, stores):
            k = fork_tokens(budget, B, x.shape[1])
            with eng.sharing(store):
                states.append(eng.prefill(x[:, :k]))
            rests.append(x[0, k:].tolist())
        forked = [r.tokens[0] for r in eng.generate_batch(rests, max_new_tokens=args.new, eos_token_id=eos,
                                                          states=states)]
        seconds["fork+batch"] += time.perf_counter() - t0
        same["shared"] += sum(a == b for a, b in zip(alone, shared))
        same["fork+batch"] += sum(a == b for a, b in zip(alone, forked))
        print(f"  {policy} N={budget}: shared {'=' if shared == alone else '!='} alone, "
              f"fork+batch {'=' if forked == alone else '!='} alone", flush=True)

    n = len(cells) * len(ids)
    print(f"{len(cells)} cells x {len(ids)} samples of ~{args.length} tokens, B={B}, {args.new} new tokens "
          f"(full's {len(ids)} recording runs: {record_s:.1f} s, in both shared columns)")
    print("| way | seconds | per cell-sample | alone / this | samples with the alone tokens |")
    print("|---|---:|---:|---:|---:|")
    for way, s in seconds.items():
        print(f"| {way} | {s:.1f} | {s / n:.2f} | {seconds['alone'] / s:.2f}x | "
              f"{same.get(way, n)}/{n} |")


if __name__ == "__main__":
    main()
