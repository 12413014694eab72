"""Split-KV attention for a chunk over a full static cache: the ``N`` head slots cut into ``S`` equal splits that
are attended to in one batched kernel call, the chunk's own ``t`` tail slots causally in another, and the
``S + 1`` partial outputs merged by their log-sum-exps.

Why: a chunk of ``t`` queries over ``N + t`` keys gives a fused attention kernel only ``heads x ceil(t / 128)``
blocks of work (24 at the 3B shape with t = 128), a fraction of a large GPU's SMs. Cutting the keys into ``S``
splits multiplies the blocks by ``S``. The head needs no mask (every query sees every head slot), and the tail
is plainly causal (``t`` queries over their own ``t`` keys), so both calls take the unmasked kernels.

The splits are strided views of the cache buffer, not copies: for batch 1, split ``s`` of KV head ``j`` starts
at slot ``s * N / S`` of row ``j``, which one ``as_strided`` expresses with the splits as the batch axis. The
query heads of a KV head are folded into the query axis (``[S, hk, g * t, d]``) for the head part; the tail
part repeats its ``t`` keys per query head instead (folded rows would break causality).
"""
from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)  # the dtypes computed in their own precision (attention.py too)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):
    """(output ``[B, h, m, d]``, natural log-sum-exp of the scaled logits ``[B, h, m]`` float32+)."""
    if q.device.type != "cuda":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    if q.dtype in HALF:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return out[0], out[1]
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]
    return out, lse[..., : q.shape[2]]  # the efficient kernel pads the query axis of its log-sum-exp


def split_kv_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float,
                       splits: int) -> torch.Tensor | None:
    """``query [1, hq, t, d]`` over ``key``/``value [1, hk, N + t, d]`` (all ``N`` head slots visible, the
    tail causal) → ``[1, t, hq, d]``; ``None`` where it does not apply (batch > 1, ``N`` not a multiple of
    ``splits``, or buffers whose last axis is not contiguous): the caller then runs plain SDPA."""
    b, hq, t, d = query.shape
    hk, m = key.shape[1], key.shape[2]
    n = m - t
    if b != 1 or splits < 1 or n <= 0 or n % splits or key.stride(-1) != 1 or value.stride(-1) != 1:
        return None
    g, part = hq // hk, n // splits

    def head_splits(x: torch.Tensor) -> torch.Tensor:  # [splits, hk, part, d], a view of x's head slots
        return x.as_strided((splits, hk, part, x.shape[3]), (part * x.stride(2), x.stride(1), x.stride(2), 1),
                            x.storage_offset())

    q_head = query.reshape(1, hk, g * t, d).expand(splits, hk, g * t, d).contiguous()
    out_head, lse_head = _attend(q_head, head_splits(key), head_splits(value), scale, False)
    k_tail = key[:, :, n:].repeat_interleave(g, dim=1)
    v_tail = value[:, :, n:].repeat_interleave(g, dim=1)
    out_tail, lse_tail = _attend(query, k_tail, v_tail, scale, True)  # [1, hq, t, dv], [1, hq, t]
    acc = torch.promote_types(query.dtype, torch.float32)  # the merge runs in float32 at least
    lse = torch.cat([lse_head, lse_tail.reshape(1, hk, g * t)]).to(acc)  # [splits + 1, hk, g * t]
    outs = torch.cat([out_head, out_tail.reshape(1, hk, g * t, -1)]).to(acc)
    weights = torch.softmax(lse, dim=0).unsqueeze(-1)  # each part's share of the full softmax's mass
    out = (weights * outs).sum(dim=0).to(query.dtype)  # [hk, g * t, dv]
    return out.view(1, hq, t, -1).transpose(1, 2).contiguous()
