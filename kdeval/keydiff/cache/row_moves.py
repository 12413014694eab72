"""How a state moves between caches: rows copied into a new eager cache (a start state into a batch's row, a
finished batch row out as a state of its own, a fork), and a static-layout cache thawed into an eager one.
Every layer's arrangement moves its own way: an eager layer its kept tokens, a recurrent layer its states, a
layer that holds nothing of its own nothing; a quantized store its record and recent queries their window.
"""
from __future__ import annotations

from typing import Sequence

import torch

from kdeval.keydiff.attention.layer_kinds import LayerKind
from kdeval.keydiff.attention.queries import QueryWindow
from kdeval.keydiff.cache.budget_cache import BudgetCache, RowLayer, StateRowLayer
from kdeval.keydiff.cache.state_layer import RecurrentStates, StateLayer
from kdeval.keydiff.quant.store import StoredBytes


def row_length(layer, row: int) -> int:
    """Tokens ``layer`` holds in batch row ``row`` (an eager layer's own count; other layers hold one count)."""
    return layer.lengths[row] if isinstance(layer, RowLayer) else layer.length


def rows_of(sources: Sequence[tuple[BudgetCache, int] | None], capacities: Sequence[int],
            state_names: tuple[str, ...], limits: Sequence[int | None] | None = None,
            query_window: int | None = None, kinds: Sequence[LayerKind] | None = None) -> BudgetCache:
    """How a state moves between batches: a cache of eager layers whose row ``r`` holds copies of row
    ``sources[r][1]``'s kept tokens of cache ``sources[r][0]`` (``None``: an empty row): its keys, values,
    positions, per-token state, quantized record and recent queries (``query_window``: the window a policy keeps,
    made for a batch even where its sources have none yet). A start state enters a batch's row so, a finished
    row leaves as a state of its own, a static cache is thawed. ``capacities[l]``: slots of layer ``l`` (at least
    what a row holds); ``limits``: as :class:`RowLayer`'s; ``kinds``: the layers' kinds, which say where a layer
    holds recurrent states or nothing of its own (default: as the first source's layers)."""
    num_layers = len(capacities)
    limits = limits or [None] * num_layers
    known = next(src[0] for src in sources if src is not None) if any(sources) else None
    layers = [_row_layer_like(known.layers[i] if known is not None else None, kinds[i] if kinds else None, sources,
                              i, cap, lim, state_names) for i, (cap, lim) in enumerate(zip(capacities, limits))]
    out = BudgetCache(layers, state_names)
    for i, layer in enumerate(layers):
        if isinstance(layer, StateLayer):
            layer.copy_rows([(src[0].layers[i], src[1]) if src is not None else None for src in sources])
            continue
        if isinstance(layer, StateRowLayer):
            layer.copy_state_rows([(src[0].layers[i], src[1]) if src is not None else None for src in sources])
        held = [(src[0].layers[i], src[1]) for src in sources if src is not None]
        first = next((s for s in held if row_length(*s)), None)
        if first is None:  # only empty rows: the first forward allocates
            continue
        keys, _, _ = first[0].view()
        values = first[0].values
        layer.allocate(len(sources), keys.shape[1], keys.shape[3], values.shape[3], keys.dtype, keys.device)
        for r, src in enumerate(sources):
            if src is None:
                continue
            src_layer, s = src[0].layers[i], src[1]
            n = layer.lengths[r] = row_length(src_layer, s)
            k, p, st = src_layer.view()
            given = {"keys": k, "values": src_layer.values, "positions": p, **st}
            for name, buf in layer.slot_buffers.tensors.items():
                buf[r, :, :n] = given[name][s, :, :n]
        layer.base = layer.length
    _move_records(out, sources)
    _move_queries(out, sources, query_window)
    return out


def _row_layer_like(like, kind: LayerKind | None, sources, i: int, cap: int, lim: int | None,
                    state_names: tuple[str, ...]):
    """:func:`rows_of`'s layer ``i``: a recurrent layer's states, or nothing of its own (``like`` is a
    :class:`StateLayer`, or ``kind`` says so), or an eager layer of ``cap`` slots, room for what each source row
    holds (beside a hybrid layer's states)."""
    states = like.number_of_states if isinstance(like, RecurrentStates) else 1
    if isinstance(like, StateLayer) or (kind is not None and not kind.attends):
        return StateLayer(states, len(sources))
    held = [row_length(src[0].layers[i], src[1]) for src in sources if src is not None]
    if isinstance(like, StateRowLayer) or (kind is not None and kind.holds_state):
        return StateRowLayer(max([cap] + held), state_names, lim, len(sources), states)
    return RowLayer(max([cap] + held), state_names, lim, len(sources))


def _move_records(out: BudgetCache, sources: Sequence[tuple[BudgetCache, int] | None]) -> None:
    """:func:`rows_of`'s quantized records: a row leaving as a state of its own takes its row of the record (and
    its bytes), a one-row state entering a batch its whole record as its row."""
    stores = [(r, src[0], src[1]) for r, src in enumerate(sources) if src is not None and src[0].kv_store is not None]
    if not stores:
        return
    out.kv_store = StoredBytes(len(out.layers))
    for r, cache, s in stores:
        held = [row_length(layer, s) * layer.keys.shape[1] if layer.is_initialized and not isinstance(layer, StateLayer) else 0
                for layer in cache.layers]
        if len(sources) == 1:
            out.kv_store = cache.kv_store.row(s, held)
        else:
            first = cache.first_kv_layer
            rows = first.keys.shape[0] if first.is_initialized else 1
            out.kv_store.load_row(r, cache.kv_store if rows == 1 else cache.kv_store.row(s, held))


def _move_queries(out: BudgetCache, sources: Sequence[tuple[BudgetCache, int] | None],
                  window: int | None) -> None:
    """:func:`rows_of`'s recent queries: each row its source row's (``window``: the window a batch keeps; ``None``:
    a row leaving, or a cache without recent queries, thawed)."""
    windows = [src[0].query_window if src is not None else None for src in sources]
    if window is None and len(sources) == 1 and windows[0] is not None:  # a row leaving: its row of the window
        device = windows[0].count.device if windows[0].count is not None else None
        out.query_window = windows[0].rows(torch.tensor([sources[0][1]], device=device))
    elif window is not None:  # states entering a batch: each its one-row window (checked against the policy's)
        out.query_window = QueryWindow(window)
        for r, w in enumerate(windows):
            out.query_window.load_row(r, w, len(sources))


def thawed(cache: BudgetCache, capacity: int) -> BudgetCache:
    """A copy of the static-layout ``cache``'s valid tokens ``[0, length)`` in an eager cache with room for
    ``capacity`` tokens per layer (:func:`rows_of`): chunks land after the kept tokens and the buffers grow,
    so steps that do not evict can follow. ``cache`` is left as it is."""
    if cache.static_base is None:
        raise ValueError("thawed: only a static-layout cache is thawed")
    rows = cache.batch_size or 1
    out = rows_of([(cache, r) for r in range(rows)], [max(capacity, cache.length)] * len(cache.layers),
                  cache.state_names)
    out.owner, out.thawed_from = cache.owner, cache.static_base
    return out
