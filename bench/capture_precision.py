"""Time of recording every query's attention row for one layer (what H2O needs per chunk), with half-precision
logits (``score_precision="model"``) against float32 logits, at the 3B shape: 24 query and 8 KV heads,
head size 128, a chunk of 128 queries over 8192 + 128 slots, bf16. It runs on whatever device is there.

    PYTHONPATH=. python bench/capture_precision.py
"""
from __future__ import annotations

import time

import torch

from kdeval.keydiff.attention.capture import AttentionCapture, AttentionNeed


def main(repeats: int = 3) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    hk, g, t, m, d = 8, 3, 128, 8192 + 128, 128
    q = torch.randn(1, hk * g, t, d, device=device).to(torch.bfloat16)
    k = torch.randn(1, hk, m, d, device=device).to(torch.bfloat16)
    best = {}
    for float32_logits in (False, True) * 2:  # interleaved, the first of each a warm-up
        cap = AttentionCapture(AttentionNeed("all"), float32_logits=float32_logits)
        times = []
        for _ in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            cap.record(0, q, k, d**-0.5)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        name = "float32" if float32_logits else "model"
        best[name] = min(best.get(name, float("inf")), *times[1:])
    print(f"{device}: one layer's H2O capture, B=128 over {m} slots, bf16")
    print(f"score_precision=model: {best['model'] * 1e3:.2f} ms; float32: {best['float32'] * 1e3:.2f} ms; "
          f"ratio {best['model'] / best['float32']:.2f}x")


if __name__ == "__main__":
    main()
