"""One adapter per cache layout: what a step feeds the model, and the layout's part of each layer's eviction.

The step (kdeval/keydiff/step/step.py) runs one forward for every layout and the evictor (kdeval/keydiff/step/eviction.py)
one per-layer loop of five moves; an adapter says what each move is in its layout:

- ``context(idx, reads)``: the keys the policy scores and their :class:`~kdeval.keydiff.policy.interface.ScoreContext`
  (positions, rows, state, and what else the policy reads, kdeval/keydiff/attention/reads.py);
- ``excess(idx)``: how many tokens to free (0: keep everything);
- ``select(idx, keys, ctx, k, selector)``: which (the one selector, kdeval/keydiff/policy/selection.py);
- ``freed(idx, selection, k)``: the selection as a merging policy reads it (:class:`~kdeval.keydiff.policy.interface.Freed`:
  the values, the freed slots, the kept ones), before the commit;
- ``commit(idx, selection or None)``: compact the layer (``None``: keep everything);
- ``kept(idx)``: the kept keys and positions, which a re-rotating policy rotates and a key-editing one edits;
- ``evicted_rows(idx)``: after the commit, the batch rows that freed tokens (``None``: every row);
- ``stored(idx)`` and ``seen_range(idx)``: the layer's held slots and the tokens seen before and after the step,
  which a quantized store (kdeval/keydiff/quant/store.py) quantizes and counts.

Layouts: :class:`RaggedLayout`, the eager cache of every request (a request alone is a batch of one row, rows
that share their positions a batch without padding, independent requests a ragged batch), and the two other
arrangements: :class:`StaticLayout` (the graph path's fixed shapes) and :class:`PoolLayout` (a head-shared pool,
AdaKV). :func:`step_layout` picks the layout of a step whose rows share their positions. Shapes as in
:mod:`kdeval.keydiff.policy.interface`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kdeval.keydiff.attention.capture import RAGGED_IMPL, STATIC_IMPL
from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.cache.headpool import HeadPoolCache, HeadTokens, select_across_heads
from kdeval.keydiff.quant.store import HeldSlots
from kdeval.keydiff.policy.interface import Freed, ScoreContext, held_tokens
from kdeval.keydiff.cache.ragged import RaggedStep, kept_mask
from kdeval.keydiff.attention.reads import StepReads
from kdeval.keydiff.policy.selection import Selector
from kdeval.keydiff.cache.slot_buffers import kept_but
from kdeval.keydiff.cache.static import static_inputs

if TYPE_CHECKING:
    from kdeval.keydiff.plan.plan import Plan

Ranges = tuple[tuple[int, int], ...]


def scored_keys(plan: "Plan", keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The keys a policy scores: the cached ones ``[b, h, n, d]``; under MLA (``plan.latent``) each token's whole
    cached row, its latent and its shared rotary key side by side (a copy ``[b, 1, n, rank + rope]``): the part of
    every head's key that carries the token's position, so one token id at two positions scores apart."""
    if not plan.latent:
        return keys
    return torch.cat([keys, values[:, :, : keys.shape[2]]], dim=-1)


def window_masks(plan: "Plan", cache: BudgetCache, positions: torch.Tensor) -> list[torch.Tensor | None]:
    """Per layer of a step whose rows share ``positions [t]``, a windowed layer's mask ``[1, 1, t, n + t]`` (True:
    visible) over its ``n`` cached tokens and the step's, by position (:meth:`LayerKind.visible`); ``None`` for a
    full layer (all of the cache, causal within the step). Layers of one kind hold the same positions: one mask
    serves them all."""
    q, t = positions.view(-1, 1), positions.shape[0]
    out, made = [], {}
    for idx, layer in enumerate(cache.layers):
        kind = plan.kind(idx)
        if not kind.windowed:
            out.append(None)
            continue
        if kind.reads_layer is not None:  # it attends over its source's keys: its source's mask
            out.append(out[kind.reads_layer])
            continue
        if (kind, layer.length) not in made:
            cached = layer.positions[0, 0, : layer.length] if layer.length else positions[:0]
            k = torch.cat([cached, positions]).view(1, -1)
            made[kind, layer.length] = ((k <= q) & kind.visible(k, q)).view(1, 1, t, -1)
        out.append(made[kind, layer.length])
    return out


def shared_inputs(plan: "Plan", cache: BudgetCache, positions: torch.Tensor, batch: int) -> dict:
    """The model's inputs besides the ids for a step whose rows share ``positions [t]``: RoPE positions ``[batch,
    t]`` (a re-rotating policy's start after the cached tokens) and, on a model with windowed layers, each layer's
    mask (:func:`window_masks`); attention is the model's own causal one over each layer's slots."""
    t = positions.shape[0]
    rope = positions
    if plan.rerotate:
        n = cache.length
        rope = torch.arange(n, n + t, device=positions.device)
    out = {"position_ids": rope.unsqueeze(0).expand(batch, t)}
    if plan.windowed:
        out["kdeval_layer_masks"] = window_masks(plan, cache, positions)
    return out


class SharedLayout:
    """What the layouts of the other arrangements share, a step of ``t`` tokens at absolute ``positions [t]``
    (every row the same): the static layout of the graph path (:class:`StaticLayout`) and a head-shared pool
    (:class:`PoolLayout`).

    ``seen_after``: tokens seen after the step (an int, or a 0-d device tensor under graphs); ``steps``: eviction
    steps before it; ``evict=False``: the policy observes and everything is kept; ``protected``: position ranges
    held on top of the budget."""

    def __init__(self, plan: "Plan", cache: BudgetCache, positions: torch.Tensor, seen_after: int | torch.Tensor,
                 steps: int, all_logits: bool = False, evict: bool = True, protected: Ranges = ()):
        self.plan, self.cache, self.positions = plan, cache, positions
        self.t = positions.shape[0]
        self.seen_after, self.steps, self.evict, self.protected = seen_after, steps, evict, protected
        self.held = held_tokens(protected)
        self.logits_to_keep = 0 if all_logits else 1
        self.query_positions = positions.unsqueeze(0)  # [1, t]
        self.num_layers = len(cache.layers)

    def begin(self) -> None:
        """Tell the cache where the step's tokens go (before the forward, or a replay, writes them)."""
        self.cache.begin_chunk(self.positions)

    def attention(self, impl: str | None) -> str | None:
        return impl

    def inputs(self, batch: int) -> dict:
        return shared_inputs(self.plan, self.cache, self.positions, batch)

    def kept(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, positions, _ = self.cache.layers[idx].view()
        return keys, positions

    def evicted_rows(self, idx: int) -> torch.Tensor | None:
        """Every row shares the step's positions: all of them freed tokens."""
        return None

    def seen_range(self, idx: int) -> tuple[int | torch.Tensor, int | torch.Tensor]:
        return self.seen_after - self.t, self.seen_after


class StaticLayout(SharedLayout):
    """The graph path's static layout (kdeval/keydiff/cache/static.py): every chunk is fed to the tail slots ``[N, N +
    t)`` under :func:`~kdeval.keydiff.cache.static.static_inputs`, and eviction frees exactly its ``t`` slots of the
    ``N + t``, the empty head slots first. It always evicts: a step that does not runs on an eager copy
    (``CacheMaker.make_room``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.empty = self.mask = None

    def begin(self) -> None:
        super().begin()
        self.empty, self.mask = static_inputs(self.cache.static_base, self.cache.length, self.t, self.seen_after,
                                              self.positions.device, self.plan.group)

    def attention(self, impl: str | None) -> str:
        return STATIC_IMPL

    def inputs(self, batch: int) -> dict:
        out = super().inputs(batch)
        if self.mask is not None:
            out["attention_mask"] = self.mask
        return out

    # ---------------------------------------------------------------- eviction, per layer

    def context(self, idx: int, reads: StepReads) -> tuple[torch.Tensor, ScoreContext]:
        layer = self.cache.layers[idx]
        keys, positions, state = layer.view()
        ctx = ScoreContext(idx, positions, self.seen_after, self.t, reads.attention(idx), state, self.steps)
        reads.fill(ctx, lambda: layer.values[:, :, : keys.shape[2]])
        return scored_keys(self.plan, keys, layer.values), ctx

    def excess(self, idx: int) -> int:
        if self.empty.room_slots is not None:
            return 0  # the chunk moves into the empty head slots (commit)
        return self.t

    def window_selection(self, idx: int, k: int) -> torch.Tensor:
        """A windowed layer's ``k`` oldest slots ``[b, h, k]`` (every row and head holds the same positions; the
        empty slots' positions sort last)."""
        _, positions, _ = self.cache.layers[idx].view()
        return positions.topk(k, dim=-1, largest=False).indices

    def select(self, idx: int, keys: torch.Tensor, ctx: ScoreContext, k: int, selector: Selector) -> torch.Tensor:
        return selector.free(keys, ctx, k, self.plan.budgets[idx], self.protected, empty=self.empty.mask)

    def freed(self, idx: int, drop: torch.Tensor, k: int) -> Freed:
        """``drop [b, h, k]``: the freed slots; the kept ones are the rest (the empty slots too)."""
        layer = self.cache.layers[idx]
        values = layer.values[:, :, : layer.view()[0].shape[2]]
        return Freed(values, drop, kept_but(drop, values.shape[2]))

    def commit(self, idx: int, drop: torch.Tensor | None) -> None:
        layer = self.cache.layers[idx]
        if drop is None and self.empty.room_slots is not None:
            layer.commit_into(self.empty.room_slots)  # the empty head slots take the whole chunk
        else:
            layer.evict(drop)

    def stored(self, idx: int) -> HeldSlots:
        """The layer's slots in use: the kept ones and, before the commit, the step's."""
        layer = self.cache.layers[idx]
        keys, positions, _ = layer.view()
        valid = torch.ones((), dtype=torch.bool, device=keys.device)
        return HeldSlots(keys, layer.values[:, :, : keys.shape[2]], positions, valid, num_heads=keys.shape[1])


class PoolLayout(SharedLayout):
    """A step on a head-shared pool (kdeval/keydiff/cache/headpool.py): the layer's ``H * (budget + held)`` best tokens
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
        """The pool's kept slots: ``H`` times the plan's keep rule for a head's share (the pool holds ``H *
        length`` tokens and the step's ``H * pending``)."""
        layer = self.cache.layers[idx]
        return layer.heads * self.plan.keep(idx, layer.length, layer.pending, self.seen_after, self.evict, self.held)

    def excess(self, idx: int) -> int:
        return self.cache.layers[idx].filled() - self._keep(idx)

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
    """A step on the engine's eager cache (kdeval/keydiff/cache/ragged.py), layer ``idx`` with its geometry
    ``layer_steps[idx]``: row ``r`` keeps ``step.keep[r]`` tokens in ``[0, keep[r])``, chosen as alone (its own
    ``protected[r]`` ranges raised), the empty and padding slots freed first; ``steps``: the rows' eviction steps
    before this one (an int when they agree, else ``[rows, 1, 1]``); ``all_logits``: the logits of every column.

    ``positions [T]``: the rows share the step's positions, their counts and their protected ranges (a request
    alone is a batch of one such row; ``Engine.generate``'s rows; a recording batch): no row has padding or empty
    slots, so the step runs under the model's own causal attention (the plan's attention function, no mask),
    the policy sees the host's ``seen`` as an int, and the selection frees the same ``k`` slots in every row.
    ``None``: rows of their own (a ragged batch): the step's masks, per-row ``seen``."""

    def __init__(self, plan: "Plan", cache: BudgetCache, layer_steps: list[RaggedStep], steps: int | torch.Tensor,
                 protected: list[list[tuple[int, int]]], all_logits: bool = False,
                 positions: torch.Tensor | None = None):
        self.plan, self.cache, self.layer_steps, self.steps, self.protected = plan, cache, layer_steps, steps, protected
        self.logits_to_keep = 0 if all_logits else 1
        self.positions = positions
        first = layer_steps[0]
        if positions is not None:
            self.seen_after = first.host_seen[0] + first.T
            self.query_positions = positions.unsqueeze(0)  # [1, T]
        else:
            self.seen_after = first.seen_after
            self.query_positions = first.cache_positions[:, 0]  # [rows, T] (padding: past every real position)
        self.num_layers = len(cache.layers)
        self.committed: set[int] = set()  # layers whose step is committed (stored() then reads the kept slots)
        self.drops: dict[int, torch.Tensor] = {}  # shared positions: each layer's freed slots [rows, h, k]

    @property
    def shared(self) -> bool:
        """The rows share their positions (class docstring)."""
        return self.positions is not None

    def begin(self) -> None:
        positions = self.positions.view(1, 1, -1) if self.shared else self.layer_steps[0].cache_positions
        self.cache.begin_step([s.base for s in self.layer_steps], positions)

    def attention(self, impl: str | None) -> str | None:
        return impl if self.shared else RAGGED_IMPL

    def inputs(self, batch: int) -> dict:
        """Each row's positions and the step's mask (one per layer when the layers' geometries differ); rows that
        share their positions: :func:`shared_inputs`."""
        if self.shared:
            return shared_inputs(self.plan, self.cache, self.positions, batch)
        step = self.layer_steps[0]
        masks = {id(s): s.mask() for s in self.layer_steps}
        out = {"position_ids": step.position_ids, "attention_mask": masks[id(step)]}
        if len(masks) > 1 or self.plan.windowed:
            windows: dict = {}  # layers of one kind and geometry hold the same positions: one mask
            for idx, s in enumerate(self.layer_steps):
                if self.plan.trims(idx) and (self.plan.kind(idx), id(s)) not in windows:
                    windows[self.plan.kind(idx), id(s)] = self._window_mask(idx, masks[id(s)])
            per_layer = [windows[self.plan.kind(idx), id(s)] if self.plan.trims(idx)
                         else masks[id(s)] for idx, s in enumerate(self.layer_steps)]
            for idx in range(len(per_layer)):  # a layer reading another's keys takes its source's mask
                source = self.plan.kind(idx).reads_layer
                if source is not None:
                    per_layer[idx] = per_layer[source]
            out["kdeval_layer_masks"] = per_layer
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
        seen = self.seen_after if self.shared else step.seen_after
        ctx = ScoreContext(idx, positions, seen, step.T, reads.attention(idx), state, self.steps)
        reads.fill(ctx, lambda: layer.values[:, :, : step.M])
        return scored_keys(self.plan, keys, layer.values), ctx

    def excess(self, idx: int) -> int:
        step = self.layer_steps[idx]
        return max(step.M - kept for kept in step.host_keep) if step.drops else 0

    def select(self, idx: int, keys: torch.Tensor, ctx: ScoreContext, k: int, selector: Selector) -> torch.Tensor:
        """→ the kept slots, ``[rows, h, M]`` bool."""
        step = self.layer_steps[idx]
        if self.shared:  # every slot holds a token and every row frees k
            drop = self.drops[idx] = selector.free(keys, ctx, k, self.plan.budgets[idx], self.protected[0])
            return kept_but(drop, step.M)
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
        if self.shared:
            return layer.positions[:, :, : step.M] >= self.plan.kind(idx).first_kept(self.seen_after)
        first = self.plan.kind(idx).first_kept(step.seen_after)  # [rows, 1, 1]
        return step.valid.unsqueeze(1) & (layer.positions[:, :, : step.M] >= first)

    def freed(self, idx: int, kept: torch.Tensor, k: int) -> Freed:
        """``kept [rows, h, M]``: the kept slots; a row's freed slots first in ``slots``, then (a row that frees
        fewer than ``k``) kept ones."""
        step = self.layer_steps[idx]
        if self.shared:
            slots = self.drops[idx]
        else:
            slots = torch.sort((~kept).to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :k]
        return Freed(self.cache.layers[idx].values[:, :, : step.M], slots, kept)

    def commit(self, idx: int, kept: torch.Tensor | None) -> None:
        self.committed.add(idx)
        self.cache.layers[idx].keep_slots(kept, self.layer_steps[idx])

    def kept(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer, n = self.cache.layers[idx], max(self.layer_steps[idx].host_keep)
        return layer.keys[:, :, :n], layer.positions[:, :, :n]

    def evicted_rows(self, idx: int) -> torch.Tensor | None:
        """``[rows]`` bool: the rows whose real tokens outnumbered their ``keep[r]`` (``None``: every row)."""
        step = self.layer_steps[idx]
        freed = [k < n + t for k, n, t in zip(step.host_keep, step.host_n, step.host_t)]
        return None if all(freed) else torch.tensor(freed, device=step.device)

    def stored(self, idx: int) -> HeldSlots:
        """Each row's real slots: before the commit the step's ``[0, M)`` less empty and padding slots, after it
        ``[0, keep[r])`` (the commit sets ``committed``)."""
        layer, step = self.cache.layers[idx], self.layer_steps[idx]
        m = max(step.host_keep) if idx in self.committed else step.M
        if self.shared:
            valid = torch.ones((), dtype=torch.bool, device=layer.keys.device)
        elif idx in self.committed:
            valid = (torch.arange(m, device=step.device).view(1, -1) < step.keep.view(-1, 1)).unsqueeze(1)
        else:
            valid = step.valid.unsqueeze(1)
        return HeldSlots(layer.keys[:, :, :m], layer.values[:, :, :m], layer.positions[:, :, :m], valid,
                         num_heads=layer.keys.shape[1])

    def seen_range(self, idx: int) -> tuple[int | torch.Tensor, int | torch.Tensor]:
        if self.shared:
            return self.seen_after - self.layer_steps[idx].T, self.seen_after
        step = self.layer_steps[idx]
        return step.seen_after - step.t.view(-1, 1, 1), step.seen_after


def step_layout(plan: "Plan", cache: BudgetCache, rows: int, positions: torch.Tensor, seen_after: int | torch.Tensor,
                steps: int, all_logits: bool = False, evict: bool = True, protected: Ranges = ()
                ) -> StaticLayout | PoolLayout | RaggedLayout:
    """The layout of a step of ``t`` tokens at ``positions [t]`` in ``rows`` rows that share them (a request alone,
    ``Engine.generate``'s rows, a recording batch): a head-shared pool's, the static layout's, else the eager
    cache's as rows that share their positions (:class:`RaggedLayout`)."""
    if isinstance(cache, HeadPoolCache):
        return PoolLayout(plan, cache, positions, seen_after, steps, all_logits, evict, protected)
    if cache.static_base is not None:
        return StaticLayout(plan, cache, positions, seen_after, steps, all_logits, evict, protected)
    t = positions.shape[0]
    seen = int(seen_after) - t
    held = held_tokens(protected)
    lengths = [[layer.length] * rows for layer in cache.layers]
    geometry = plan.layer_steps(lengths, [t] * rows, [seen] * rows, [evict] * rows, [held] * rows)
    return RaggedLayout(plan, cache, geometry, steps, [list(protected)] * rows, all_logits, positions)


#: any layout a step runs on
Layout = StaticLayout | PoolLayout | RaggedLayout
