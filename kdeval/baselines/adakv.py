"""AdaKV (Feng et al. 2024, arXiv 2407.11550): head-adaptive budgets around any scoring policy.

A layer keeps ``H * N`` tokens in all (``H`` KV heads, budget ``N``), shared among its heads by score instead of
``N`` each: the ``inner`` policy scores every head's tokens as usual, each head's ``floor(alpha_safeguard * N)``
best tokens are always kept (kvpress' ``AdaKVPress`` safeguard, so no head is starved), and the best ``H * N``
of the layer's tokens are kept, whichever heads they belong to. The inner policy's protected tokens (sink,
recent window) are kept in every head. The engine runs such a policy over one pool of slots per layer shared by
its heads, with exactly the uniform cache's memory (kdeval/keydiff/cache/headpool.py).

Differences from kvpress: kvpress only masks the evicted keys of a full prefill; here they are freed, chunk by
chunk, and the cache never holds more than ``H * (N + B)`` tokens per layer. Inner policies with per-token
state, a query window or re-rotation are refused (their state does not follow tokens across heads' pools).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from kdeval.baselines.wrapping import PassesOn, built_inner
from kdeval.keydiff.policy.interface import Policy, PolicyNeeds, ScoreContext
from kdeval.keydiff.policy.registry import register


def per_head_reason(policy: Policy) -> str | None:
    """Why ``policy`` cannot score a head-shared pool's heads, or ``None`` when it can."""
    if not policy.evicts:
        return f"policy {policy.name!r} does not score tokens"
    if isinstance(policy, AdaKV):
        return f"policy {policy.name!r} already shares a layer's budget among its heads"
    needs = policy.needs()
    kept = [what for what, yes in (("per-token state", needs.token_state), ("a query window", needs.queries),
                                   ("re-rotation", needs.rerotates)) if yes]
    if kept:
        return f"policy {policy.name!r} needs {', '.join(kept)}, which the pool does not keep"
    if needs.heads_alike:  # TOVA, ChunkKV: one selection for every head
        return f"policy {policy.name!r} scores all heads alike (heads='all')"
    return None


@register
@dataclass
class AdaKV(PassesOn, Policy):
    name = "ada"
    rule = "a layer's H x N kept tokens shared among its KV heads by an inner policy's scores (AdaKV)"

    #: the policy whose per-head scores are shared: a registered name (at its defaults) or a policy object
    inner: Any = "keydiff"
    alpha_safeguard: float = 0.2

    def validate(self) -> None:
        a = self.alpha_safeguard
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1:
            raise ValueError(f"alpha_safeguard: must be a number in [0, 1), got {a!r}")
        inner = built_inner(self.inner, per_head_reason)
        self._inner: Policy = inner

    def needs(self) -> PolicyNeeds:
        """The inner policy's needs, over a pool shared by the layer's heads."""
        return replace(self._inner.needs(), shares_heads=True)

    def head_safeguard(self, budget: int) -> int:
        return int(self.alpha_safeguard * budget)


@register
@dataclass
class AdaKeyDiff(AdaKV):
    name = "ada-keydiff"
    rule = "AdaKV around KeyDiff: a layer's H x N tokens shared among its KV heads by KeyDiff's scores"


@register
@dataclass
class AdaSnapKV(AdaKV):
    name = "ada-snapkv"
    rule = "AdaKV around SnapKV (kvpress' AdaKVPress(SnapKVPress)): H x N tokens shared by SnapKV's scores"
    inner: str = "snapkv"
