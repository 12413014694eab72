"""A KV budget N: an absolute number of tokens, or a share of the prompt resolved per sample (``"25%"``).

A share keeps exactly what kvpress keeps at compression ratio ``r = 1 − share``: ``N = int(tokens × (1 − r))``
tokens per layer and KV head of each sample, computed as kvpress does, in Python floats with ``r`` the float of
the ratio's decimal text (``"10%"``: r = 0.9; of 30 tokens that is int(2.9999999999999996) = 2, not 3), so a
share cell keeps the same count as the kvpress cell of that ratio (``tokens``: the whole prompt under
``compress: prompt``, kvpress's query-aware; the context under ``compress: context``, its default). It is written, hashed and stored as its canonical text (``"25%"``, ``"12.5%"``:
the percentage without trailing zeros), so ``"25.0%"`` and ``"25%"`` are one cell while ``"25%"`` and the
absolute N it resolves to are two. A small share of a short prompt can resolve to N = 0, which no evicting
policy accepts (the runner's check names the sample).
:func:`budget_groups` resolves a run's samples (the runner gives each N its own engine).
"""
from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Any, Sequence, Union

from kdeval.evals.tasks.base import EvalError, Sample
from kdeval.evals.tasks.prompting import BuiltPrompt

#: A cell's budget: tokens, a share's canonical text (``"25%"``), or None (no eviction: ``full``).
Budget = Union[int, str, None]

#: What a budget may be (grid errors and the runner's).
BUDGET_EXPECTED = 'expected a positive number of tokens or a share of the prompt such as "25%" (0 < share <= 100)'

_SHARE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*%\s*$")


def parse_budget(value: Any) -> int | str:
    """``value`` as a budget: a positive int (also from an integral float or digit string) or a share's
    canonical text (``"12.50 %"`` -> ``"12.5%"``). ValueError(:data:`BUDGET_EXPECTED`) otherwise."""
    if isinstance(value, bool):
        raise ValueError(BUDGET_EXPECTED)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int):
        if value < 1:
            raise ValueError(BUDGET_EXPECTED)
        return value
    m = _SHARE.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(BUDGET_EXPECTED)
    percent = Decimal(m.group(1))
    if not 0 < percent <= 100:
        raise ValueError(BUDGET_EXPECTED)
    return f"{percent.normalize():f}%"


def is_share(budget: Budget) -> bool:
    """Whether ``budget`` is a share of the prompt (canonical text) rather than tokens or None."""
    return isinstance(budget, str)


def share_fraction(budget: str) -> Fraction:
    """A share's exact value in (0, 1]: ``"12.5%"`` -> ``Fraction(1, 8)``."""
    return Fraction(Decimal(budget[:-1])) / 100


def budget_share(budget: Budget) -> float | None:
    """The share as a float in (0, 1] (``"25%"`` -> 0.25, what storage records); None for tokens or None."""
    return float(share_fraction(budget)) if is_share(budget) else None


def budget_tokens(budget: Budget) -> int | None:
    """The absolute N of a token budget; None for a share or no budget (what storage records as ``budget``)."""
    return None if budget is None or is_share(budget) else int(budget)


def kvpress_ratio(budget: str) -> float:
    """kvpress's ``compression_ratio`` for a share: ``1 − share`` as the float of its exact decimal text
    (``"10%"`` -> 0.9, ``"12.5%"`` -> 0.875)."""
    return float(Decimal(1) - Decimal(budget[:-1]) / 100)


def resolve_budget(budget: Budget, tokens: int) -> int | None:
    """The N a sample keeps: ``budget`` itself when absolute (or None); for a share, kvpress's kept count
    ``int(tokens * (1 - r))`` with ``r`` = :func:`kvpress_ratio` (ScorerPress's ``n_kept``, float arithmetic
    included)."""
    if not is_share(budget):
        return budget
    return int(tokens * (1 - kvpress_ratio(budget)))


def budget_order(budget: Budget) -> tuple[int, Fraction]:
    """Sort key: no budget first, then token budgets by N, then shares by size (the two never interleave)."""
    if budget is None:
        return (0, Fraction(0))
    if is_share(budget):
        return (2, share_fraction(budget))
    return (1, Fraction(budget))


def compressed_tokens(compress: str, prompt: BuiltPrompt, max_new_tokens: int) -> int:
    """The tokens a share of a budget (``"25%"``) is a share of: the prompt under ``compress="prompt"``, its
    context under ``"context"``, the sample's ``max_new_tokens`` (the longest trace) under ``"generated"``."""
    if compress == "context":
        return len(prompt.prefix_ids)
    return max_new_tokens if compress == "generated" else prompt.n_tokens


def budget_groups(budget: Budget, policy: Any, samples: Sequence[Sample], built: Sequence[BuiltPrompt],
                  compress: str) -> dict[int | None, list[int]]:
    """The samples (indices, in order) of each N they keep: all of them under N tokens or None; under a share
    each sample's :func:`resolve_budget` of what is compressed (the prompt, the context alone, or under
    ``compress="generated"`` the sample's ``max_new_tokens``: :func:`compressed_tokens`). A share is checked
    against what ``policy`` always keeps for every sample before anything runs (EvalError naming the first
    sample below it)."""
    if not is_share(budget):
        return {budget: list(range(len(samples)))}
    try:
        share = parse_budget(budget)
    except ValueError:
        raise EvalError(f"budget: {BUDGET_EXPECTED}, got {budget!r}") from None
    what = {"context": "context", "generated": "max_new_tokens"}.get(compress, "prompt")
    groups: dict[int | None, list[int]] = {}
    for i, (s, p) in enumerate(zip(samples, built)):
        tokens = compressed_tokens(compress, p, s.max_new_tokens)
        n = resolve_budget(share, tokens)
        if policy.evicts:
            try:
                policy.check_budget(n)
            except ValueError as e:
                raise EvalError(f"budget: {share} of sample {s.id!r} ({tokens} {what} tokens) is N={n}; "
                                f"{str(e).removeprefix('budget: ')}") from None
        groups.setdefault(n, []).append(i)
    return groups
