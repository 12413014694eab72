"""One adapter per cache layout: what a step feeds the model, and the layout's part of each layer's eviction.

The step (kdeval/keydiff/step.py) runs one forward for every layout and the evictor (kdeval/keydiff/eviction.py)
one per-layer loop of five moves; an adapter says what each move is in its layout:

- ``context(idx, reads)``: the keys the policy scores and their :class:`~kdeval.keydiff.policy.ScoreContext`
  (positions, rows, state, and what else the policy reads, kdeval/keydiff/reads.py);
- ``excess(idx)``: how many tokens to free (0: keep everything);
- ``select(idx, keys, ctx, k, selector)``: which (the one selector, kdeval/keydiff/selection.py);
- ``freed(idx, selection, k)``: the selection as a merging policy reads it (:class:`~kdeval.keydiff.policy.Freed`:
  the values, the freed slots, the kept ones), before the commit;
- ``commit(idx, selection or None)``: compact the layer (``None``: keep everything);
- ``kept(idx)``: the kept keys and positions, which a re-rotating policy rotates and a key-editing one edits;
- ``evicted_rows(idx)``: after the commit, the batch rows that freed tokens (``None``: every row);
- ``stored(idx)`` and ``seen_range(idx)``: the layer's held slots and the tokens seen before and after the step,
  which a quantized store (kdeval/keydiff/kvstore.py) quantizes and counts.

Layouts: :class:`SlotLayout` (the uniform and per-layer slot caches, the static layout of the graph path, a
test's gather store), :class:`PoolLayout` (a head-shared pool, AdaKV) and :class:`RaggedLayout` (a batch of
independent requests). Shapes as in :mod:`kdeval.keydiff.policy`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.attention_capture import RAGGED_IMPL, STATIC_IMPL
from kdeval.keydiff.cache import BudgetCache
from kdeval.keydiff.headpool import HeadPoolCache, HeadTokens, select_across_heads
from kdeval.keydiff.kvstore import HeldSlots
from kdeval.keydiff.policy import Freed, ScoreContext, held_tokens
from kdeval.keydiff.ragged import RaggedStep, clear_past, compact_rows, kept_mask
from kdeval.keydiff.reads import StepReads
from kdeval.keydiff.selection import Selector
from kdeval.keydiff.static import static_inputs

if TYPE_CHECKING:
    from kdeval.keydiff.plan import Plan

Ranges = tuple[tuple[int, int], ...]


def scored_keys(plan: "Plan", keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The keys a policy scores: the cached ones ``[b, h, n, d]``; under MLA (``plan.latent``) each token's whole
    cached row, its latent and its shared rotary key side by side (a copy ``[b, 1, n, rank + rope]``): the part of
    every head's key that carries the token's position, so one token id at two positions scores apart."""
    if not plan.latent:
        return keys
    return torch.cat([keys, values[:, :, : keys.shape[2]]], dim=-1)


class SlotLayout:
    """A step of ``t`` tokens at absolute ``positions [t]`` on a slot cache (every row the same positions).

    ``seen_after``: tokens seen after the step (an int, or a 0-d device tensor under graphs); ``steps``: eviction
    steps before it; ``evict=False``: the policy observes and everything is kept; ``protected``: position ranges
    held on top of the budget. A static-layout cache feeds its chunk to the tail slots under
    :func:`~kdeval.keydiff.static.static_inputs`."""

    def __init__(self, plan: "Plan", cache: BudgetCache, positions: torch.Tensor, seen_after: int | torch.Tensor,
                 steps: int, all_logits: bool = False, evict: bool = True, protected: Ranges = ()):
        self.plan, self.cache, self.positions = plan, cache, positions
        self.t = positions.shape[0]
        self.seen_after, self.steps, self.evict, self.protected = seen_after, steps, evict, protected
        self.held = held_tokens(protected)
        self.logits_to_keep = 0 if all_logits else 1
        self.query_positions = positions.unsqueeze(0)  # [1, t]
        self.num_layers = len(cache.layers)
        self.empty = self.mask = None

    def begin(self) -> None:
        """Tell the cache where the step's tokens go (before the forward, or a replay, writes them)."""
        self.cache.begin_chunk(self.positions)
        if self.cache.static_base is not None:
            self.empty, self.mask = static_inputs(self.cache.static_base, self.cache.length, self.t, self.seen_after,
                                                  self.positions.device, self.plan.group)

    def attention(self, impl: str | None) -> str | None:
        """The attention implementation the step runs under (``impl``: the plan's, for a dynamic cache)."""
        return STATIC_IMPL if self.cache.static_base is not None else impl

    def inputs(self, batch: int) -> dict:
        """The model's inputs besides the ids: RoPE positions ``[batch, t]`` (a re-rotating policy's start after
        the cached tokens) and the static layout's mask while its head fills."""
        rope = self.positions
        if self.plan.rerotate:
            n = self.cache.length
            rope = torch.arange(n, n + self.t, device=self.positions.device)
        out = {"position_ids": rope.unsqueeze(0).expand(batch, self.t)}
        if self.mask is not None:
            out["attention_mask"] = self.mask
        if self.plan.windowed:
            out["kdeval_layer_masks"] = self._window_masks()
        return out

    def _window_masks(self) -> list[torch.Tensor | None]:
        """Per layer, a windowed layer's mask ``[1, 1, t, n + t]`` (True: visible) over its ``n`` cached tokens
        and the step's, by position (:meth:`LayerKind.visible`); ``None`` for a full layer (all of the cache,
        causal within the step). Layers of one kind hold the same positions: one mask serves them all."""
        q = self.positions.view(-1, 1)
        out, made = [], {}
        for idx, layer in enumerate(self.cache.layers):
            kind = self.plan.kind(idx)
            if not kind.windowed:
                out.append(None)
                continue
            if (kind, layer.length) not in made:
                cached = layer.positions[0, 0, : layer.length] if layer.length else self.positions[:0]
                k = torch.cat([cached, self.positions]).view(1, -1)
                made[kind, layer.length] = ((k <= q) & kind.visible(k, q)).view(1, 1, self.t, -1)
            out.append(made[kind, layer.length])
        return out

    # ---------------------------------------------------------------- eviction, per layer

    def context(self, idx: int, reads: StepReads) -> tuple[torch.Tensor, ScoreContext]:
        layer = self.cache.layers[idx]
        keys, positions, state = layer.view()
        ctx = ScoreContext(idx, positions, self.seen_after, self.t, reads.attention(idx), state, self.steps)
        reads.fill(ctx, lambda: layer.values[:, :, : keys.shape[2]])
        return scored_keys(self.plan, keys, layer.values), ctx

    def excess(self, idx: int) -> int:
        layer = self.cache.layers[idx]
        if self.empty is not None:  # the static layout: N + t slots scored, the empty ones freed first
            if self.empty.room_slots is not None:
                return 0  # the chunk moves into the empty head slots (commit)
            return self.t if self.evict else 0
        n, t = layer.length, layer.pending
        return n + t - self.plan.keep(idx, n, t, self.seen_after, self.evict, self.held)

    def window_selection(self, idx: int, k: int) -> torch.Tensor:
        """A windowed layer's ``k`` oldest slots ``[b, h, k]`` (every row and head holds the same positions)."""
        _, positions, _ = self.cache.layers[idx].view()
        return positions.topk(k, dim=-1, largest=False).indices

    def select(self, idx: int, keys: torch.Tensor, ctx: ScoreContext, k: int, selector: Selector) -> torch.Tensor:
        empty = self.empty.mask if self.empty is not None else None
        return selector.free(keys, ctx, k, self.plan.budgets[idx], self.protected, empty=empty)

    def freed(self, idx: int, drop: torch.Tensor, k: int) -> Freed:
        """``drop [b, h, k]``: the freed slots; the kept ones are the rest (the static layout's empty slots too)."""
        layer = self.cache.layers[idx]
        values = layer.values[:, :, : layer.view()[0].shape[2]]
        kept = torch.ones(values.shape[:3], dtype=torch.bool, device=drop.device).scatter_(-1, drop, False)
        return Freed(values, drop, kept)

    def commit(self, idx: int, drop: torch.Tensor | None) -> None:
        layer = self.cache.layers[idx]
        if drop is None and self.empty is not None and self.empty.room_slots is not None:
            layer.commit_into(self.empty.room_slots)  # the empty head slots take the whole chunk
        else:
            layer.evict(drop)

    def kept(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, positions, _ = self.cache.layers[idx].view()
        return keys, positions

    def evicted_rows(self, idx: int) -> torch.Tensor | None:
        """Every row shares the step's positions: all of them freed tokens."""
        return None

    def stored(self, idx: int) -> HeldSlots:
        """The layer's slots in use: the kept ones and, before the commit, the step's."""
        layer = self.cache.layers[idx]
        keys, positions, _ = layer.view()
        valid = torch.ones((), dtype=torch.bool, device=keys.device)
        return HeldSlots(keys, layer.values[:, :, : keys.shape[2]], positions, valid, num_heads=keys.shape[1])

    def seen_range(self, idx: int) -> tuple[int | torch.Tensor, int | torch.Tensor]:
        return self.seen_after - self.t, self.seen_after


class PoolLayout(SlotLayout):
    """A step on a head-shared pool (kdeval/keydiff/headpool.py): the layer's ``H * (budget + held)`` best tokens
    kept across its KV heads, scored over each head's tokens regrouped (:class:`HeadTokens`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.heads: dict[int, HeadTokens] = {}

    def inputs(self, batch: int) -> dict:
        return {**super().inputs(batch), "kdeval_pool": self.cache}  # its attention masks by the slots' tags

    def context(self, idx: int, reads: StepReads) -> tuple[torch.Tensor, ScoreContext]:
        layer = self.cache.layers[idx]
        heads = self.heads[idx] = HeadTokens(layer, self.seen_after)
        rows = reads.attention(idx)
        ctx = ScoreContext(idx, heads.positions, self.seen_after, self.t, None if rows is None else heads.take(rows),
                           {}, self.steps)
        reads.fill(ctx, lambda: heads.values(layer))
        return heads.keys, ctx

    def _keep(self, idx: int) -> int:
        return self.cache.layers[idx].heads * (self.plan.budgets[idx] + self.held)

    def excess(self, idx: int) -> int:
        filled, keep = self.cache.layers[idx].filled(), self._keep(idx)
        return filled - keep if self.evict and filled > keep else 0

    def select(self, idx: int, keys: torch.Tensor, ctx: ScoreContext, k: int, selector: Selector) -> torch.Tensor:
        budget, heads = self.plan.budgets[idx], self.heads[idx]
        scores = selector.scores(keys, ctx, budget, self.protected)
        kept = select_across_heads(scores, heads.positions, heads.valid, selector.policy.head_safeguard(budget),
                                   self._keep(idx))
        return heads.kept_slots(kept)

    def freed(self, idx: int, kept: torch.Tensor, k: int) -> Freed:
        raise ValueError("a head-shared pool does not merge freed tokens (the plan refuses it)")

    def commit(self, idx: int, kept: torch.Tensor | None) -> None:
        self.cache.layers[idx].commit(kept)

    def stored(self, idx: int) -> HeldSlots:
        """The pool's filled slots ``[b, 1, slots, d]``, each with its KV head's tag."""
        layer = self.cache.layers[idx]
        keys, positions, _ = layer.view()
        m = keys.shape[2]
        valid = torch.ones((), dtype=torch.bool, device=keys.device)
        return HeldSlots(keys, layer.values[:, :, :m], positions, valid, layer.tags[:, :, :m], layer.heads)


class RaggedLayout:
    """A step of a ragged batch on the eager cache (kdeval/keydiff/ragged.py), layer ``idx`` with its geometry
    ``layer_steps[idx]``: row ``r`` keeps ``step.keep[r]`` tokens in ``[0, keep[r])``, chosen as at batch 1 (its
    own ``protected[r]`` ranges raised), the empty and padding slots freed first; ``steps``: the rows' eviction
    steps before this one (an int when they agree, else ``[rows, 1, 1]``)."""

    logits_to_keep = 1

    def __init__(self, plan: "Plan", cache: BudgetCache, layer_steps: list[RaggedStep], steps: int | torch.Tensor,
                 protected: list[list[tuple[int, int]]]):
        self.plan, self.cache, self.layer_steps, self.steps, self.protected = plan, cache, layer_steps, steps, protected
        first = layer_steps[0]
        self.seen_after = first.seen_after
        self.query_positions = first.cache_positions[:, 0]  # [rows, T] (padding: past every real position)
        self.num_layers = len(cache.layers)
        self.committed: set[int] = set()  # layers whose step is committed (stored() then reads the kept slots)

    def begin(self) -> None:
        self.cache.begin_step([s.base for s in self.layer_steps], self.layer_steps[0].cache_positions)

    def attention(self, impl: str | None) -> str:
        return RAGGED_IMPL

    def inputs(self, batch: int) -> dict:
        """Each row's positions and the step's mask (one per layer when the layers' geometries differ)."""
        step = self.layer_steps[0]
        masks = {id(s): s.mask() for s in self.layer_steps}
        out = {"position_ids": step.position_ids, "attention_mask": masks[id(step)]}
        if len(masks) > 1 or self.plan.windowed:
            windows: dict = {}  # layers of one kind and geometry hold the same positions: one mask
            for idx, s in enumerate(self.layer_steps):
                if self.plan.trims(idx) and (self.plan.kind(idx), id(s)) not in windows:
                    windows[self.plan.kind(idx), id(s)] = self._window_mask(idx, masks[id(s)])
            out["kdeval_layer_masks"] = [windows[self.plan.kind(idx), id(s)] if self.plan.trims(idx)
                                         else masks[id(s)] for idx, s in enumerate(self.layer_steps)]
        return out

    def _window_mask(self, idx: int, mask: torch.Tensor) -> torch.Tensor:
        """A windowed layer's step mask: ``mask [rows, 1, T, M]`` and what its kind lets each query see, by the
        positions of the row's cached slots and of the step's (a padding query still sees its own slot)."""
        step, kind = self.layer_steps[idx], self.plan.kind(idx)
        cached = self.cache.layers[idx].positions[:, 0, : step.base] if step.base else step.cache_positions[:, 0, :0]
        k = torch.cat([cached, step.cache_positions[:, 0]], dim=-1).unsqueeze(1)  # [rows, 1, M]
        q = step.cache_positions[:, 0].unsqueeze(-1)  # [rows, T, 1]
        return mask & kind.visible(k, q).unsqueeze(1)

    def context(self, idx: int, reads: StepReads) -> tuple[torch.Tensor, ScoreContext]:
        layer, step = self.cache.layers[idx], self.layer_steps[idx]
        keys, positions, state = layer.view(step.M)
        ctx = ScoreContext(idx, positions, step.seen_after, step.T, reads.attention(idx), state, self.steps)
        reads.fill(ctx, lambda: layer.values[:, :, : step.M])
        return scored_keys(self.plan, keys, layer.values), ctx

    def excess(self, idx: int) -> int:
        step = self.layer_steps[idx]
        return max(step.M - kept for kept in step.host_keep) if step.drops else 0

    def select(self, idx: int, keys: torch.Tensor, ctx: ScoreContext, k: int, selector: Selector) -> torch.Tensor:
        """→ the kept slots, ``[rows, h, M]`` bool."""
        step = self.layer_steps[idx]
        tail = keys[:, :, step.base : step.M]
        tail.masked_fill_(step.pad[:, step.base :].view(step.rows, 1, step.T, 1), 0)  # zero keys: no anchor
        # eager (a ragged batch's shapes change every step); the row's own protected ranges
        order = selector.free(keys, ctx, k, self.plan.budgets[idx], self.protected, per_row=True,
                              empty=~step.valid.unsqueeze(1), sorted=True)
        return kept_mask(order, (step.M - step.keep).view(-1, 1, 1), step.M)

    def window_selection(self, idx: int, k: int) -> torch.Tensor:
        """A windowed layer's kept slots ``[rows, h, M]``: each row's real slots from the oldest position its next
        query sees on."""
        step, layer = self.layer_steps[idx], self.cache.layers[idx]
        first = self.plan.kind(idx).first_kept(step.seen_after)  # [rows, 1, 1]
        return step.valid.unsqueeze(1) & (layer.positions[:, :, : step.M] >= first)

    def freed(self, idx: int, kept: torch.Tensor, k: int) -> Freed:
        """``kept [rows, h, M]``: the kept slots; a row's freed slots first in ``slots``, then (a row that frees
        fewer than ``k``) kept ones."""
        step = self.layer_steps[idx]
        slots = torch.sort((~kept).to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :k]
        return Freed(self.cache.layers[idx].values[:, :, : step.M], slots, kept)

    def commit(self, idx: int, kept: torch.Tensor | None) -> None:
        layer, step = self.cache.layers[idx], self.layer_steps[idx]
        self.committed.add(idx)
        if not step.in_place:  # in place: every row filled the whole step after a full-length head, kept all
            if kept is None:
                kept = step.valid.unsqueeze(1).expand(-1, layer.keys.shape[1], -1)
            compact_rows(layer.buffers(), kept, step.keep, step.movers)
            clear_past(layer.keys, layer.positions, step.keep, min(step.host_keep), step.M)
        layer.settle(step.host_keep)

    def kept(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer, n = self.cache.layers[idx], max(self.layer_steps[idx].host_keep)
        return layer.keys[:, :, :n], layer.positions[:, :, :n]

    def evicted_rows(self, idx: int) -> torch.Tensor | None:
        """``[rows]`` bool: the rows whose real tokens outnumbered their ``keep[r]`` (``None``: every row)."""
        step = self.layer_steps[idx]
        freed = [k < n + t for k, n, t in zip(step.host_keep, step.host_n, step.host_t)]
        return None if all(freed) else torch.tensor(freed, device=step.keep.device)

    def stored(self, idx: int) -> HeldSlots:
        """Each row's real slots: before the commit the step's ``[0, M)`` less empty and padding slots, after it
        ``[0, keep[r])`` (the commit sets ``committed``)."""
        layer, step = self.cache.layers[idx], self.layer_steps[idx]
        if idx in self.committed:
            m = max(step.host_keep)
            valid = (torch.arange(m, device=step.keep.device).view(1, -1) < step.keep.view(-1, 1)).unsqueeze(1)
        else:
            m, valid = step.M, step.valid.unsqueeze(1)
        return HeldSlots(layer.keys[:, :, :m], layer.values[:, :, :m], layer.positions[:, :, :m], valid,
                         num_heads=layer.keys.shape[1])

    def seen_range(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.layer_steps[idx]
        return step.seen_after - step.t.view(-1, 1, 1), step.seen_after


def slot_layout(plan: "Plan", cache: BudgetCache, *args, **kwargs) -> SlotLayout:
    """The adapter of a batch-1 (or shared-positions) cache: a pool's or a slot cache's."""
    return (PoolLayout if isinstance(cache, HeadPoolCache) else SlotLayout)(plan, cache, *args, **kwargs)
