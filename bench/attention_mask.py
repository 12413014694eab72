"""The chunk mask as SDPA takes it: boolean (transformers' ``sdpa``) vs additive, made once per forward
(kdeval's ``kdeval_sdpa``), on the CPU.

1. SDPA alone at SmolLM2-135M's chunk shape (9 query heads, 64 dims, a chunk of ``B`` after ``N`` cached keys):
   the boolean mask vs the same mask as ``0``/``-inf``; outputs compared exactly.
2. The engine end to end under kvpress' protocol (SmolLM2-135M offline, float32, a 2,000-token context and a
   16-token question, KeyDiff N=512, chunked B=128, 16 greedy tokens): the step under the model's ``sdpa``
   (boolean mask) vs ``kdeval_sdpa``, interleaved round by round; tokens compared.

    python bench/attention_mask.py [--rounds 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kdeval.baselines import get_policy
from kdeval.keydiff import Engine
from kdeval.keydiff.config import EngineConfig
from kdeval.zoo.loading import load_model

N, B, CONTEXT, QUESTION, NEW = 512, 128, 2000, 16, 16


def clock(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def sdpa_alone(reps: int) -> tuple[float, float, bool]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, B, 64, generator=g)
    k, v = torch.randn(1, 9, N + B, 64, generator=g), torch.randn(1, 9, N + B, 64, generator=g)
    visible = (torch.arange(N + B).view(1, -1) <= torch.arange(B).view(-1, 1) + N).view(1, 1, B, N + B)
    additive = torch.zeros(()).masked_fill(~visible, float("-inf"))
    same = torch.equal(F.scaled_dot_product_attention(q, k, v, attn_mask=visible),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=additive))
    boolean = clock(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=visible), reps)
    return boolean, clock(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=additive), reps), same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    boolean, additive, same = sdpa_alone(reps=50)
    print(f"SDPA alone, [1, 9, {B}, 64] over {N + B} keys: boolean mask {boolean * 1e3:.2f} ms, additive "
          f"{additive * 1e3:.2f} ms ({boolean / additive:.2f}x), identical outputs: {same}")
    model = load_model("smollm2-135m").model
    ids = torch.randint(100, 40000, (1, CONTEXT + QUESTION), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {"sdpa (boolean mask)": [], "kdeval_sdpa (additive)": []}
    tokens = {}
    for _ in range(args.rounds):
        for label in times:
            eng = Engine(model, get_policy("keydiff"), EngineConfig(budget=N, chunk_size=B, max_new_tokens=NEW))
            if label.startswith("sdpa"):
                object.__setattr__(eng.plan, "step_attention", None)  # the model's own sdpa: the old step
            t0 = time.perf_counter()
            tokens[label] = eng.generate(ids, NEW, protect_last=QUESTION).tokens
            times[label].append(time.perf_counter() - t0)
    old, new = (statistics.median(v) for v in times.values())
    for label, v in times.items():
        print(f"{label}: median {statistics.median(v):.2f} s per sample, rounds {[round(x, 2) for x in v]}")
    print(f"speed-up {old / new:.2f}x, same tokens: {len(set(map(str, tokens.values()))) == 1}")


if __name__ == "__main__":
    main()
