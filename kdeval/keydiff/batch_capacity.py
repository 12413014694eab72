"""Capacity planning of a ragged batch (``Engine.generate_batch``): how many slots each layer's buffers need
over all of the batch's steps, allocated once, with the start states in their rows.
"""
from __future__ import annotations

from kdeval.keydiff.batch_requests import Row
from kdeval.keydiff.cache import BudgetCache, row_length, rows_of
from kdeval.keydiff.plan import Plan
from kdeval.keydiff.state import PrefillState


def layer_capacity(plan: Plan, idx: int, rows: list[Row], lengths: list[int], decode_evict: bool) -> int:
    """Slots layer ``idx`` can need: over the batch's steps, the most a row holds before the step (where the
    step's columns land) plus the step's widest row (a row's ``j``-th step runs in the batch's ``j``-th forward);
    what a row holds after each step is the plan's one keep rule (:meth:`Plan.keep`)."""
    base: list[int] = []  # per forward: the most a row holds before it
    width: list[int] = []  # per forward: its widest row
    for row, n in zip(rows, lengths):
        held, seen = row.state.n_protected, row.state.seen
        steps = [(ids.shape[0], ev, pr) for ids, ev, pr in row.steps]
        steps += [(1, decode_evict, False)] * max(row.max_new - 1, 0)
        for j, (t, ev, pr) in enumerate(steps):
            if j == len(base):
                base.append(0)
                width.append(1)
            base[j], width[j] = max(base[j], n), max(width[j], t)
            seen += t
            n = plan.keep(idx, n, t, seen, ev, held)
            held += t if pr else 0
    return max(b + w for b, w in zip(base, width))


def batch_cache(plan: Plan, rows: list[Row], starts: list[PrefillState | None], decode_evict: bool) -> BudgetCache:
    """The batch's cache: each layer's capacity planned for all of the batch's steps (one computation per distinct
    budget and row lengths), each start state's tokens in its row (:func:`~kdeval.keydiff.cache.rows_of`)."""
    budgets = plan.budgets or [None] * plan.num_layers
    capacity: dict = {}
    capacities = []
    for idx, budget in enumerate(budgets):
        lengths = [row_length(s.cache.layers[idx], 0) if s is not None else 0 for s in starts]
        key = (budget, plan.kind(idx), tuple(lengths))
        if key not in capacity:
            capacity[key] = layer_capacity(plan, idx, rows, lengths, decode_evict)
        capacities.append(capacity[key])
    window = plan.needs.queries.window if plan.needs.queries is not None else None
    sources = [(s.cache, 0) if s is not None else None for s in starts]
    return rows_of(sources, capacities, plan.needs.token_state,
                   query_window=window if any(s is not None for s in starts) else None)
