"""KeyDiff (arXiv 2504.15364): keep the keys least similar to the mean key, per layer and KV head.

score_i = -cos(k_i, a), with the anchor a = mean_j(k_j / |k_j|) over the tokens currently cached.

Variants (``anchor``):

- ``normalized`` (the paper's form, default): the mean of the unit keys.
- ``mean``: the raw mean key, ``a = mean_j k_j``.
- ``pairwise``: the exact form ``-sum_j cos(k_i, k_j)``, O(tokens²); it ranks exactly like ``normalized``
  (``sum_j cos(k_i,k_j) = n |a| cos(k_i, a)``) and exists to check that.

``window_fraction`` is the sliding-window extension: that fraction of the budget always holds the most
recent tokens. ``n_sink`` protects the first positions (attention sinks).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kdeval.keydiff.policy.interface import Policy, ScoreContext
from kdeval.keydiff.policy.registry import register

ANCHORS = ("normalized", "mean", "pairwise")


def keydiff_scores(keys: torch.Tensor, anchor: str = "normalized") -> torch.Tensor:
    """``keys [b, h, n, d]`` → ``[b, h, n]`` KeyDiff scores (higher = more distinct = keep), in float32 (float64
    for float64 keys).

    Computed as ``-(k_i · a) / |k_i|`` with ``a`` the normalized sum of the unit keys (or of the raw keys):
    one conversion of the keys, their norms, and two matrix-vector products, instead of materialising the unit
    keys and their elementwise product with the anchor.
    """
    k = keys if keys.dtype == torch.float64 else keys.float()
    if anchor == "pairwise":
        unit = F.normalize(k, dim=-1, eps=1e-6)
        return -torch.matmul(unit, unit.transpose(-1, -2)).sum(dim=-1)
    inv_norm = 1.0 / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-6)  # [b, h, n, 1]
    if anchor == "normalized":
        centre = torch.matmul(inv_norm.transpose(-1, -2), k)  # [b, h, 1, d]: the sum of the unit keys
    else:
        centre = k.sum(dim=2, keepdim=True)
    centre = F.normalize(centre, dim=-1, eps=1e-6)
    return -(torch.matmul(k, centre.transpose(-1, -2)) * inv_norm).squeeze(-1)


@register
@dataclass
class KeyDiff(Policy):
    name = "keydiff"
    rule = "keep the keys least similar (cosine) to the mean unit key, per layer and KV head"

    anchor: str = "normalized"
    window_fraction: float = 0.0
    n_sink_tokens: int = 0

    def validate(self) -> None:
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor: expected one of {list(ANCHORS)}, got {self.anchor!r}")
        if not 0.0 <= self.window_fraction < 1.0:
            raise ValueError(f"window_fraction: must be in [0, 1), got {self.window_fraction}")
        if self.n_sink_tokens < 0:
            raise ValueError(f"n_sink_tokens: must be >= 0, got {self.n_sink_tokens}")

    def n_sink(self) -> int:
        return self.n_sink_tokens

    def n_recent(self, budget: int) -> int:
        return int(self.window_fraction * budget)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        return keydiff_scores(keys, self.anchor)


@register
@dataclass
class KeyDiffMean(KeyDiff):
    name = "keydiff-mean"
    rule = "KeyDiff with the raw mean key as anchor"
    anchor: str = "mean"


@register
@dataclass
class KeyDiffPairwise(KeyDiff):
    name = "keydiff-pairwise"
    rule = "KeyDiff's exact O(n^2) form: keep keys with the lowest summed cosine to all cached keys"
    anchor: str = "pairwise"


@register
@dataclass
class KeyDiffWindow(KeyDiff):
    name = "keydiff-sw"
    rule = "KeyDiff plus a sliding window: window_fraction of the budget always holds the newest tokens"
    window_fraction: float = 0.25
