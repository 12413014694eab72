"""Choosing the k lowest scores with ties broken oldest first: the 64-bit-key topk against the stable sort."""
from __future__ import annotations

import pytest
import torch

from kdeval.keydiff.cache.budget_cache import EMPTY_POSITION
from kdeval.keydiff.policy.selection import lowest_oldest_first, sort_oldest_first


def by_sort(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """The definition: order the slots by position, stable-sort by score, take the first k."""
    return sort_oldest_first(scores, positions.argsort(dim=-1), k)


# float64 scores take sort_oldest_first itself; the 64-bit keys serve float32 and half precision
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topk_over_keys_picks_what_the_stable_sort_picks(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rows, h, n = 3, 4, 60
    # few distinct values, so most scores tie; signed zeros, infinities, negatives and the empty slots' ranks
    values = torch.tensor([0.0, -0.0, 0.25, -0.5, 3.0, float("inf"), float("-inf"), -1.5e30, -1.9e30])
    scores = values[torch.randint(0, len(values), (rows, h, n), generator=g)].to(dtype)
    positions = torch.stack([torch.randperm(n, generator=g) for _ in range(rows * h)]).view(rows, h, n) * 7
    positions[..., :5] = EMPTY_POSITION - torch.arange(5)  # empty slots carry huge positions
    scores[..., :5] = torch.tensor([-1.9e30, -1.8e30, -1.7e30, -1.6e30, -1.5e30], dtype=dtype)
    for k in (1, 7, 30, n):
        got = lowest_oldest_first(scores, positions, k).sort(dim=-1).values
        want = by_sort(scores, positions, k).sort(dim=-1).values
        assert torch.equal(got, want), (k, got, want)


def test_equal_scores_drop_the_oldest_position_first():
    scores = torch.tensor([[[2.0, 1.0, 1.0, 1.0, -0.0, 0.0]]])
    positions = torch.tensor([[[10, 40, 20, 30, 50, 5]]])
    # the zeros tie (-0.0 == 0.0): position 5 goes before 50; then the ones, oldest first: 20, 30, 40
    assert lowest_oldest_first(scores, positions, 1).tolist() == [[[5]]]
    assert sorted(lowest_oldest_first(scores, positions, 3)[0, 0].tolist()) == [2, 4, 5]
    assert sorted(lowest_oldest_first(scores, positions, 4)[0, 0].tolist()) == [2, 3, 4, 5]
