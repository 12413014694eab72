"""Compactor (Chari & Van Durme 2025, arXiv 2507.08143): approximate leverage of the keys blended with non-causal,
tiled attention, query-agnostic.

The rule of kvpress' ``CompactorPress``, per layer over the tokens between the first ``sink_size_start`` and the
last ``sink_size_end`` positions (both always kept), the *scored* tokens:

- leverage: :mod:`kdeval.baselines.leverage`'s scores of the scored keys before RoPE, z-normalized over the
  row's heads and scored tokens;
- attention: the scored positions cut into tiles of ``chunk_size`` from ``sink_size_start`` on; every query of a
  tile attends, without a causal mask and without the ``1/sqrt(d)`` scale, to the keys of its tile, and a key's
  score is the sum of the probabilities it gets, averaged over its KV head's query heads, times ``|v|``, pooled
  with an average over 3 neighbours (zeros past the scored tokens) and z-normalized like the leverage. The last
  tile is short; kvpress pads it to ``chunk_size`` with zero queries and keys at logit ``-1e-9``, and that
  padding takes part (every real query's softmax has those ``pad`` logits beside the tile's keys, every padded
  query attends almost uniformly): kept here, so the last tile scores as kvpress' does;
- the score is ``blending * leverage + attention``; ``blending=None`` takes the fraction of the layer's cached
  tokens the step evicts, ``1 - N / tokens`` (kvpress' compression ratio, in one shot).

The queries are the layer's last ``query_window`` queries before RoPE (``PolicyNeeds.queries``, the sinks' left
out), rotated at their positions. In one shot with ``query_window`` >= the prompt this is kvpress' rule; chunk by
chunk the attention part comes from the queries still in the window, each over the cached keys of its own tile
(an evicted key takes no part, a tile whose queries left the window scores by leverage alone), and the cache holds
at most ``N + B`` tokens per KV head. Scores are rounded to 16 significant bits (kdeval/baselines/ties.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kdeval.baselines.leverage import gaussian_sketch, leverage_scores, z_scores
from kdeval.baselines.snapkv import pool_scores
from kdeval.baselines.ties import significant_bits
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.attention.queries import QueryNeed
from kdeval.keydiff.policy.registry import register

PAD_LOGIT = -1e-9  # kvpress' logit of a padding key


def tiled_attention(q: torch.Tensor, q_pos: torch.Tensor, keys: torch.Tensor, k_pos: torch.Tensor,
                    scored: torch.Tensor, start: int, end: torch.Tensor, tile: int) -> torch.Tensor:
    """Non-causal attention summed per key, within tiles ``(position - start) // tile``.

    ``q [b, hq, w, d]`` rotated queries at ``q_pos [b, w]`` (``-1``: no query), ``keys [b, hk, n, d]`` at ``k_pos
    [b, hk, n]``, ``scored [b, hk, n]``: the keys that take part; ``end [b, 1]``: the first position past the
    scored ones (the last tile's padding is ``tile`` minus its positions before ``end``) → ``[b, hk, n]``."""
    b, hq, w, _ = q.shape
    hk, n = keys.shape[1], keys.shape[2]
    group = hq // hk
    q_tile = torch.where(q_pos >= start, torch.div(q_pos - start, tile, rounding_mode="floor"), -1)  # [b, w]
    k_tile = torch.where(scored, torch.div(k_pos - start, tile, rounding_mode="floor"), -2)  # [b, hk, n]
    last = torch.div(end - 1 - start, tile, rounding_mode="floor")  # [b, 1]
    pad = (last + 1) * tile + start - end  # [b, 1]: padded entries of the last tile
    q_pad = torch.where(q_tile == last, pad, 0).to(q.dtype)  # [b, w]: padding beside each query's softmax
    out = torch.zeros(b, hq, n, dtype=q.dtype, device=q.device)
    for h in range(hq):
        kv = h // group
        logits = q[:, h] @ keys[:, kv].transpose(-1, -2)  # [b, w, n]
        same = (q_tile.unsqueeze(-1) == k_tile[:, kv].unsqueeze(1)) & (q_tile >= 0).unsqueeze(-1)
        logits = logits.masked_fill(~same, float("-inf"))
        top = torch.maximum(logits.amax(-1), torch.where(q_pad > 0, PAD_LOGIT, float("-inf")))  # [b, w]
        top = torch.where(torch.isfinite(top), top, 0.0)
        e = (logits - top.unsqueeze(-1)).exp()
        # the padding's share; top >= PAD_LOGIT where there is padding (elsewhere exp could overflow: left out)
        denom = e.sum(-1) + torch.where(q_pad > 0, q_pad * torch.exp((PAD_LOGIT - top).clamp(max=0)), 0.0)
        out[:, h] = (e / denom.clamp_min(torch.finfo(q.dtype).tiny).unsqueeze(-1)).sum(1)
    # the padded queries of the last tile: logit 0 for its keys, PAD_LOGIT for the padding, near-uniform
    in_last = (k_tile == last.unsqueeze(-1)).to(q.dtype)  # [b, hk, n]
    real = in_last.sum(-1, keepdim=True)
    pad = pad.unsqueeze(-1).to(q.dtype)
    uniform = pad / (real + pad * math.exp(PAD_LOGIT))
    out = out.view(b, hk, group, n).mean(2)
    return out + in_last * uniform


@register
@dataclass
class Compactor(Policy):
    name = "compactor"
    rule = ("keep the tokens with the best blend of key leverage (before RoPE) and non-causal attention within "
            "tiles, times |v| (Compactor)")

    sink_size_start: int = 8
    sink_size_end: int = 4
    chunk_size: int = 256
    sketch_dimension: int = 48
    blending: float | None = None
    query_window: int = 1024
    seed: int = 0

    def validate(self) -> None:
        for name in ("sink_size_start", "sink_size_end"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
        for name in ("chunk_size", "sketch_dimension", "query_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: must be an integer > 0, got {value!r}")
        b = self.blending
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0):
            raise ValueError(f"blending: expected a number >= 0 or null, got {b!r}")

    def needs(self) -> PolicyNeeds:
        """The last ``query_window`` queries before RoPE (the sinks' left out), the values and RoPE."""
        return PolicyNeeds(queries=QueryNeed(self.query_window, 1, self.sink_size_start), values=True,
                           projections=True, exact_ties=True)

    def n_sink(self) -> int:
        return self.sink_size_start

    def n_recent(self, budget: int) -> int:
        return self.sink_size_end

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``keys [b, hk, n, d]`` → ``[b, hk, n]``; tokens outside the scored range score 0 (the engine keeps the
        sinks and the recent ones, and frees empty slots first)."""
        seen = ctx.seen if isinstance(ctx.seen, torch.Tensor) else torch.tensor(ctx.seen, device=keys.device)
        end = (seen.reshape(-1, 1) - self.sink_size_end).expand(keys.shape[0], 1)  # [b, 1]
        scored = (ctx.positions >= self.sink_size_start) & (ctx.positions < end.unsqueeze(-1))
        pre = ctx.projections.unrotated_keys(keys, ctx.positions)
        sketch = gaussian_sketch(self.seed, ctx.layer_idx, keys.shape[1], keys.shape[-1], self.sketch_dimension, pre)
        lev = z_scores(leverage_scores(pre, scored, sketch), scored)

        q, q_pos = ctx.queries.last(seen.reshape(-1, 1))
        q_pos = torch.where(q_pos < end, q_pos, -1)  # the recent tokens' queries take no part
        q = ctx.projections.rotated(q, q_pos)
        attn = tiled_attention(q, q_pos, keys.to(pre.dtype), ctx.positions, scored, self.sink_size_start, end,
                               self.chunk_size)
        attn = attn * ctx.values.to(pre.dtype).norm(dim=-1)
        attn = pool_scores(attn, 3, "avg", ctx.position_order(), scored)
        attn = z_scores(attn, scored)
        if self.blending is not None:
            blend = self.blending
        else:
            real = (ctx.positions < seen.reshape(-1, 1, 1)).sum(-1, keepdim=True)[:, :1]  # [b, 1, 1]
            blend = 1 - ctx.budget / real.to(pre.dtype)
        return significant_bits(blend * lev + attn) * scored
