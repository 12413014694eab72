"""Capacity planning of a ragged batch (``Engine.generate_batch``): how many slots each layer's buffers need
over all of the batch's steps, allocated once, and the start states loaded into their rows.
"""
from __future__ import annotations

from kdeval.keydiff.batch_requests import Row
from kdeval.keydiff.kvstore import StoredBytes
from kdeval.keydiff.plan import Plan
from kdeval.keydiff.queries import QueryWindow
from kdeval.keydiff.ragged import RaggedCache
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


def load_states(cache: RaggedCache, states: list[PrefillState | None], rows: int, window: int | None) -> None:
    """Allocate the buffers for ``rows`` rows and copy every start state's valid tokens into its row (and its
    recent queries, for a policy that keeps ``window`` of them)."""
    if window is not None:
        cache.query_window = QueryWindow(window)
        for r, state in enumerate(states):
            cache.query_window.load_row(r, state.cache.query_window if state is not None else None, rows)
    first = next((s for s in states if s is not None and s.cache.length), None)
    if first is None:  # only empty states: the first forward allocates
        return
    for layer, src in zip(cache.layers, first.cache.layers):
        k, _, _ = src.view()
        v = src.values
        layer.allocate(rows, k.shape[1], k.shape[3], v.shape[3], k.dtype, k.device)
    for r, state in enumerate(states):
        if state is None or not state.cache.length:
            continue

        def layers(state=state):
            for src in state.cache.layers:
                k, p, st = src.view()
                yield k, src.values[:, :, : k.shape[2]], p, st

        cache.load_row(r, layers())
        if state.cache.kv_store is not None:  # its quantized tokens' record, as row r's
            if cache.kv_store is None:
                cache.kv_store = StoredBytes(len(cache.layers))
            cache.kv_store.load_row(r, state.cache.kv_store)


def ragged_cache(plan: Plan, rows: list[Row], starts: list[PrefillState | None], decode_evict: bool) -> RaggedCache:
    """The batch's cache: each layer's capacity planned for all of the batch's steps (one computation per distinct
    budget and row lengths), the start states' tokens loaded into their rows."""
    cache = RaggedCache(plan.num_layers, 1, plan.needs.token_state)
    budgets = plan.budgets or [None] * plan.num_layers
    cache.lengths = [[s.cache.layers[i].length if s is not None else 0 for s in starts] for i in range(len(budgets))]
    capacity: dict = {}
    for idx, (layer, budget, lengths) in enumerate(zip(cache.layers, budgets, cache.lengths)):
        key = (budget, plan.kind(idx), tuple(lengths))
        if key not in capacity:
            capacity[key] = layer_capacity(plan, idx, rows, lengths, decode_evict)
        layer.capacity = capacity[key]
    if any(s is not None for s in starts):
        load_states(cache, starts, len(rows), plan.needs.queries.window if plan.needs.queries is not None else None)
    return cache
