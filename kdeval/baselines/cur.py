"""CUR (CurDKV, arXiv 2509.15038): keep the tokens with the largest approximate leverage of their key and value.

The rule of kvpress' ``CURPress``, per layer and KV head: a token's key leverage is its squared norm ``|k|^2``
and its value leverage ``|v|^2`` (optionally after a random projection ``G [head_dim, 20]`` of keys and values,
``use_random_leverage``); with ``use_local_approximation`` each is divided by its sum over the token's window of
``local_window_size`` positions (a fixed grid, ``position // local_window_size``, so a window keeps its identity
from chunk to chunk, as the prefill's consecutive windows do); the score is the key leverage, the value leverage,
their mean or (default) their product. The first ``num_sinks`` positions are always kept.

RoPE rotates pairs of key channels, so ``|k|^2`` is the same before and after it; the random projection is taken
of the cached (rotated) keys, as kvpress does. Chunk by chunk the rule runs over the ``N + B`` cached tokens: a
window's sum is over its tokens still cached, so a token left alone in its window has the largest share, 1 (for
the key and the value: the product's largest score too), and such tokens tie, oldest kept first. kvpress divides
the scores by their sum over the tokens, which changes no head's ranking and is left out. Scores are rounded to 16
significant bits (kdeval/baselines/ties.py): a token repeated in the prompt has, up to float rounding, the same key
and value norms at every position, and rounding makes those ties exact (kept oldest first) instead of an order of
rounding noise that differs between a batch and a request alone.

Differences from kvpress: its random projection is drawn from the global generator at every compression; here it
is drawn once per layer from ``seed`` (``torch.Generator``, on the CPU), the same for every row and step, so a
batch row keeps what it keeps alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdeval.baselines.chunkkv import group_means
from kdeval.baselines.ties import significant_bits
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register

LEVERAGES = ("key", "value", "kv_avg", "kv_product")
SKETCH = 20  # kvpress' projection width


def random_projection(seed: int, layer: int, dim: int, like: torch.Tensor) -> torch.Tensor:
    """``G [dim, SKETCH]`` with N(0, 1/SKETCH) entries, drawn on the CPU from ``(seed, layer)``."""
    g = torch.Generator().manual_seed(seed * 100_003 + layer)
    return (torch.randn(dim, SKETCH, generator=g, dtype=torch.float64) / math.sqrt(SKETCH)).to(like)


def share_of_window(x: torch.Tensor, positions: torch.Tensor, order: torch.Tensor, window: int) -> torch.Tensor:
    """``x [b, h, n]`` (>= 0) divided by its sum over the token's window ``positions // window`` (0 where that sum
    is 0: slots that hold no token, whose keys and values are zero)."""
    total = group_means(x, positions, order, window, average=False)
    return torch.where(total > 0, x / total.clamp_min(torch.finfo(x.dtype).tiny), 0.0)


@register
@dataclass
class CUR(Policy):
    name = "cur"
    rule = "keep the tokens with the largest key x value leverage (squared norms, each over its local window)"

    num_sinks: int = 4
    leverage_type: str = "kv_product"
    use_random_leverage: bool = False
    use_local_approximation: bool = True
    local_window_size: int = 16
    seed: int = 0

    def validate(self) -> None:
        if not isinstance(self.num_sinks, int) or self.num_sinks < 0:
            raise ValueError(f"num_sinks: must be an integer >= 0, got {self.num_sinks!r}")
        if self.leverage_type not in LEVERAGES:
            raise ValueError(f"leverage_type: expected one of {list(LEVERAGES)}, got {self.leverage_type!r}")
        if not isinstance(self.local_window_size, int) or self.local_window_size <= 0:
            raise ValueError(f"local_window_size: must be an integer > 0, got {self.local_window_size!r}")
        for name in ("use_random_leverage", "use_local_approximation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected true or false, got {getattr(self, name)!r}")

    def needs(self) -> PolicyNeeds:
        """The values; a token alone in its window has the share 1 exactly, so scores tie exactly."""
        return PolicyNeeds(values=True, exact_ties=self.use_local_approximation)

    def n_sink(self) -> int:
        return self.num_sinks

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, h, n, d]``, ``ctx.values [b, h, n, d]`` → ``[b, h, n]`` (float32, or float64)."""
        dtype = torch.promote_types(keys.dtype, torch.float32)
        k, v = keys.to(dtype), ctx.values.to(dtype)
        if self.use_random_leverage:
            g = random_projection(self.seed, ctx.layer_idx, k.shape[-1], k)
            k, v = k @ g, v @ g
        k2, v2 = (k * k).sum(dim=-1), (v * v).sum(dim=-1)
        if self.use_local_approximation:
            order = ctx.position_order()
            k2, v2 = (share_of_window(x, ctx.positions, order, self.local_window_size) for x in (k2, v2))
        if self.leverage_type == "key":
            scores = k2
        elif self.leverage_type == "value":
            scores = v2
        else:
            scores = (k2 + v2) / 2 if self.leverage_type == "kv_avg" else k2 * v2
        return significant_bits(scores)
