"""ThinK (Xu et al. 2024, arXiv 2407.21018): an inner policy chooses the tokens, then each KV head's least useful
key channels are zeroed.

The channel rule of kvpress' ``ThinKPress``, per layer and KV head over the kept keys: channel ``c`` scores

    s_c = mean over the window's queries and the KV head's query heads of q_c^2  x  mean over the kept keys of k_c^2

(queries: the last ``window`` ones, RoPE applied at their positions; keys: rotated, as cached) and the
``int(head_dim * key_channel_ratio)`` lowest-scoring channels are set to zero in every kept key of that head
(equal scores: the lower channel first). kvpress composes it after a token press,
``ComposedPress([SnapKVPress(r), ThinKPress(c)])``: the token press prunes the tokens, then ThinK scores the
channels over the keys it kept. Here ``inner`` is that token press; its kept set is exactly its own (ThinK changes
no score), and the default, SnapKV, is kvpress' example.

Where it acts: right after the commit of every eviction (``PolicyNeeds.edits_kept_keys``,
kdeval/keydiff/step/eviction.py), in the rows that freed tokens. A step that evicts nothing (the cache not full yet,
kvpress' protocol's question, decoding with ``decode: keep``) edits nothing, so until its first eviction a ThinK
cell's cache is the full cache's and shares its steps (kdeval/keydiff/step/shared.py), and a kept prompt is decoded
like any other (kdeval/evals/task_run/group_decode.py).

Chunk by chunk: at every eviction the channel scores are recomputed over the ``N`` keys kept out of the ``N + B``
cached ones, with the last ``window`` queries (kept per layer across chunks), and that step's lowest channels are
zeroed. A zeroed channel of a stored key is gone (a store that dropped it could not restore it): it stays zero and
counts as zero in later scores; the step's new keys arrive whole. So a key kept through several evictions may lose
more than ``int(head_dim * key_channel_ratio)`` channels when the choice moves; in one shot (one eviction, kvpress'
case) each head zeroes exactly that many. The cache still holds ``N + B`` tokens at most.

Bytes: as in kvpress, zeroed channels are stored at full width (the keys keep their shape): KV bytes equal the
inner policy's. Under ``kv_quant`` the edited keys are quantized again, as re-rotated ones are.

Refused inner policies: ``full`` (nothing is evicted, so nothing is edited), a head-shared pool (``ada*``; kvpress'
``ComposedPress`` refuses ``AdaKVPress`` too), a re-rotating policy (re-rotation mixes each RoPE pair of channels,
so a zeroed channel would not stay zero), another ThinK. An inner policy that keeps a query window shares it:
ThinK's ``window`` must fit in it, and its first skipped positions (``QueryNeed.skip``) stay out of ThinK's window.

Shapes: ``keys [batch, kv_heads, tokens, head_dim]``, queries ``[batch, q_heads, window, head_dim]``, channel
scores ``[batch, kv_heads, head_dim]``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.attention.queries import QueryNeed, RecentQueries
from kdeval.keydiff.policy.registry import register

if TYPE_CHECKING:
    from kdeval.keydiff.step.eviction import LayerEviction


def channel_scores(queries: torch.Tensor, valid: torch.Tensor, keys: torch.Tensor, real: torch.Tensor
                   ) -> torch.Tensor:
    """``queries [b, hq, w, d]`` (rotated) where ``valid [b, w]``, ``keys [b, hk, n, d]`` where ``real [b, hk, n]``
    → ``[b, hk, d]``: the mean of ``q_c^2`` over the valid queries and the KV head's query heads times the mean of
    ``k_c^2`` over its real keys (float32 or wider)."""
    b, hq, w, d = queries.shape
    hk = keys.shape[1]
    dtype = torch.promote_types(torch.promote_types(queries.dtype, keys.dtype), torch.float32)
    wq = valid.to(dtype).view(b, 1, w, 1)
    q2 = (queries.to(dtype).square() * wq).sum(2) / wq.sum(2).clamp(min=1)  # [b, hq, d]
    q2 = q2.view(b, hk, hq // hk, d).mean(2)
    wk = real.to(dtype).unsqueeze(-1)
    k2 = (keys.to(dtype).square() * wk).sum(2) / wk.sum(2).clamp(min=1)  # [b, hk, d]
    return q2 * k2


def lowest_channels(scores: torch.Tensor, count: int) -> torch.Tensor:
    """``scores [b, h, d]`` → ``[b, h, d]`` bool, True at each head's ``count`` lowest (ties: lower channel)."""
    order = torch.sort(scores, dim=-1, stable=True).indices[..., :count]
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, order, True)


def window_queries(queries: RecentQueries, seen: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The last ``window`` recent queries before RoPE ``[b, hq, w, d]`` and their positions ``[b, w]`` (``-1``: no
    query), the window ending at ``seen [b or 1, 1]`` (:meth:`RecentQueries.last`)."""
    q, positions = queries.last(seen)
    return q[:, :, -window:], positions[:, -window:]


def inner_reason(policy: Policy) -> str | None:
    """Why ThinK cannot wrap ``policy`` (module docstring), or ``None``."""
    if not policy.evicts:
        return "does not evict, so ThinK would never act"
    needs = policy.needs()
    if needs.edits_kept_keys:
        return "already edits its kept keys"
    if needs.shares_heads:
        return "shares a layer's slots among its KV heads (kvpress' ComposedPress refuses AdaKVPress too)"
    if needs.rerotates:
        return "re-rotates its kept keys, which mixes each RoPE pair of channels: a zeroed channel would not stay zero"
    return None


@register
@dataclass
class ThinK(PassesOn, Policy):
    name = "think"
    rule = ("an inner policy's kept tokens, then each KV head's key_channel_ratio x head_dim key channels of lowest "
            "mean q^2 (last window queries) x mean k^2 zeroed after every eviction, stored at full width (ThinK)")

    #: the policy that chooses the tokens: a registered name (at its defaults) or a policy object
    inner: Any = "snapkv"
    key_channel_ratio: float = 0.5
    window: int = 32

    def validate(self) -> None:
        r = self.key_channel_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1:
            raise ValueError(f"key_channel_ratio: must be a number in [0, 1), got {r!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0:
            raise ValueError(f"window: must be an integer > 0, got {self.window!r}")
        inner = built_inner(self.inner, inner_reason)
        own = inner.needs().queries
        if own is not None and own.window < self.window:
            raise ValueError(f"window: must be at most the {own.window} queries policy '{inner.name}' keeps, whose "
                             f"query window ThinK shares, got {self.window}")
        self._inner: Policy = inner

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs, the last ``window`` queries (the inner's window when it keeps one) and RoPE,
        and the edit of the kept keys."""
        own = self._inner.needs()
        queries = own.queries if own.queries is not None else QueryNeed(self.window, 1)
        return replace(own, queries=queries, projections=True, edits_kept_keys=True)

    def pruned_channels(self, keys: torch.Tensor, positions: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """``[b, hk, d]`` bool: the channels to zero in the kept ``keys [b, hk, n, d]`` at ``positions [b, hk, n]``
        (module docstring); none when ``int(d * key_channel_ratio)`` is 0."""
        d = keys.shape[-1]
        count = int(d * self.key_channel_ratio)
        if count == 0:
            return torch.zeros(*keys.shape[:2], d, dtype=torch.bool, device=keys.device)
        seen = ctx.seen if isinstance(ctx.seen, torch.Tensor) else torch.tensor(ctx.seen, device=keys.device)
        seen = seen.reshape(-1, 1)  # [b or 1, 1]
        q, q_pos = window_queries(ctx.queries, seen, self.window)
        q = ctx.projections.rotated(q, q_pos)
        real = positions < seen.unsqueeze(-1)
        return lowest_channels(channel_scores(q, q_pos >= 0, keys, real), count)

    def apply(self, eviction: LayerEviction) -> None:
        """The inner policy commits; then :meth:`pruned_channels` are zeroed in the kept keys of the rows that freed
        tokens."""
        self._inner.apply(eviction)
        keys, positions = eviction.kept()
        pruned = self.pruned_channels(keys, positions, eviction.ctx)
        rows = eviction.rows()
        if rows is not None:
            pruned &= rows.view(-1, 1, 1)
        keys.masked_fill_(pruned.unsqueeze(2), 0)
