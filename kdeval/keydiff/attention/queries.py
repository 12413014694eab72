"""Recent queries before RoPE, for policies that model the queries to come (ExpectedAttention).

A policy declares a :class:`QueryNeed`; only then does the engine capture, during each forward, every layer's
queries before RoPE (a forward hook on the attention's ``q_norm`` where the model has one, else ``q_proj``:
:func:`capture_queries`) and keep, per request and layer, the last ``window`` of them across chunks and decode
steps (:class:`QueryWindow`, held by the cache, so forks and batches carry it). Queries at positions below
``skip`` (attention-sink outliers) never enter the window. With one chunk covering the prompt and
``window >= prompt``, the window is the prompt's queries after the first ``skip``: kvpress' statistics window.

Each eviction step a policy then sees, per layer, :class:`RecentQueries`: the window and RoPE's ``cos``/``sin``
at the ``ahead`` positions after the step (the model's rotary embedding, its scaling included).

Shapes: ``queries [batch, q_heads, window, head_dim]``, right-aligned (row ``r``'s last ``count[r]`` entries are
its queries in position order, the others zero); ``count [batch]``; ``cos``/``sin [batch or 1, ahead, head_dim]``.
Everything stays on the device with fixed shapes: no host synchronisation per step.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from kdeval.keydiff.attention.layer_kinds import decoder_config


@dataclass(frozen=True)
class QueryNeed:
    """``window``: recent queries kept per layer; ``ahead``: look-ahead positions whose RoPE is passed; ``skip``:
    queries at positions ``< skip`` are left out."""

    window: int
    ahead: int
    skip: int = 0


@dataclass
class RecentQueries:
    """One layer's recent queries and the RoPE ahead, as a policy sees them (``ScoreContext.queries``)."""

    queries: torch.Tensor
    count: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def valid(self) -> torch.Tensor:
        """``[batch, window]`` True at the entries that hold a query."""
        return right_aligned(self.count, self.queries.shape[2])

    def last(self, seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The entries that hold queries in some row, ``[batch, q_heads, w, head_dim]``, and their absolute positions
        ``[batch, w]`` (``-1`` where a row holds none), the window ending at ``seen [batch or 1, 1]``."""
        width = self.queries.shape[2]
        w = int(self.count.max())  # right-aligned: the last w entries hold queries
        pos = (seen - w + torch.arange(w, device=self.queries.device)).expand(self.queries.shape[0], w)
        return self.queries[:, :, width - w:], torch.where(self.valid()[:, width - w:], pos, -1)


def right_aligned(count: torch.Tensor, width: int) -> torch.Tensor:
    """``[batch, width]`` True at the last ``count[r]`` entries of each row."""
    return torch.arange(width, device=count.device) >= (width - count).unsqueeze(-1)


class QueryWindow:
    """Per layer, the last ``window`` queries (before RoPE) of each row: ``[batch, q_heads, window, head_dim]``,
    right-aligned, and ``count [batch]`` (the same for every layer). Empty until the first :meth:`push`."""

    def __init__(self, window: int):
        self.window = window
        self.queries: dict[int, torch.Tensor] = {}
        self.count: torch.Tensor | None = None

    def push(self, new: dict[int, torch.Tensor], admit: torch.Tensor) -> None:
        """Append the step's queries ``new[layer] [batch, q_heads, T, head_dim]`` where ``admit [batch, T]`` (real
        tokens at positions ``>= skip``), keeping each row's last ``window`` in order."""
        w = self.window
        first = next(iter(new.values()))
        if self.count is None:
            self.count = torch.zeros(first.shape[0], dtype=torch.long, device=first.device)
        had = right_aligned(self.count, w)
        valid = torch.cat([had, admit], dim=1)  # [b, w + T]
        after = valid.flip(-1).cumsum(-1).flip(-1)  # valid entries at or after each one
        keep = valid & (after <= w)
        # a stable sort puts the kept entries last, in their order; the last w of it are the new window
        order = torch.sort(keep.to(torch.int8), dim=-1, stable=True).indices[:, -w:]  # [b, w]
        kept = keep.gather(1, order)
        for idx, q in new.items():
            old = self.queries.get(idx)
            if old is None:
                old = q.new_zeros(q.shape[0], q.shape[1], w, q.shape[3])
            both = torch.cat([old, q], dim=2)
            index = order.view(order.shape[0], 1, w, 1).expand(-1, q.shape[1], -1, q.shape[3])
            self.queries[idx] = both.gather(2, index) * kept.view(kept.shape[0], 1, w, 1).to(q.dtype)
        self.count = kept.sum(-1)

    def rows(self, index: torch.Tensor) -> "QueryWindow":
        """A window of the rows ``index [k]`` (in that order)."""
        out = QueryWindow(self.window)
        if self.count is not None:
            out.queries = {i: q.index_select(0, index) for i, q in self.queries.items()}
            out.count = self.count.index_select(0, index)
        return out

    def load_row(self, row: int, src: "QueryWindow | None", rows: int) -> None:
        """Copy the batch-1 window ``src`` (``None`` or empty: no queries) into row ``row`` of a ``rows``-row
        window, allocating it like ``src`` when empty."""
        if src is None or src.count is None:
            return
        if src.window != self.window:
            raise ValueError(f"states: its query window holds {src.window} queries, this policy keeps {self.window}")
        if self.count is None:
            self.count = torch.zeros(rows, dtype=torch.long, device=src.count.device)
            self.queries = {i: q.new_zeros(rows, *q.shape[1:]) for i, q in src.queries.items()}
        for i, q in src.queries.items():
            self.queries[i][row] = q[0]
        self.count[row] = src.count[0]


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each decoder layer's attention module, in layer order."""
    base = getattr(model, model.base_model_prefix, model)
    layers = getattr(base, "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise ValueError(f"model: policies that read queries need decoder layers with a self_attn module; "
                         f"{type(model).__name__} has none")
    return [layer.self_attn for layer in layers]


def query_sources(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int]]:
    """Per decoder layer, the module whose output is the queries before RoPE (``q_norm`` where the attention has
    one: Qwen3 and Gemma normalise the projected queries before RoPE; else ``q_proj``) and the head size."""
    out = []
    for idx, attn in enumerate(attention_modules(model)):
        head_dim = getattr(attn, "head_dim", None) or _head_dim(decoder_config(model.config))
        source = getattr(attn, "q_norm", None) or getattr(attn, "q_proj", None)
        if source is None:
            raise ValueError(f"model: layer {idx}'s attention has no q_proj to read the queries from")
        out.append((source, head_dim))
    return out


@contextlib.contextmanager
def capture_queries(model: torch.nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """While open, every forward of ``model`` stores each layer's queries before RoPE (:func:`query_sources`) in
    the yielded dict: ``{layer: [batch, q_heads, T, head_dim]}``."""
    out: dict[int, torch.Tensor] = {}
    hooks = []

    def hook(idx: int, head_dim: int):
        def store(module, args, output):
            b, t = output.shape[0], output.shape[1]
            out[idx] = output.reshape(b, t, -1, head_dim).transpose(1, 2)
        return store

    try:
        for idx, (source, head_dim) in enumerate(query_sources(model)):
            hooks.append(source.register_forward_hook(hook(idx, head_dim)))
        yield out
    finally:
        for h in hooks:
            h.remove()


def rotary_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """The model's rotary embedding module (``cos, sin = module(x, position_ids)``)."""
    base = getattr(model, model.base_model_prefix, model)
    rope = getattr(base, "rotary_emb", None)
    if rope is None:
        raise ValueError(f"model: {type(model).__name__} has no rotary embedding (rotary_emb) to rotate queries or "
                         f"keys with")
    return rope


def rope_ahead(model: torch.nn.Module, like: torch.Tensor, seen: int | torch.Tensor, ahead: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's ``cos``/``sin`` ``[batch or 1, ahead, head_dim]`` at positions ``seen .. seen + ahead - 1``
    (``seen``: an int, or ``[batch, 1, 1]`` per row), float32 or wider, from the model's rotary embedding."""
    steps = torch.arange(ahead, device=like.device)
    positions = (seen.view(-1, 1) + steps) if isinstance(seen, torch.Tensor) else (seen + steps).unsqueeze(0)
    dtype = torch.promote_types(like.dtype, torch.float32)
    return rotary_embedding(model)(like.to(dtype), positions)


@dataclass
class StepQueries:
    """A step's window (after its queries were pushed) and RoPE ahead, shared by the layers."""

    window: QueryWindow
    cos: torch.Tensor
    sin: torch.Tensor

    def layer(self, idx: int) -> RecentQueries:
        return RecentQueries(self.window.queries[idx], self.window.count, self.cos, self.sin)


def record_step(model: torch.nn.Module, need: QueryNeed, cache, captured: dict[int, torch.Tensor],
                positions: torch.Tensor, seen_after: int | torch.Tensor) -> StepQueries:
    """Push the step's ``captured`` queries into ``cache.query_window`` (created on first use) and compute RoPE
    ahead of ``seen_after``. ``positions [batch or 1, T]``: the step's positions (padding: past every real one)."""
    if cache.query_window is None:
        cache.query_window = QueryWindow(need.window)
    first = next(iter(captured.values()))
    admit = (positions >= need.skip).expand(first.shape[0], first.shape[2])
    if isinstance(seen_after, torch.Tensor):  # a ragged batch: padding positions are past every row's seen
        admit = admit & (positions < seen_after.view(-1, 1))
    cache.query_window.push(captured, admit)
    cos, sin = rope_ahead(model, first, seen_after, need.ahead)
    return StepQueries(cache.query_window, cos, sin)


def _head_dim(config) -> int:
    return config.hidden_size // config.num_attention_heads
