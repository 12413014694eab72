"""LeverageScore (Chari & Van Durme 2025, Compactor, arXiv 2507.08143): keep the keys with the largest approximate
statistical leverage, the geometric outliers of the layer's keys before RoPE.

The rule of kvpress' ``LeverageScorePress``, per layer and KV head over the cached tokens: the keys before RoPE
``K [n, d]`` are centred on their mean, sketched on the right by a Gaussian ``Phi [d, k]`` (entries N(0, 1/k)),
``X = (K - mean) Phi``, and a token's score is its leverage in ``X``, ``x_i^T (X^T X + 1e-2 I)^-1 x_i`` (a
Cholesky solve, the jitter raised tenfold while it fails), clamped at 0. kvpress then z-normalizes them over the heads
and tokens, which changes no head's ranking and is left out (Compactor, which blends them, normalizes). Scores are
rounded to 16 significant bits (kdeval/baselines/ties.py): a token repeated in the prompt has the same key before
RoPE at the first layer, and so the same leverage, up to the rounding of rotating it and back.

Chunk by chunk the rule runs over the ``N + B`` cached tokens at every eviction (their mean, their sketch); the
keys before RoPE are the cached keys rotated back by their positions (kdeval/keydiff/attention/reads.py), within float
rounding of kvpress' ``k_proj`` of the hidden states. Slots that hold no token take no part in the mean, the Gram
matrix or the normalization.

Differences from kvpress: its sketch is drawn from the global generator at every compression, a new one per batch
row; here it is drawn once per layer from ``seed`` (``torch.Generator`` on the CPU, ``[kv_heads, d, k]``, one
sketch per head), the same for every row and step, so a batch row keeps what it keeps alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdeval.baselines.ties import significant_bits
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


def gaussian_sketch(seed: int, layer: int, heads: int, dim: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """``Phi [heads, dim, width]``, entries N(0, 1/width), drawn on the CPU from ``(seed, layer)``."""
    g = torch.Generator().manual_seed(seed * 100_003 + layer)
    return (torch.randn(heads, dim, width, generator=g) * (1 / math.sqrt(width))).to(like)


def cholesky_with_jitter(gram: torch.Tensor, jitter: float = 1e-2, tries: int = 5) -> torch.Tensor:
    """The lower Cholesky factor of ``gram [..., k, k] + jitter I``, the jitter raised tenfold while it fails."""
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    for _ in range(tries):
        factor, info = torch.linalg.cholesky_ex(gram + jitter * eye)
        if bool((info == 0).all()):
            return factor
        jitter *= 10.0
    raise RuntimeError(f"leverage: the keys' Gram matrix stays singular with a jitter of {jitter / 10:g}")


def leverage_scores(keys: torch.Tensor, valid: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
    """Approximate leverage ``[b, h, n]`` of the keys before RoPE ``keys [b, h, n, d]``; ``valid [b, h, n]``: the
    slots that hold a token (the others score 0 and take no part); ``sketch [h, d, k]``. float32 (or float64)."""
    weight = valid.unsqueeze(-1).to(keys.dtype)
    mean = (keys * weight).sum(-2, keepdim=True) / weight.sum(-2, keepdim=True).clamp_min(1)
    x = torch.matmul((keys - mean) * weight, sketch.unsqueeze(0))  # [b, h, n, k]
    x = x if x.dtype == torch.float64 else x.float()
    xt = x.transpose(-2, -1)
    gram = xt @ x
    factor = cholesky_with_jitter(0.5 * (gram + gram.transpose(-2, -1)))
    solved = torch.cholesky_solve(xt, factor)  # (X^T X)^-1 X^T, [b, h, k, n]
    return (x * solved.transpose(-2, -1)).sum(-1).clamp_min(0)


def z_scores(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``scores [b, h, n]`` normalized over each row's valid heads and tokens: (s - mean) / std (unbiased, at
    least 1e-6); invalid slots are left at 0."""
    weight = valid.to(scores.dtype)
    count = weight.sum((1, 2), keepdim=True)
    mean = (scores * weight).sum((1, 2), keepdim=True) / count.clamp_min(1)
    var = ((scores - mean) ** 2 * weight).sum((1, 2), keepdim=True) / (count - 1).clamp_min(1)
    return ((scores - mean) / var.sqrt().clamp_min(1e-6)) * weight


@register
@dataclass
class LeverageScore(Policy):
    name = "leverage"
    rule = "keep the keys (before RoPE) with the largest approximate leverage under a Gaussian sketch"

    sketch_dimension: int = 48
    seed: int = 0

    def validate(self) -> None:
        if not isinstance(self.sketch_dimension, int) or self.sketch_dimension <= 0:
            raise ValueError(f"sketch_dimension: must be an integer > 0, got {self.sketch_dimension!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed: expected an integer, got {self.seed!r}")

    def needs(self) -> PolicyNeeds:
        """The layer's RoPE, to take the cached keys back to before it (``ScoreContext.projections``); a repeated
        token's keys before RoPE are one key, so scores tie exactly (rounded: kdeval/baselines/ties.py)."""
        return PolicyNeeds(projections=True, exact_ties=True)

    def unrotated(self, keys: torch.Tensor, ctx: ScoreContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys before RoPE ``[b, h, n, d]`` and ``valid [b, h, n]``."""
        return ctx.projections.unrotated_keys(keys, ctx.positions), ctx.positions < ctx.seen

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        pre, valid = self.unrotated(keys, ctx)
        sketch = gaussian_sketch(self.seed, ctx.layer_idx, keys.shape[1], keys.shape[-1], self.sketch_dimension, pre)
        return significant_bits(leverage_scores(pre, valid, sketch))
