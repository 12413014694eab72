"""The repeat pass's forward (kdeval/keydiff/attention/repeat_prompt.py): the repeat prompt over the cache a step left, scoring the
step's chunk by the attention its reconstruction pays it, the cache left as it was.

Per batch row and piece (:class:`~kdeval.keydiff.attention.repeat_prompt.Piece`), the model's base runs ``q`` repeat tokens at
positions ``seen_after .. seen_after + q - 1`` over a cache of :class:`ReadOnlyLayer`\\ s holding the row's cached
keys and values: each layer attends to them and to the repeat's own keys as usual (SDPA, the output unchanged),
but the repeat's keys and values are returned to attention and never stored, so nothing is left to discard. Beside
SDPA, under the implementation ``kdeval_repeat`` (:func:`repeat_attention_forward`), each layer computes for its
KV head ``h`` and the piece's cached tokens ``j`` (kvpress' ``KVzipPress`` rule)::

    score[h, j] = max over the query heads of h and the q repeat queries of
                  softmax(q . k / sqrt(d)) over {the first `sinks` positions, the piece's tokens, the repeat's own
                  keys (causal)} at j

in float32 or wider. A chunk's columns outside every piece (the chat template's head) score 0.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from kdeval.keydiff.attention.functions import additive_mask, attention_implementation
from kdeval.keydiff.cache.budget_cache import BudgetCache
from kdeval.keydiff.attention.repeat_prompt import Piece, RepeatInput, RepeatNeed, RepeatProgress, RepeatPrompt, pieces

REPEAT_IMPL = "kdeval_repeat"


class ReadOnlyLayer(DynamicLayer):
    """A cache layer over ``keys``/``values [1, kv_heads, S, d]`` (not copied) that a forward reads and never
    writes: :meth:`update` returns the held tokens followed by the step's, and keeps only the held."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return torch.cat([self.keys, key_states], dim=-2), torch.cat([self.values, value_states], dim=-2)


class PieceScores:
    """One piece's scores per layer (module docstring): ``sink_slots[layer] [1, kv_heads, sinks]`` (the cached
    slots of the first positions), the piece's cached slots ``[lo, hi)``; :attr:`by_layer`: ``[1, kv_heads, hi - lo]``."""

    def __init__(self, sink_slots: list[torch.Tensor], lo: int, hi: int):
        self.sink_slots, self.lo, self.hi = sink_slots, lo, hi
        self.by_layer: dict[int, torch.Tensor] = {}

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
        """``query [1, hq, q, d]`` (rotated), ``key [1, hk, S + q, d]`` (the cached slots, then the repeat's)."""
        q, hk = query.shape[2], key.shape[1]
        group = query.shape[1] // hk
        sinks = self.sink_slots[layer_idx]
        s, n = sinks.shape[-1], self.hi - self.lo
        held = key.shape[2] - q
        sink_keys = key[:, :, :held].gather(2, sinks.unsqueeze(-1).expand(-1, -1, -1, key.shape[-1]))
        sub = torch.cat([sink_keys, key[:, :, self.lo : self.hi], key[:, :, held:]], dim=2)  # [1, hk, s + n + q, d]
        dtype = torch.promote_types(query.dtype, torch.float32)
        own = torch.ones(q, q, dtype=torch.bool, device=query.device).triu(1)  # a repeat query sees its past only
        out = torch.empty(1, hk, n, dtype=dtype, device=query.device)
        for h in range(hk):
            logits = query[0, h * group : (h + 1) * group].to(dtype) @ sub[0, h].to(dtype).transpose(0, 1) * scale
            logits[..., s + n :].masked_fill_(own, float("-inf"))  # [group, q, s + n + q]
            out[0, h] = logits.softmax(-1)[..., s : s + n].amax(dim=(0, 1))
        self.by_layer[layer_idx] = out


def repeat_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA's output, and the piece's scores of a ``kdeval_repeat=`` :class:`PieceScores` beside it."""
    scores: PieceScores | None = kwargs.pop("kdeval_repeat", None)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if scores is not None:
        scores.record(module.layer_idx, query, key, scaling if scaling is not None else query.shape[-1] ** -0.5)
    return out


AttentionInterface.register(REPEAT_IMPL, repeat_attention_forward)
AttentionMaskInterface.register(REPEAT_IMPL, additive_mask)


class RepeatPass:
    """Runs one policy's repeat passes on one model (module docstring)."""

    def __init__(self, model: torch.nn.Module, need: RepeatNeed, prompt: RepeatPrompt):
        self.model, self.need, self.prompt = model, need, prompt
        self.base = getattr(model, model.base_model_prefix, model)

    def progress(self, rows: int, device: torch.device) -> RepeatProgress:
        """A fresh request's progress: nothing reconstructed, nothing fed."""
        return RepeatProgress([0] * rows, torch.empty(rows, 0, dtype=torch.long, device=device))

    def prepare(self, progress: RepeatProgress, ids: torch.Tensor, p0: int, seen_after: int) -> RepeatInput:
        """The pieces of a step of ``ids [rows, t]`` at positions ``p0 ..`` (``progress`` updated as reconstructed)."""
        step = RepeatInput(ids, p0, seen_after)
        for r in range(ids.shape[0]):
            row = pieces(self.prompt, self.need, ids[r], p0, progress.done[r], progress.tail[r])
            progress.done[r] += sum(p.e - p.a for p in row)
            step.rows.append(row)
        return step

    @torch.inference_mode()
    def scores(self, cache: BudgetCache, step: RepeatInput) -> dict[int, torch.Tensor]:
        """Per layer, ``[rows, kv_heads, t]``: the scores of the step's chunk, the last ``t`` slots of each layer of
        ``cache`` (which holds the chunk after the step's forward, before its eviction)."""
        t = step.ids.shape[1]
        rows = []
        for r, row in enumerate(step.rows):
            held = []
            for layer in cache.layers:
                keys, positions, _ = layer.view()
                held.append((keys[r : r + 1], layer.values[r : r + 1, :, : keys.shape[2]], positions[r : r + 1]))
            out = [torch.zeros(1, k.shape[1], t, dtype=torch.promote_types(k.dtype, torch.float32), device=k.device)
                   for k, _, _ in held]
            for piece in row:
                self._piece(piece, held, t, step.seen_after, out)
            rows.append(out)
        return {idx: torch.cat([row[idx] for row in rows]) for idx in range(len(cache.layers))}

    def _piece(self, piece: Piece, held: list, t: int, seen_after: int, out: list[torch.Tensor]) -> None:
        """One repeat forward of one row (``held[layer]``: its keys, values ``[1, hk, S, d]``, positions
        ``[1, hk, S]``), fed from position ``seen_after``; its scores written into ``out[layer][..., piece.a :
        piece.e]``."""
        m = held[0][0].shape[2]
        sinks = [pos.argsort(dim=-1)[..., : piece.sinks] for _, _, pos in held]  # the first positions' slots
        scores = PieceScores(sinks, m - t + piece.a, m - t + piece.e)
        cache = Cache(layers=[ReadOnlyLayer(k, v) for k, v, _ in held])
        q = piece.ids.shape[0]
        at = torch.arange(seen_after, seen_after + q, device=piece.ids.device).unsqueeze(0)
        with attention_implementation(self.model, REPEAT_IMPL):
            self.base(input_ids=piece.ids.unsqueeze(0), past_key_values=cache, position_ids=at, use_cache=True,
                      kdeval_repeat=scores)
        for idx, s in scores.by_layer.items():
            out[idx][..., piece.a : piece.e] = s
