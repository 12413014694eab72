"""SnapKV's selection (k lowest scores, ties oldest first) at the fused 3B shape: the stable sort it replaced
against the 64-bit-key ``topk`` (kdeval.keydiff.policy.lowest_oldest_first), on whatever device is there.

    PYTHONPATH=. python bench/tie_selection.py
"""
from __future__ import annotations

import time

import torch

from kdeval.keydiff.policy import lowest_oldest_first

ROWS, HEADS, SLOTS, K = 28, 8, 8192 + 128, 128  # 28 layers x 8 KV heads, N + B slots, B dropped


def by_sort(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    order = positions.argsort(dim=-1)
    pick = torch.sort(scores.gather(-1, order), dim=-1, stable=True).indices[..., :k]
    return order.gather(-1, pick)


def clock(fn, device: str, reps: int = 5) -> float:
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(0)
    scores = torch.randint(0, 100, (ROWS, HEADS, SLOTS), device=device, generator=g).float()  # many ties
    positions = torch.rand(ROWS, HEADS, SLOTS, device=device, generator=g).argsort(dim=-1)
    same = torch.equal(lowest_oldest_first(scores, positions, K).sort(-1).values,
                       by_sort(scores, positions, K).sort(-1).values)
    old = clock(lambda: by_sort(scores, positions, K), device)
    new = clock(lambda: lowest_oldest_first(scores, positions, K), device)
    print(f"{device}: [{ROWS}, {HEADS}, {SLOTS}] k={K}: argsort + stable sort {old * 1e3:.2f} ms, "
          f"keys + topk {new * 1e3:.2f} ms ({new / old:.2f}x); same slots: {same}")


if __name__ == "__main__":
    main()
