"""Attention rows for the policies that need them, computed beside SDPA (never eager attention).

The model runs under the attention implementation ``kdeval_capture`` only while a policy that needs attention
is being evaluated: it returns SDPA's output and, when a :class:`AttentionCapture` is passed through the
forward's keyword arguments (``kdeval_capture=``), also computes the softmax rows of just the queries asked for
(the chunk's last query, its last ``window`` queries, or all of its queries) against the whole cache, and stores
their sum over those queries per layer.

Both interfaces must be registered: without ``AttentionMaskInterface`` the mask would silently be ``None``.

``kdeval_sdpa`` is transformers' SDPA attention under an additive mask: the chunk's mask (all cached tokens,
causal within the chunk) is built once per forward as transformers builds it and turned into ``0``/``-inf`` of
the model's dtype there, instead of SDPA turning the boolean mask into that same float mask again in every
layer's call. The output is identical; on a CPU the conversion cost as much as the attention itself
(bench/RESULTS.md, "Attention mask"). ``kdeval_capture`` takes the same mask.

``kdeval_static`` serves the static slot layout and per-layer budgets (kdeval/keydiff/static.py, where it is
registered); ``kdeval_pool`` a head-shared pool (kdeval/keydiff/headpool.py).

``kdeval_ragged`` serves a batch of independent requests (kdeval/keydiff/ragged.py): the engine passes a
boolean mask ``[batch, 1, t, m]`` per row (padding and empty slots hidden), which both SDPA and the captured
rows use.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Literal

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


SDPA_IMPL = "kdeval_sdpa"
CAPTURE_IMPL = "kdeval_capture"
STATIC_IMPL = "kdeval_static"
RAGGED_IMPL = "kdeval_ragged"
POOL_IMPL = "kdeval_pool"
HALF = (torch.float16, torch.bfloat16)  # the dtypes whose captured logits are computed in their own precision


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
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax rows of the last ``w`` queries over all ``m`` keys: ``[b, kv_heads, group, w, m]``, at least
        float32 (half-precision models are scored in float32). ``mask [1 or b, 1, t, m]`` (True: visible)
        replaces the default "all keys, causal within the chunk" when given."""
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
        return torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float,
               mask: torch.Tensor | None = None) -> None:
        """``query [b, q_heads, t, d]``, ``key [b, kv_heads, m, d]``: the chunk is the last ``t`` of ``m`` keys."""
        probs = self.probabilities(query, key, scaling, self.need.rows(query.shape[2]), mask)
        self.by_layer[layer_idx] = probs.sum(dim=3)

    def attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        """For ``all`` rows: the chunk's attention output ``[b, t, q_heads, d]`` from the same probabilities the
        policy records, so the chunk's scores are not computed twice (once fused, once here)."""
        b, hq, t, d = query.shape
        probs = self.probabilities(query, key, scaling, t, mask)  # [b, hk, g, t, m]
        self.by_layer[layer_idx] = probs.sum(dim=3)
        out = torch.matmul(probs, value.to(probs.dtype).unsqueeze(2))  # [b, hk, g, t, d_v]
        return out.reshape(b, hq, t, -1).transpose(1, 2).contiguous().to(query.dtype)

    def clear(self) -> None:
        self.by_layer.clear()


def capture_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA's output, plus the rows the ``kdeval_capture`` keyword asks for.

    When every row of a chunk is needed (H2O), the output is computed from those rows' probabilities instead
    of running SDPA as well: the chunk's score matrix is then computed once, not twice. A single query (a
    decode step) takes SDPA plus the one recorded row, which is cheaper than a probabilities-times-values
    product.
    """
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if capture is not None and capture.fuses_output(query) and dropout == 0.0:
        return capture.attend(module.layer_idx, query, key, value, scale), None
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale)
    return out


def ragged_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A ragged batch: SDPA under the engine's mask ``[b, 1, t, m]`` (``query [b, hq, t, d]``, ``key``/``value
    [b, hk, m, d]``), and the rows a ``kdeval_capture`` asks for under the same mask; returns ``[b, t, hq, d]``.

    SDPA takes the grouped KV heads as they are (``enable_gqa``): transformers' SDPA path would repeat the
    keys and values per query head whenever a mask is passed. ``kdeval_layer_masks`` (one mask per layer, when
    the layers keep budgets of their own and so hold different numbers of slots) replaces the mask."""
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    layer_masks = kwargs.pop("kdeval_layer_masks", None)
    if layer_masks is not None:
        attention_mask = layer_masks[module.layer_idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if capture is not None and capture.fuses_output(query):
        return capture.attend(module.layer_idx, query, key, value, scale, attention_mask), None
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scale,
                                                           enable_gqa=key.shape[1] != query.shape[1])
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale, attention_mask)
    return out.transpose(1, 2).contiguous(), None


def additive_mask(*args, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor | None:
    """transformers' SDPA mask (boolean ``[b, 1, t, m]``, True: visible; ``None`` where SDPA's causal path needs
    none) as the additive mask SDPA would make of it: ``0`` where visible, ``-inf`` elsewhere, in ``dtype`` (the
    model's, which transformers passes to every mask function)."""
    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros((), dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def no_mask(*args, **kwargs) -> None:
    """The mask function of an attention implementation whose mask the engine passes itself (the static layout,
    a ragged batch) or its attention function builds (a head-shared pool)."""
    return None


AttentionInterface.register(SDPA_IMPL, sdpa_attention_forward)
AttentionMaskInterface.register(SDPA_IMPL, additive_mask)
AttentionInterface.register(CAPTURE_IMPL, capture_attention_forward)
AttentionMaskInterface.register(CAPTURE_IMPL, additive_mask)
AttentionInterface.register(RAGGED_IMPL, ragged_attention_forward)
AttentionMaskInterface.register(RAGGED_IMPL, no_mask)


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, impl: str | None) -> Iterator[None]:
    """Temporarily run ``model`` under attention implementation ``impl`` (no-op for ``None``)."""
    if impl is None:
        yield
        return
    config = model.config
    before = config._attn_implementation
    if before not in ("sdpa", SDPA_IMPL, CAPTURE_IMPL, STATIC_IMPL, RAGGED_IMPL):
        raise ValueError(
            f"attn_implementation: the engine's own attention functions run on SDPA; the model uses {before!r}"
        )
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = before
