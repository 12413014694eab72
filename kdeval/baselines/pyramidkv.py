"""PyramidKV (Cai et al. 2024, arXiv 2406.02069): SnapKV's scores under per-layer budgets that shrink with depth.

Tokens are scored exactly as by :class:`~kdeval.baselines.snapkv.SnapKV` (the last ``window`` queries' pooled
attention, the window always kept); only how many each layer keeps changes. With ``L`` layers, uniform budget
``N`` and ``S = N - window`` selectable tokens per layer, layer ``l`` keeps ``window + s_l``, the shares ``s_l``
falling linearly from ``2S - S/beta`` (layer 0) to ``S/beta`` (layer ``L - 1``): they average ``S``, so the
layers keep ``L * N`` tokens in all, as many as a uniform ``N``, and every layer keeps its window (the paper's
reference code, KVCache-Factory's ``PyramidKVCluster``, spreads ``max_capacity_prompt - window`` the same way
and adds the window to every layer). ``beta`` (>= 1) sets the slope: 1 is uniform, larger is steeper.

Integer budgets: each share is rounded down, and the tokens this leaves (fewer than ``L``) go one each to the
layers with the largest fractional parts, shallower layers first among equal ones; the budgets then sum to
exactly ``L * N`` and still never grow with depth. Computed in exact fractions (no float rounding).

Differences from kvpress' ``PyramidKVPress``: kvpress spreads the whole ``N`` (window included) from
``2N - N/beta`` down to ``N/beta``, caps the largest layer at ``prompt - window`` and falls back to SnapKV's
uniform budget when the smallest layer could not hold the window. A chunked engine fixes its budgets before it
knows the prompt's length, so here the window is kept on top, as in the paper's code, and no fallback is needed:
every layer holds its window whenever ``N >= window``.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from kdeval.baselines.snapkv import SnapKV
from kdeval.keydiff.policy.registry import register


def pyramid_shares(total: int, num_layers: int, beta: float) -> list[int]:
    """``total`` tokens per layer on average, spread over ``num_layers`` layers linearly from ``2 * total -
    total / beta`` down to ``total / beta``; integers summing to ``num_layers * total`` (module docstring)."""
    if num_layers == 1:
        return [total]
    lo = Fraction(total) / Fraction(beta)
    hi = 2 * total - lo
    exact = [hi - (hi - lo) * i / (num_layers - 1) for i in range(num_layers)]
    shares = [int(x) for x in exact]  # floor: every share is >= 0
    left = num_layers * total - sum(shares)
    by_fraction = sorted(range(num_layers), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_fraction[:left]:
        shares[i] += 1
    return shares


@register
@dataclass
class PyramidKV(SnapKV):
    name = "pyramidkv"
    rule = "SnapKV's scores; per-layer budgets falling linearly with depth (slope beta), summing to layers x N"

    beta: float = 20.0

    def validate(self) -> None:
        super().validate()
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta >= 1:
            raise ValueError(f"beta: must be a number >= 1, got {self.beta!r}")

    def layer_budgets(self, budget: int, num_layers: int) -> list[int]:
        """``window`` in every layer plus its share of the ``budget - window`` other tokens (module docstring)."""
        return [self.window + s for s in pyramid_shares(budget - self.window, num_layers, self.beta)]
