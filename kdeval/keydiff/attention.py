"""Attention rows for the policies that need them, computed beside SDPA (never eager attention).

The model runs under the attention implementation ``kdeval_capture`` only while a policy that needs attention
is being evaluated: it returns SDPA's output and, when a :class:`AttentionCapture` is passed through the
forward's keyword arguments (``kdeval_capture=``), also computes the softmax rows of just the queries asked for
(the chunk's last query, its last ``window`` queries, or all of its queries) against the whole cache, and stores
their sum over those queries per layer.

Both interfaces must be registered: without ``AttentionMaskInterface`` the mask would silently be ``None``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Literal

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

CAPTURE_IMPL = "kdeval_capture"


@dataclass(frozen=True)
class AttentionNeed:
    """Which queries of each chunk to capture: ``last`` (1), ``window`` (last ``window``), ``all``."""

    kind: Literal["last", "window", "all"]
    window: int = 1

    def rows(self, chunk_len: int) -> int:
        if self.kind == "last":
            return 1
        if self.kind == "window":
            return min(self.window, chunk_len)
        return chunk_len


class AttentionCapture:
    """Collects, per layer, captured attention ``[batch, kv_heads, group, tokens]`` (summed over rows)."""

    def __init__(self, need: AttentionNeed):
        self.need = need
        self.by_layer: dict[int, torch.Tensor] = {}

    def _probs(self, query: torch.Tensor, key: torch.Tensor, scaling: float, w: int) -> torch.Tensor:
        """Softmax rows of the last ``w`` queries over all ``m`` keys: ``[b, kv_heads, group, w, m]``, at least
        float32 (half-precision models are scored in float32)."""
        b, hq, t, d = query.shape
        hk, m = key.shape[1], key.shape[2]
        dt = torch.promote_types(query.dtype, torch.float32)
        q = query[:, :, t - w :, :].reshape(b, hk, hq // hk, w, d).to(dt)
        logits = torch.matmul(q, key.to(dt).unsqueeze(2).transpose(-1, -2)) * scaling
        if w > 1:
            # Row r is the query at cache slot m - w + r; it sees keys up to and including that slot.
            row_slot = torch.arange(m - w, m, device=key.device).unsqueeze(-1)
            hidden = torch.arange(m, device=key.device).unsqueeze(0) > row_slot  # [w, m]
            logits = logits.masked_fill(hidden, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def record(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        """``query [b, q_heads, t, d]``, ``key [b, kv_heads, m, d]``: the chunk is the last ``t`` of ``m`` keys."""
        probs = self._probs(query, key, scaling, self.need.rows(query.shape[2]))
        self.by_layer[layer_idx] = probs.sum(dim=3)

    def attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float) -> torch.Tensor:
        """For ``all`` rows: the chunk's attention output ``[b, t, q_heads, d]`` from the same probabilities the
        policy records, so the chunk's scores are not computed twice (once fused, once here)."""
        b, hq, t, d = query.shape
        hk = key.shape[1]
        probs = self._probs(query, key, scaling, t)  # [b, hk, g, t, m]
        self.by_layer[layer_idx] = probs.sum(dim=3)
        out = torch.matmul(probs, value.to(probs.dtype).unsqueeze(2))  # [b, hk, g, t, d_v]
        return out.reshape(b, hq, t, -1).transpose(1, 2).contiguous().to(query.dtype)

    def clear(self) -> None:
        self.by_layer.clear()


def capture_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA's output, plus the rows the ``kdeval_capture`` keyword asks for.

    When every row of the chunk is needed (H2O), the output is computed from those rows' probabilities
    instead of running SDPA as well: the chunk's score matrix is then computed once, not twice.
    """
    capture: AttentionCapture | None = kwargs.pop("kdeval_capture", None)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if capture is not None and capture.need.kind == "all" and dropout == 0.0:
        return capture.attend(module.layer_idx, query, key, value, scale), None
    out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if capture is not None:
        capture.record(module.layer_idx, query, key, scale)
    return out


AttentionInterface.register(CAPTURE_IMPL, capture_attention_forward)
AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, impl: str | None) -> Iterator[None]:
    """Temporarily run ``model`` under attention implementation ``impl`` (no-op for ``None``)."""
    if impl is None:
        yield
        return
    config = model.config
    before = config._attn_implementation
    if before not in ("sdpa", CAPTURE_IMPL):
        raise ValueError(
            f"attn_implementation: policies that need attention weights run beside SDPA; the model uses {before!r}"
        )
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = before
