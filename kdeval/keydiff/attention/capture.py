"""Attention rows for the policies that need them, computed beside SDPA (never eager attention): which rows a
policy asks for (:class:`AttentionNeed`), how they are computed and kept per layer (:class:`AttentionCapture`),
and the names of the engine's attention implementations.

The functions transformers calls under those names are registered in kdeval/keydiff/attention/functions.py
(``kdeval_sdpa``, ``kdeval_capture``, ``kdeval_ragged``), kdeval/keydiff/cache/static.py (``kdeval_static``) and
kdeval/keydiff/cache/headpool.py (``kdeval_pool``). This module imports torch only, not transformers: a policy's
declaration (``PolicyNeeds.attention``) is read where grids are validated, which need not load transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


SDPA_IMPL = "kdeval_sdpa"
CAPTURE_IMPL = "kdeval_capture"
STATIC_IMPL = "kdeval_static"
RAGGED_IMPL = "kdeval_ragged"
POOL_IMPL = "kdeval_pool"
HALF = (torch.float16, torch.bfloat16)  # the dtypes whose captured logits are computed in their own precision


def has_sinks(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention has learned sink logits (GPT-OSS's ``sinks``): a model transformers runs only
    in eager or flex attention, whose attention the engine's own functions compute exactly, sinks included."""
    return any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in model.modules())


@dataclass(frozen=True)
class AttentionNeed:
    """Which queries of each chunk to capture: ``last`` (1), ``window`` (last ``window``), ``all``."""

    kind: Literal["last", "window", "all"]
    window: int = 1

    def rows_label(self) -> str:
        """Which rows, in words: ``"the last query"``, ``"the last 32 queries"``, ``"every query of the chunk"``."""
        if self.kind == "last":
            return "the last query"
        if self.kind == "window":
            return f"the last {self.window} queries"
        return "every query of the chunk"

    def rows(self, chunk_len: int) -> int:
        if self.kind == "last":
            return 1
        if self.kind == "window":
            return min(self.window, chunk_len)
        return chunk_len


class AttentionCapture:
    """Collects, per layer, captured attention ``[batch, kv_heads, group, tokens]`` (summed over rows).

    Precision: for a half-precision model the logits ``q·k`` come from a half-precision product (float32
    accumulation, as in transformers' eager attention and kvpress) and the softmax runs in float32, so
    the keys are never copied to float32 and the product runs on tensor cores. ``float32_logits=True``
    computes the logits in float32 instead. Other models use their own precision, at least float32.
    """

    def __init__(self, need: AttentionNeed, float32_logits: bool = False):
        self.need = need
        self.float32_logits = float32_logits
        self.by_layer: dict[int, torch.Tensor] = {}

    def half_logits(self, query: torch.Tensor) -> bool:
        """Whether this query's logits are computed in its own half precision."""
        return query.dtype in HALF and not self.float32_logits

    def fuses_output(self, query: torch.Tensor) -> bool:
        """Whether :meth:`attend` computes the chunk's output from the captured probabilities: when every row
        is captured and its probabilities are float32 from float32 logits. With half-precision logits SDPA
        gives the output instead: its kernel keeps the logits in float32, and it costs one fused pass where
        the other way takes a product of the probabilities with the values."""
        return self.need.kind == "all" and query.shape[2] > 1 and not self.half_logits(query)

    def probabilities(self, query: torch.Tensor, key: torch.Tensor, scaling: float, w: int,
               mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax rows of the last ``w`` queries over all ``m`` keys: ``[b, kv_heads, group, w, m]``, at least
        float32 (half-precision models are scored in float32). ``mask [1 or b, 1, t, m]`` (True: visible)
        replaces the default "all keys, causal within the chunk" when given. ``sinks [q_heads]``: the model's
        learned sink logits (GPT-OSS), one more entry of each softmax row that no key holds: the rows then sum
        to less than one, as the model's own probabilities do."""
        b, hq, t, d = query.shape
        hk, m = key.shape[1], key.shape[2]
        if self.half_logits(query):
            q = query[:, :, t - w :, :].reshape(b * hk, hq // hk * w, d)
            k = key.reshape(b * hk, m, d)
            logits = torch.baddbmm(q.new_empty(b * hk, q.shape[1], m), q, k.transpose(1, 2), beta=0.0, alpha=scaling)
            logits = logits.view(b, hk, hq // hk, w, m)  # scaled in float32, rounded once to half precision
        else:
            dt = torch.promote_types(query.dtype, torch.float32)
            q = query[:, :, t - w :, :].reshape(b, hk, hq // hk, w, d).to(dt)
            logits = torch.matmul(q, key.to(dt).unsqueeze(2).transpose(-1, -2)) * scaling
        if mask is not None:
            rows = mask[:, :, t - w :, :].unsqueeze(2)  # [1, 1, 1, w, m]
            logits = logits.masked_fill(~rows, float("-inf"))
        elif w > 1:
            # Row r is the query at cache slot m - w + r; it sees keys up to and including that slot.
            row_slot = torch.arange(m - w, m, device=key.device).unsqueeze(-1)
            hidden = torch.arange(m, device=key.device).unsqueeze(0) > row_slot  # [w, m]
            logits = logits.masked_fill(hidden, float("-inf"))
        dtype = torch.promote_types(logits.dtype, torch.float32)
        if sinks is None:
            return torch.softmax(logits, dim=-1, dtype=dtype)
        sink = sinks.to(logits.dtype).view(1, hk, hq // hk, 1, 1).expand(*logits.shape[:-1], 1)
        return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1, dtype=dtype)[..., :-1]

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float,
               mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> None:
        """``query [b, q_heads, t, d]``, ``key [b, kv_heads, m, d]``: the chunk is the last ``t`` of ``m`` keys."""
        probs = self.probabilities(query, key, scaling, self.need.rows(query.shape[2]), mask, sinks)
        self.by_layer[layer_idx] = probs.sum(dim=3)

    def attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float, mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """For ``all`` rows: the chunk's attention output ``[b, t, q_heads, d]`` from the same probabilities the
        policy records, so the chunk's scores are not computed twice (once fused, once here)."""
        b, hq, t, d = query.shape
        probs = self.probabilities(query, key, scaling, t, mask, sinks)  # [b, hk, g, t, m]
        self.by_layer[layer_idx] = probs.sum(dim=3)
        out = torch.matmul(probs, value.to(probs.dtype).unsqueeze(2))  # [b, hk, g, t, d_v]
        return out.reshape(b, hq, t, -1).transpose(1, 2).contiguous().to(query.dtype)

    def clear(self) -> None:
        self.by_layer.clear()
