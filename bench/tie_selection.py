"""SnapKV's selection (k lowest scores, ties oldest first) at the fused 3B shape: the stable sort it replaced
against the 64-bit-key ``topk`` (kdeval.keydiff.policy.selection.lowest_oldest_first), on whatever device is there.

    PYTHONPATH=. python bench/tie_selection.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from kdeval.keydiff.policy.selection import lowest_oldest_first, sort_oldest_first

sys.path.insert(0, str(Path(__file__).parent))
from engine_modes import SHAPES, clock  # noqa: E402

LAYOUT = SHAPES["llama-3.2-3b"]
ROWS, HEADS = LAYOUT["num_hidden_layers"], LAYOUT["num_key_value_heads"]  # all layers' rows at once (fused)
SLOTS, K = 8192 + 128, 128  # N + B slots, B dropped


def by_sort(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """The selection before: the positions' argsort, then the stable sort."""
    return sort_oldest_first(scores, positions.argsort(dim=-1), k)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(0)
    scores = torch.randint(0, 100, (ROWS, HEADS, SLOTS), device=device, generator=g).float()  # many ties
    positions = torch.rand(ROWS, HEADS, SLOTS, device=device, generator=g).argsort(dim=-1)
    same = torch.equal(lowest_oldest_first(scores, positions, K).sort(-1).values,
                       by_sort(scores, positions, K).sort(-1).values)
    old = clock(lambda: by_sort(scores, positions, K), device, reps=5, warmup=1)
    new = clock(lambda: lowest_oldest_first(scores, positions, K), device, reps=5, warmup=1)
    print(f"{device}: [{ROWS}, {HEADS}, {SLOTS}] k={K}: argsort + stable sort {old * 1e3:.2f} ms, "
          f"keys + topk {new * 1e3:.2f} ms ({new / old:.2f}x); same slots: {same}")


if __name__ == "__main__":
    main()
