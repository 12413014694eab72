"""Capacity planning, the one rule for how many slots an eager cache's layer allocates: enough for every step the
call will run, allocated once. ``Engine.prefill``/``generate`` plan a request alone (its rows share the steps),
``Engine.generate_batch`` a batch of rows of their own steps, with the start states' tokens in their rows. What a
row holds after each step is the plan's one keep rule (:meth:`Plan.keep`). The static layout of the graph path is
always ``N + B`` slots (kdeval/keydiff/plan/cache_maker.py); a later call that continues a state grows it when it must.
"""
from __future__ import annotations

from typing import Sequence

from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.cache.row_moves import row_length, rows_of
from kdeval.keydiff.loop.decoding import Request
from kdeval.keydiff.plan.plan import Plan
from kdeval.keydiff.loop.state import PrefillState


def forwards(request: Request, decode_evict: bool) -> list[tuple[int, bool, bool]]:
    """A request's forwards: ``(tokens, evicts, protects)`` per prompt step, then one decode step per generated
    token but the first (the prompt's last step gives it)."""
    steps = [(ids.shape[-1], ev, pr) for ids, ev, pr in request.steps]
    return steps + [(1, decode_evict, False)] * max(request.max_new - 1, 0)


def layer_capacity(plan: Plan, idx: int, rows: Sequence[list[tuple[int, bool, bool]]], lengths: Sequence[int],
                   seen: Sequence[int], held: Sequence[int]) -> int:
    """Slots layer ``idx`` can need for the forwards ``rows[r]`` of each row (:func:`forwards`), which holds
    ``lengths[r]`` tokens of the ``seen[r]`` it saw, ``held[r]`` of them protected: over the forwards, the most a
    row holds before one (where its columns land) plus its widest row (a row's ``j``-th step runs in the ``j``-th
    forward)."""
    base: list[int] = []  # per forward: the most a row holds before it
    width: list[int] = []  # per forward: its widest row
    for steps, n, s, h in zip(rows, lengths, seen, held):
        for j, (t, ev, pr) in enumerate(steps):
            if j == len(base):
                base.append(0)
                width.append(1)
            base[j], width[j] = max(base[j], n), max(width[j], t)
            s += t
            n = plan.keep(idx, n, t, s, ev, h)
            h += t if pr else 0
    return max((b + w for b, w in zip(base, width)), default=1)


def planned(plan: Plan, rows: Sequence[list[tuple[int, bool, bool]]], lengths: Sequence[Sequence[int]] | None = None,
            seen: Sequence[int] | None = None, held: Sequence[int] | None = None) -> list[int]:
    """Each layer's capacity (:func:`layer_capacity`; ``lengths[l]``: what the rows hold in layer ``l``, default
    nothing; ``seen``/``held`` default 0), computed once per distinct budget, kind and row lengths."""
    empty = [0] * len(rows)
    seen, held = seen or empty, held or empty
    budgets = plan.budgets or [None] * plan.num_layers
    memo: dict = {}
    out = []
    for idx, budget in enumerate(budgets):
        n = tuple(lengths[idx]) if lengths is not None else tuple(empty)
        key = (budget, plan.kind(idx), n)
        if key not in memo:
            memo[key] = layer_capacity(plan, idx, rows, n, seen, held)
        out.append(memo[key])
    return out


def batch_cache(plan: Plan, rows: list, starts: list[PrefillState | None], decode_evict: bool) -> BudgetCache:
    """A batch's cache (``rows``: its :class:`~kdeval.keydiff.batch.requests.Row`): each layer's capacity planned
    for all of the batch's steps, each start state's tokens in its row (:func:`~kdeval.keydiff.cache.row_moves.rows_of`)."""
    lengths = [[row_length(s.cache.layers[idx], 0) if s is not None else 0 for s in starts]
               for idx in range(plan.num_layers)]
    capacities = planned(plan, [forwards(row, decode_evict) for row in rows], lengths,
                         [row.state.seen for row in rows], [row.state.n_protected for row in rows])
    window = plan.needs.queries.window if plan.needs.queries is not None else None
    sources = [(s.cache, 0) if s is not None else None for s in starts]
    return rows_of(sources, capacities, plan.needs.token_state,
                   query_window=window if any(s is not None for s in starts) else None,
                   kinds=[plan.kind(i) for i in range(plan.num_layers)])
