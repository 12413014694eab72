"""What a policy that wraps another shares: the inner policy built from a name or an object and checked, and the
calls a wrapper passes on unchanged (sinks, recent window, per-layer budgets, observation, scores, and the commit
hook ``apply``, so a wrapped policy's merge or key edit still happens).

Shapes as in :mod:`kdeval.keydiff.policy.interface`: ``keys [batch, kv_heads, tokens, head_dim]``, scores ``[batch, kv_heads,
tokens]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from kdeval.keydiff.policy.interface import Policy, ScoreContext
from kdeval.keydiff.policy.registry import as_policy, registered
from kdeval.names import suggest

if TYPE_CHECKING:
    from kdeval.keydiff.step.eviction import LayerEviction


def built_inner(inner: Any, reason: Callable[[Policy], str | None]) -> Policy:
    """``inner`` (a registered name, at its defaults, or a policy object) as a policy, or ``ValueError`` naming
    ``inner``: an unknown name (with the nearest known one) or ``reason(policy)``, and the policies it can wrap."""
    policy = as_policy(inner)
    why = f"unknown policy {inner!r}" if policy is None else reason(policy)
    if why is None:
        return policy
    known = [n for n, cls in sorted(registered().items()) if reason(cls()) is None]
    hint = suggest(str(inner), known) if policy is None else ""
    raise ValueError(f"inner: {why}{hint} (policies it can wrap: {', '.join(known)})")


class PassesOn:
    """A wrapper's calls that its inner policy (``self._inner``) answers as they are."""

    _inner: Policy

    @property
    def wrapped(self) -> Policy:
        """The inner policy object (``inner`` built, when given by name)."""
        return self._inner

    def n_sink(self) -> int:
        return self._inner.n_sink()

    def n_recent(self, budget: int) -> int:
        return self._inner.n_recent(budget)

    def layer_budgets(self, budget: int, num_layers: int) -> list[int]:
        """The inner policy's allocation (PyramidKV's per-layer budgets are kept, not silently made uniform)."""
        return self._inner.layer_budgets(budget, num_layers)

    def observe(self, ctx: ScoreContext) -> None:
        self._inner.observe(ctx)

    def score(self, keys: torch.Tensor, ctx: ScoreContext) -> torch.Tensor:
        """The inner policy's scores: the kept set is its own."""
        return self._inner.score(keys, ctx)

    def apply(self, eviction: LayerEviction) -> None:
        """The inner policy commits, doing to its kept entries what it does (a merge, a key edit)."""
        self._inner.apply(eviction)
